package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"golang.org/x/sys/unix"
)

// drainGrace bounds how long Exec keeps copying output after the command exited: a background
// child that inherited stdout would otherwise hold Exec forever. After it the pipes are closed
// (a writer left behind gets EPIPE).
const drainGrace = 500 * time.Millisecond

// Exec runs a command in sandbox name and returns its exit code: the status it exited with, or
// 128+N when signal N killed it. Several Execs may run at once in one sandbox.
//
// Every exec'd process leads its own session and process group (nsexec calls setsid), so on
// Timeout or ctx cancellation Exec kills that whole group with SIGKILL, waits for the leader and
// returns ErrTimeout (or ctx's error). Processes that left the group (setsid, setpgid) are not
// followed; they die with the sandbox. The exit code is -1 whenever err is not nil.
func (m *Manager) Exec(ctx context.Context, name string, p ExecSpec) (exitCode int, err error) {
	if len(p.Args) == 0 || p.Args[0] == "" {
		return -1, errors.New("exec: no command; give at least the program to run")
	}
	uid, gid, err := parseUser(p.User)
	if err != nil {
		return -1, err
	}
	env, err := execEnv(p.Env, uid)
	if err != nil {
		return -1, err
	}
	dir := p.Dir
	if dir == "" {
		dir = "/"
	}
	if err := ctx.Err(); err != nil {
		return -1, err
	}
	box, err := m.get(name)
	if err != nil {
		return -1, err
	}

	xio, err := newExecIO(p)
	if err != nil {
		return -1, fmt.Errorf("exec in %s: %w", name, err)
	}
	defer xio.closeAll()
	proc := &libcontainer.Process{Args: p.Args, Env: env, UID: uid, GID: gid, Cwd: dir}
	// Only non-nil files: a nil *os.File in an io.Reader is not a nil interface.
	if xio.childStdin != nil {
		proc.Stdin = xio.childStdin
	}
	if xio.childStdout != nil {
		proc.Stdout = xio.childStdout
	}
	if xio.childStderr != nil {
		proc.Stderr = xio.childStderr
	}
	if err := box.c.Run(proc); err != nil {
		return -1, fmt.Errorf("exec %q in %s: %w", p.Args[0], name, err)
	}
	xio.started()
	pid, err := proc.Pid()
	if err != nil {
		return -1, fmt.Errorf("exec %q in %s: %w", p.Args[0], name, err)
	}

	waited := make(chan *os.ProcessState, 1)
	go func() {
		st, _ := proc.Wait() // reaps the process: it is the daemon's child (CLONE_PARENT)
		waited <- st
	}()
	var timeout <-chan time.Time
	if p.Timeout > 0 {
		t := time.NewTimer(p.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var st *os.ProcessState
	var stopErr error
	select {
	case st = <-waited:
	case <-timeout:
		stopErr = fmt.Errorf("exec %q in %s after %s: %w", p.Args[0], name, p.Timeout, ErrTimeout)
	case <-ctx.Done():
		stopErr = fmt.Errorf("exec %q in %s: %w", p.Args[0], name, ctx.Err())
	}
	if stopErr != nil {
		// The leader is not reaped yet (only the goroutine above reaps it), so its pid still
		// names its process group.
		_ = unix.Kill(-pid, unix.SIGKILL)
		<-waited
		xio.drain(drainGrace)
		return -1, stopErr
	}
	xio.drain(drainGrace)
	return exitStatus(st), nil
}

// exitStatus is the shell's convention: the exit status, or 128+signal.
func exitStatus(st *os.ProcessState) int {
	if st == nil {
		return -1
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

// execIO owns the pipes between the daemon and one exec'd process. The child gets the pipe
// ends as plain files (so libcontainer's exec.Cmd starts no copy goroutine of its own and its
// Wait returns as soon as the process exits); our goroutines copy to the caller's writers.
type execIO struct {
	childStdin, childStdout, childStderr *os.File    // the child's ends; nil: /dev/null
	readers                              []*os.File  // the daemon's ends of stdout/stderr
	writers                              []io.Writer // where each reader is copied to
	stdinW                               *os.File
	copies                               sync.WaitGroup
	closeOnce                            sync.Once
	p                                    ExecSpec
}

func newExecIO(p ExecSpec) (x *execIO, err error) {
	x = &execIO{p: p}
	defer func() {
		if err != nil {
			x.closeAll()
		}
	}()
	if p.Stdin != nil {
		if x.childStdin, x.stdinW, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("stdin pipe: %w", err)
		}
	}
	if p.Stdout != nil {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("stdout pipe: %w", err)
		}
		x.childStdout = w
		x.readers, x.writers = append(x.readers, r), append(x.writers, p.Stdout)
	}
	switch {
	case p.Stderr == nil:
	case p.Stderr == p.Stdout:
		x.childStderr = x.childStdout // one stream, one pipe: no concurrent writes to the writer
	default:
		r, w, err := os.Pipe()
		if err != nil {
			return nil, fmt.Errorf("stderr pipe: %w", err)
		}
		x.childStderr = w
		x.readers, x.writers = append(x.readers, r), append(x.writers, p.Stderr)
	}
	return x, nil
}

// started closes the daemon's copies of the child's ends and starts the copies.
func (x *execIO) started() {
	for _, f := range []*os.File{x.childStdin, x.childStdout, x.childStderr} {
		if f != nil {
			_ = f.Close()
		}
	}
	if x.stdinW != nil {
		go func() {
			_, _ = io.Copy(x.stdinW, x.p.Stdin)
			_ = x.stdinW.Close()
		}()
	}
	for i, r := range x.readers {
		w := x.writers[i]
		x.copies.Add(1)
		go func() {
			defer x.copies.Done()
			_, _ = io.Copy(w, r)
		}()
	}
}

// drain waits for the output copies to reach EOF, at most grace.
func (x *execIO) drain(grace time.Duration) {
	done := make(chan struct{})
	go func() { x.copies.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		x.closeAll()
		<-done
	}
}

// closeAll closes every pipe end the daemon still holds (idempotent).
func (x *execIO) closeAll() {
	x.closeOnce.Do(func() {
		for _, f := range append([]*os.File{x.childStdin, x.childStdout, x.childStderr, x.stdinW}, x.readers...) {
			if f != nil {
				_ = f.Close()
			}
		}
	})
}
