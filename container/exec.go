package container

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
// 128+N when signal N killed it. Several Execs may run at once in one sandbox. A command that
// never started is a *StartError (not found, cannot be run, the pids limit).
//
// Every exec'd process leads its own session and process group (nsexec calls setsid), so on
// Timeout or ctx cancellation Exec kills that whole group with SIGKILL, waits for the leader and
// returns ErrTimeout (or ctx's error). Processes that left the group (setsid, setpgid) are not
// followed; they die with the sandbox. The exit code is -1 whenever err is not nil, but for an
// *OOMError: the command was killed for want of memory, and its status (137) comes with it; and
// for a *PidsLimitError: the command failed while the sandbox refused forks, with its status.
func (m *Manager) Exec(ctx context.Context, name string, p ExecSpec) (exitCode int, err error) {
	if len(p.Args) == 0 || p.Args[0] == "" {
		return -1, errors.New("exec: no command; want at least the program to run")
	}
	uid, gid, err := parseUser(p.User)
	if err != nil {
		return -1, err
	}
	if err := ctx.Err(); err != nil {
		return -1, err
	}
	box, err := m.get(name)
	if err != nil {
		return -1, err
	}
	readOnlyRoot := box.c.Config().Readonlyfs
	// Root's home is writable on a read-only root when the image has one (mountRootHome).
	_, homeErr := os.Stat(box.l.home)
	env, err := execEnv(p.Env, uid, readOnlyRoot && homeErr != nil)
	if err != nil {
		return -1, err
	}
	dir := p.Dir
	if dir == "" {
		dir = "/"
		if readOnlyRoot {
			dir = "/tmp"
		}
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
	pidsBefore := m.pidsRefused(box)
	memDir := m.memoryDir(box)
	oomBefore := oomKills(memDir)
	if err := box.c.Run(proc); err != nil {
		if serr := m.startError(box, p.Args[0], pidsBefore, err); serr != nil {
			return -1, serr
		}
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
	code := exitStatus(st)
	if code == 128+int(unix.SIGKILL) && oomBefore >= 0 && oomKills(memDir) > oomBefore {
		return code, &OOMError{Command: p.Args[0], Sandbox: name, Limit: memoryLimit(memDir)}
	}
	if code != 0 && pidsBefore >= 0 && m.pidsRefused(box) > pidsBefore {
		pe := &PidsLimitError{Command: p.Args[0], Sandbox: name}
		pe.Max, _ = m.pidsMax(box)
		return code, pe
	}
	return code, nil
}

// PidsLimitError is the error of an Exec whose command ran but failed while
// the sandbox was at its --pids limit (the cgroup refused forks during the
// run): Exec returns it with the command's own status, so the caller can say
// why a fork failed ("can't fork: Resource temporarily unavailable").
type PidsLimitError struct {
	Command string
	Sandbox string
	Max     int64 // the limit, 0 when unknown
}

func (e *PidsLimitError) Error() string {
	if e.Max > 0 {
		return fmt.Sprintf("exec %q in %s: pids limit reached (%d processes): a fork failed while it ran", e.Command, e.Sandbox, e.Max)
	}
	return fmt.Sprintf("exec %q in %s: pids limit reached: a fork failed while it ran", e.Command, e.Sandbox)
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

// Exit statuses of a command that never started, as container runtimes give them (docker and
// podman: 127 "command cannot be found", 126 "command cannot be invoked").
const (
	ExitNotFound  = 127
	ExitCannotRun = 126
)

// StartError is the error of an Exec whose command never started. Code is the exit status to
// report (ExitNotFound or ExitCannotRun); Reason says why in a few words ("command not found",
// "command cannot be run", "pids limit reached (8 of 8 processes)"); Err is libcontainer's.
type StartError struct {
	Code    int
	Command string // Args[0]
	Sandbox string
	Reason  string
	Detail  string // the system's own words, e.g. "executable file not found in $PATH"
	Err     error
}

func (e *StartError) Error() string {
	msg := fmt.Sprintf("exec %q in %s: %s", e.Command, e.Sandbox, e.Reason)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

func (e *StartError) Unwrap() error { return e.Err }

// startError tells why box's Run of command failed, or returns nil when it cannot tell (the
// caller reports libcontainer's error as it is).
//
// libcontainer's init looks the command up (exec.LookPath, in the sandbox, with its PATH) before
// it execs it and sends the failure back as text only (an unexported initError): the text
// `exec: "<command>": <reason>` is that lookup's *exec.Error, which classifyLookup reads.
//
// A full pids cgroup shows no such text: the init is moved into the cgroup, over its limit
// (moving a task never fails on pids.max), and dies when it cannot make a thread (libcontainer
// says only "procReady not received"). So the cgroup's own count of refused forks
// (pids.events "max") is read before and after: when it grew while a Run failed, the limit is
// why. Another exec in the same sandbox hitting the limit at the same moment is
// indistinguishable (the sandbox is at its limit either way).
func (m *Manager) startError(box *sandbox, command string, pidsBefore int64, err error) error {
	se := &StartError{Command: command, Sandbox: box.name, Err: err}
	if code, detail, ok := classifyLookup(command, err.Error()); ok {
		se.Code, se.Detail = code, detail
		se.Reason = "command not found"
		if code == ExitCannotRun {
			se.Reason = "command cannot be run"
		}
		return se
	}
	if dir, detail, ok := classifyChdir(err.Error()); ok {
		se.Code, se.Reason, se.Detail = ExitCannotRun, fmt.Sprintf("working directory %q cannot be entered", dir), detail
		return se
	}
	if after := m.pidsRefused(box); pidsBefore >= 0 && after > pidsBefore {
		se.Code, se.Reason, se.Detail = ExitCannotRun, "pids limit reached", err.Error()
		if max, ok := m.pidsMax(box); ok {
			se.Reason = fmt.Sprintf("pids limit reached (%d processes)", max)
		}
		return se
	}
	return nil
}

// classifyChdir finds libcontainer's failure to enter the working
// directory (`chdir to cwd ("DIR") set in config.json failed: REASON`): the
// caller named a directory the sandbox does not have, a mistake of the
// request, not a failure of enforcerd.
func classifyChdir(msg string) (dir, detail string, ok bool) {
	const marker = "chdir to cwd ("
	i := strings.LastIndex(msg, marker)
	if i < 0 {
		return "", "", false
	}
	rest := msg[i+len(marker):]
	end := strings.Index(rest, ") set in config.json failed: ")
	if end < 0 {
		return "", "", false
	}
	dir, err := strconv.Unquote(rest[:end])
	if err != nil {
		dir = rest[:end]
	}
	return dir, rest[end+len(") set in config.json failed: "):], true
}

// classifyLookup finds the lookup failure of command in libcontainer's error text and returns
// its exit status and the system's words: not found (no such file, not in $PATH, a path
// component not a directory, a symlink loop, a name too long) is ExitNotFound; anything else
// the lookup refused (permission denied, a directory) is ExitCannotRun.
func classifyLookup(command, msg string) (code int, detail string, ok bool) {
	marker := "exec: " + strconv.Quote(command) + ": "
	i := strings.LastIndex(msg, marker)
	if i < 0 {
		return 0, "", false
	}
	detail = msg[i+len(marker):]
	for _, nf := range []string{
		exec.ErrNotFound.Error(), "no such file or directory", "not a directory",
		"too many levels of symbolic links", "file name too long",
	} {
		if strings.HasSuffix(detail, nf) {
			return ExitNotFound, detail, true
		}
	}
	return ExitCannotRun, detail, true
}

// pidsRefused is the sandbox's count of forks its pids limit refused (pids.events "max"), or
// -1 when it cannot be read.
func (m *Manager) pidsRefused(box *sandbox) int64 {
	dir := m.pidsDir(box)
	if dir == "" {
		return -1
	}
	b, err := os.ReadFile(filepath.Join(dir, "pids.events"))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "max "); ok {
			if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}

// pidsMax is the sandbox's pids limit as the cgroup holds it.
func (m *Manager) pidsMax(box *sandbox) (int64, bool) {
	dir := m.pidsDir(box)
	if dir == "" {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(dir, "pids.max"))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// pidsDir is the directory of the sandbox's pids cgroup: the "pids" controller's (cgroup v1)
// or the unified one (v2); "" when unknown. Computed once per sandbox.
func (m *Manager) pidsDir(box *sandbox) string {
	box.pidsOnce.Do(func() {
		paths := m.cgroupPaths(box.l.id)
		box.pidsDir = paths["pids"]
		if box.pidsDir == "" {
			box.pidsDir = paths[""]
		}
	})
	return box.pidsDir
}
