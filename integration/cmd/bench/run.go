package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/enforcerd/enforcerd/nsmgr"
	"github.com/vishvananda/netns"
)

// run runs a command to completion (killed by its PID when timeout passes or
// ctx ends) and returns its combined output.
func run(ctx context.Context, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, lastLines(out.String(), 5))
	}
	return out.String(), nil
}

// inNS prefixes a command with nsenter into the network namespace at path
// (only the network namespace: the netns bind mounts stay visible).
func inNS(path string, args ...string) []string {
	return append([]string{"nsenter", "--net=" + path}, args...)
}

// forkIn runs cmd to completion from a thread inside ns, so the child starts
// in ns (as under `nsenter --net`, without an extra exec charged to the
// command), and returns how long it took from fork to exit.
func forkIn(ns netns.NsHandle, cmd *exec.Cmd) (time.Duration, error) {
	var took time.Duration
	err := nsmgr.Do(ns, func() error {
		start := time.Now()
		err := cmd.Run()
		took = time.Since(start)
		return err
	})
	return took, err
}

// proc is a long-running process this program started. It is only ever
// signalled by its own PID.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan error
	log  string
}

// startProc starts args in the background, its output going to logPath.
func startProc(name, logPath string, args ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan error, 1), log: logPath}
	go func() { p.done <- cmd.Wait(); f.Close() }()
	return p, nil
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case err := <-p.done:
		p.done <- err
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process's PID, then SIGKILL after grace, and
// waits for it.
func (p *proc) stop(grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
		return
	case <-time.After(grace):
	}
	p.cmd.Process.Kill()
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(5 * time.Second):
	}
}

// tail returns the last lines of the process's log.
func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	return lastLines(string(b), n)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitFor polls cond every 20 ms until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// removeNetnsFile unmounts and removes a named netns this program made
// (by exact name); not-found is success.
func removeNetnsFile(path string) error {
	for i := 0; i < 4; i++ {
		if err := syscall.Unmount(path, syscall.MNT_DETACH); err != nil {
			break
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
