package container

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A held exec is a command run by a holder process of its own rather than by the daemon, so
// that it outlives the daemon, as a container runtime's shim does (containerd's runc shim
// keeps the process, owns its stdio and reports its exit while containerd restarts).
//
// The holder is this binary re-executed (/proc/self/exe) with the command line
// "enforcerd exec-holder SESSION ID" (HolderArg; what ps and systemctl status show) and DIR in
// its environment (HolderDirEnv), in a session and process group of its own (setsid), with /dev/null as its stdio: a daemon that
// stops (systemd's KillMode=process signals only the main process) or is killed takes
// nothing of it along. The holder runs the command through Manager.Exec, so the command is its
// child (libcontainer's CLONE_PARENT makes it the caller's), and it owns the pipes.
//
// DIR holds, all written by the daemon (spec, pid) or the holder (output, status):
//
//	spec.json   the Config and HeldSpec the holder runs
//	holder.pid  the holder's pid, written by the daemon right after starting it
//	output      the command's output as records: 1 byte stream (1 stdout, 2 stderr), 4 bytes
//	            big-endian length, the bytes; a record's end offset names the position after it
//	status.json the HeldStatus, written (renamed into place) after output is complete
//
// The output is bounded by MaxHeldOutput: beyond it the holder keeps reading the pipes (the
// command never blocks on a full pipe) but discards the bytes, after one stderr record saying
// so. Stdin is given once, at start.

// ErrInvalidExec: StartHeld refused the spec itself (no command, a bad user).
var ErrInvalidExec = errors.New("invalid exec")

// invalidExec keeps err's text and makes errors.Is find ErrInvalidExec.
type invalidExec struct{ err error }

func (e invalidExec) Error() string        { return e.err.Error() }
func (e invalidExec) Is(target error) bool { return target == ErrInvalidExec }
func (e invalidExec) Unwrap() error        { return e.err }

// HolderArg is the hidden subcommand that runs a holder (see RunHolderCommand).
const HolderArg = "exec-holder"

// HolderDirEnv carries a holder's DIR (<exec root>/SESSION/ID): its command line shows only
// SESSION and ID.
const HolderDirEnv = "ENFORCERD_EXEC_DIR"

// holderComm is a holder's comm (ps -e, top), instead of "exe".
const holderComm = "enforcerd-exec"

// MaxHeldOutput bounds the output file of one held exec.
const MaxHeldOutput = 64 << 20

// Stream numbers of an output record.
const (
	StreamStdout = 1
	StreamStderr = 2
)

const recordHeader = 5

// HeldSpec is what a holder runs.
type HeldSpec struct {
	Session string        `json:"session"`
	Args    []string      `json:"args"`
	Env     []string      `json:"env,omitempty"`
	Dir     string        `json:"dir,omitempty"`
	User    string        `json:"user,omitempty"`
	Stdin   []byte        `json:"stdin,omitempty"`
	Timeout time.Duration `json:"timeout,omitempty"`
}

// How a held exec ended (HeldStatus.Reason).
const (
	HeldExited     = "exited"      // the command exited (or a signal killed it): Exit is its status
	HeldTimeout    = "timeout"     // it ran past its Timeout; its process group was killed
	HeldNotStarted = "not_started" // it never started: Exit is ExitNotFound or ExitCannotRun
	HeldOOM        = "oom"         // the kernel killed it at the sandbox's memory limit
	HeldPidsLimit  = "pids_limit"  // it failed while the sandbox was at its pids limit: Exit is its status
	HeldKilled     = "killed"      // the holder was told to stop it (SIGTERM), or it was lost
	HeldFailed     = "failed"      // the holder could not run it
)

// HeldStatus is how a held exec ended.
type HeldStatus struct {
	Exit   int       `json:"exit"`
	Reason string    `json:"reason"`
	Error  string    `json:"error,omitempty"`
	Ended  time.Time `json:"ended"`
}

type holderFile struct {
	Config Config   `json:"config"`
	Spec   HeldSpec `json:"spec"`
}

// Paths inside a held exec's directory.
const (
	heldSpecFile   = "spec.json"
	heldPidFile    = "holder.pid"
	HeldOutputFile = "output"
	heldStatusFile = "status.json"
)

// StartHeld starts a holder for spec in dir (made here, mode 0700; it must not exist) and
// returns the holder's process, which the caller waits on while it is its child.
func (m *Manager) StartHeld(dir string, spec HeldSpec) (*os.Process, error) {
	if len(spec.Args) == 0 || spec.Args[0] == "" {
		return nil, invalidExec{errors.New("exec: no command; want at least the program to run")}
	}
	if _, _, err := parseUser(spec.User); err != nil {
		return nil, invalidExec{err}
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, fmt.Errorf("exec dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("exec dir: %w", err)
	}
	data, err := json.Marshal(holderFile{Config: m.cfg, Spec: spec})
	if err != nil {
		return nil, fmt.Errorf("exec spec: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, heldSpecFile), data, 0o600); err != nil {
		return nil, fmt.Errorf("exec spec: %w", err)
	}
	out, err := os.OpenFile(filepath.Join(dir, HeldOutputFile), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("exec output: %w", err)
	}
	_ = out.Close()
	// /proc/self/exe: the binary this daemon runs, even when an upgrade replaced the file.
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = holderArgs(dir)
	cmd.Env = append(os.Environ(), HolderDirEnv+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start exec holder: %w", err)
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	if err := writeFileAtomic(filepath.Join(dir, heldPidFile), []byte(pid+"\n")); err != nil {
		_ = cmd.Process.Kill()
		_, _ = cmd.Process.Wait()
		return nil, fmt.Errorf("exec holder pid: %w", err)
	}
	return cmd.Process, nil
}

// ReadHeldStatus is the held exec's status; ok is false while it has none (it runs, or its
// holder died before writing one: see HolderAlive).
func ReadHeldStatus(dir string) (st HeldStatus, ok bool, err error) {
	data, err := os.ReadFile(filepath.Join(dir, heldStatusFile))
	if errors.Is(err, os.ErrNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, err
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, false, fmt.Errorf("exec status %s: %w", dir, err)
	}
	return st, true, nil
}

// ReadHeldSpec is the spec a holder was started with.
func ReadHeldSpec(dir string) (HeldSpec, time.Time, error) {
	p := filepath.Join(dir, heldSpecFile)
	data, err := os.ReadFile(p)
	if err != nil {
		return HeldSpec{}, time.Time{}, err
	}
	var hf holderFile
	if err := json.Unmarshal(data, &hf); err != nil {
		return HeldSpec{}, time.Time{}, fmt.Errorf("exec spec %s: %w", p, err)
	}
	var started time.Time
	if fi, err := os.Stat(p); err == nil {
		started = fi.ModTime()
	}
	return hf.Spec, started, nil
}

// holderArgs is the command line of dir's holder: "enforcerd exec-holder SESSION ID", the
// last two elements of dir.
func holderArgs(dir string) []string {
	return []string{"enforcerd", HolderArg, filepath.Base(filepath.Dir(dir)), filepath.Base(dir)}
}

// HolderPid is the pid of dir's holder while it runs, else 0. A pid is taken as the holder's
// only when its command line is holderArgs(dir) and its environment names dir, or (a holder
// started before an upgrade to this version) its command line is "… exec-holder DIR": a reused
// pid is not.
func HolderPid(dir string) int {
	data, err := os.ReadFile(filepath.Join(dir, heldPidFile))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return 0
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) == 3 && args[1] == HolderArg && args[2] == dir {
		return pid // started by a version that named DIR on the command line
	}
	if !slices.Equal(args, holderArgs(dir)) {
		return 0 // gone, a zombie (empty cmdline) or another process
	}
	environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil || !slices.Contains(strings.Split(string(environ), "\x00"), HolderDirEnv+"="+dir) {
		return 0
	}
	return pid
}

// StopHolder stops dir's holder: SIGTERM (the holder kills the command's process group and
// writes its status), then SIGKILL after grace. It returns once no holder runs.
func StopHolder(dir string, grace time.Duration) {
	pid := HolderPid(dir)
	if pid == 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for HolderPid(dir) != 0 {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			for i := 0; i < 100 && HolderPid(dir) != 0; i++ {
				time.Sleep(20 * time.Millisecond)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// HeldRecord is one output record; End is the offset right after it.
type HeldRecord struct {
	Stream int
	Data   []byte
	End    int64
}

// ReadHeldRecords reads the whole records of r from off on, up to about max bytes of data
// (at least one record), and returns them and the offset after the last. A record still being
// written is left for the next read.
func ReadHeldRecords(r io.ReaderAt, off int64, max int) ([]HeldRecord, int64, error) {
	var recs []HeldRecord
	total := 0
	var hdr [recordHeader]byte
	for total < max || len(recs) == 0 {
		if _, err := r.ReadAt(hdr[:], off); err != nil {
			if errors.Is(err, io.EOF) {
				return recs, off, nil
			}
			return recs, off, err
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if (hdr[0] != StreamStdout && hdr[0] != StreamStderr) || n > MaxHeldOutput {
			return recs, off, fmt.Errorf("exec output: bad record at offset %d", off)
		}
		data := make([]byte, n)
		if _, err := r.ReadAt(data, off+recordHeader); err != nil {
			if errors.Is(err, io.EOF) {
				return recs, off, nil
			}
			return recs, off, err
		}
		off += recordHeader + int64(n)
		recs = append(recs, HeldRecord{Stream: int(hdr[0]), Data: data, End: off})
		total += int(n)
	}
	return recs, off, nil
}

// HeldBoundary reports whether off is where a record of r starts (or the end of the last).
func HeldBoundary(r io.ReaderAt, off int64) (bool, error) {
	var pos int64
	var hdr [recordHeader]byte
	for pos < off {
		if _, err := r.ReadAt(hdr[:], pos); err != nil {
			if errors.Is(err, io.EOF) {
				return false, nil
			}
			return false, err
		}
		pos += recordHeader + int64(binary.BigEndian.Uint32(hdr[1:]))
	}
	return pos == off, nil
}

// heldLog appends the records of both streams to the output file, one write per record (a
// reader sees a record whole or not yet), discarding what passes max.
type heldLog struct {
	mu        sync.Mutex
	f         *os.File
	size, max int64
	discarded bool
}

func (l *heldLog) write(stream byte, p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.discarded {
		return len(p), nil
	}
	if l.size+recordHeader+int64(len(p)) > l.max {
		l.discarded = true
		note := fmt.Sprintf("\nenforcerd: exec output passed %d bytes; the rest is discarded\n", l.max)
		_ = l.append(StreamStderr, []byte(note))
		return len(p), nil
	}
	if err := l.append(stream, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (l *heldLog) append(stream byte, p []byte) error {
	buf := make([]byte, recordHeader+len(p))
	buf[0] = stream
	binary.BigEndian.PutUint32(buf[1:], uint32(len(p)))
	copy(buf[recordHeader:], p)
	n, err := l.f.Write(buf)
	l.size += int64(n)
	return err
}

type heldStream struct {
	l      *heldLog
	stream byte
}

func (s heldStream) Write(p []byte) (int, error) { return s.l.write(s.stream, p) }

// RunHolderCommand is the holder's main: args are what follows "enforcerd exec-holder"
// (SESSION ID), and DIR comes from HolderDirEnv, whose last two elements must be SESSION and
// ID. It returns the holder's exit status (see RunHolder).
func RunHolderCommand(args []string) int {
	dir := os.Getenv(HolderDirEnv)
	if len(args) != 2 || dir == "" || !slices.Equal(holderArgs(dir), append([]string{"enforcerd", HolderArg}, args...)) {
		fmt.Fprintf(os.Stderr, "enforcerd exec-holder: %s=%q does not name the exec %q; the daemon starts holders, not you\n", HolderDirEnv, dir, strings.Join(args, " "))
		return 125
	}
	return RunHolder(dir)
}

// RunHolder runs the spec in dir, records its output and writes its status, and returns the
// holder's exit status. SIGTERM kills the command (HeldKilled).
func RunHolder(dir string) int {
	// First: a SIGTERM from the daemon right after the start must find the handler.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	// /proc/self/comm is the thread group leader's, whichever thread writes it.
	_ = os.WriteFile("/proc/self/comm", []byte(holderComm), 0)
	st := runHeld(ctx, dir)
	st.Ended = time.Now().UTC()
	data, _ := json.Marshal(st)
	if err := writeFileAtomic(filepath.Join(dir, heldStatusFile), data); err != nil {
		fmt.Fprintf(os.Stderr, "enforcerd exec-holder: %v\n", err)
		return 1
	}
	return 0
}

func runHeld(ctx context.Context, dir string) HeldStatus {
	failed := func(err error) HeldStatus { return HeldStatus{Exit: 125, Reason: HeldFailed, Error: err.Error()} }
	data, err := os.ReadFile(filepath.Join(dir, heldSpecFile))
	if err != nil {
		return failed(fmt.Errorf("exec holder: %w", err))
	}
	var hf holderFile
	if err := json.Unmarshal(data, &hf); err != nil {
		return failed(fmt.Errorf("exec holder: spec: %w", err))
	}
	m, err := New(hf.Config)
	if err != nil {
		return failed(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, HeldOutputFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return failed(fmt.Errorf("exec holder: %w", err))
	}
	defer f.Close()
	l := &heldLog{f: f, max: MaxHeldOutput}
	if fi, err := f.Stat(); err == nil {
		l.size = fi.Size()
	}
	s := hf.Spec
	spec := ExecSpec{
		Args: s.Args, Env: s.Env, Dir: s.Dir, User: s.User, Timeout: s.Timeout,
		Stdout: heldStream{l, StreamStdout}, Stderr: heldStream{l, StreamStderr},
	}
	if len(s.Stdin) > 0 {
		spec.Stdin = bytes.NewReader(s.Stdin)
	}
	code, err := m.Exec(ctx, s.Session, spec)
	if serr := f.Sync(); serr != nil && err == nil {
		return failed(fmt.Errorf("exec holder: sync output: %w", serr))
	}
	var startErr *StartError
	var oom *OOMError
	var pids *PidsLimitError
	switch {
	case err == nil:
		return HeldStatus{Exit: code, Reason: HeldExited}
	case errors.As(err, &pids):
		return HeldStatus{Exit: code, Reason: HeldPidsLimit, Error: err.Error()}
	case errors.As(err, &startErr):
		return HeldStatus{Exit: startErr.Code, Reason: HeldNotStarted, Error: err.Error()}
	case errors.As(err, &oom):
		return HeldStatus{Exit: code, Reason: HeldOOM, Error: err.Error()}
	case errors.Is(err, ErrTimeout):
		return HeldStatus{Exit: 124, Reason: HeldTimeout, Error: err.Error()}
	case ctx.Err() != nil:
		return HeldStatus{Exit: 128 + int(syscall.SIGKILL), Reason: HeldKilled, Error: fmt.Sprintf("exec %q in %s: killed", s.Args[0], s.Session)}
	default:
		return failed(err)
	}
}

// writeFileAtomic writes path through a temporary file renamed into place.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
