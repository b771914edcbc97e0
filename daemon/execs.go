package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/container"
)

// An exec runs in a holder process of its own (container.StartHeld), which
// outlives the daemon: the daemon starts it, streams its output from the
// record file the holder writes, and records its end as an event. Nothing
// of an exec lives only in the daemon's memory: a restarted daemon finds
// every exec in <state-dir>/execs/<session>/<id> (adoptExecs), streams it
// from any frame's offset, and sees its end in the status file.

// holderStopGrace bounds how long deleting a session waits for its
// holders to write their status after their sandbox is gone.
const holderStopGrace = 3 * time.Second

// outputChunk is about how much output one frame batch reads.
const outputChunk = 256 << 10

// followPoll is how often a followed output is checked for more.
const followPoll = 50 * time.Millisecond

// recordedMarker in an exec's directory: its end event was recorded.
const recordedMarker = "recorded"

var execIDPattern = regexp.MustCompile(`^[0-9a-f]{16}$`)

// heldWatch is the set of execs a goroutine of this daemon waits on, so
// that an exec's end is watched (and recorded) once.
type heldWatch struct {
	mu  sync.Mutex
	ids map[string]bool // "<session>/<id>"
}

func (h *heldWatch) claim(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ids == nil {
		h.ids = map[string]bool{}
	}
	if h.ids[key] {
		return false
	}
	h.ids[key] = true
	return true
}

func (h *heldWatch) done(key string) {
	h.mu.Lock()
	delete(h.ids, key)
	h.mu.Unlock()
}

func (e *Engine) execRoot() string               { return filepath.Join(e.cfg.StateDir, "execs") }
func (e *Engine) execDir(name, id string) string { return filepath.Join(e.execRoot(), name, id) }

// Exec starts a command in a session's sandbox and returns at once. Its
// end is an event with the caller, its args and exit status: exec (the
// command ran, was killed or did not start), exec_timeout or oom; a start
// refused is an exec event with the error.
func (e *Engine) Exec(ctx context.Context, name string, req api.ExecRequest) (info api.ExecInfo, err error) {
	defer func() {
		if err != nil {
			e.recordCall(ctx, name, "exec", map[string]any{"args": req.Args, "exit": api.ExitEnforcerd}, err)
		}
	}()
	e.mu.Lock()
	s, ok := e.sessions[name]
	e.mu.Unlock()
	if !ok {
		return info, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	if !s.rec.Sandbox {
		return info, fmt.Errorf("session %q was created with --network-only; join its netns with ip netns exec %s: %w", name, s.rec.Netns, api.ErrNoSandbox)
	}
	if len(req.Args) == 0 {
		return info, badRequest(errors.New("exec: no command given"))
	}
	var timeout time.Duration
	if req.Timeout != "" {
		d, err := time.ParseDuration(req.Timeout)
		if err != nil || d <= 0 {
			return info, badRequest(fmt.Errorf("timeout %q: want a positive duration such as 30s", req.Timeout))
		}
		timeout = d
	}
	id, err := newExecID()
	if err != nil {
		return info, err
	}
	dir := e.execDir(name, id)
	proc, err := e.boxes.StartHeld(dir, container.HeldSpec{
		Session: name, Args: req.Args, Env: req.Env, Dir: req.Dir, User: req.User,
		Stdin: req.Stdin, Timeout: timeout,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		if errors.Is(err, container.ErrInvalidExec) {
			return info, badRequest(err)
		}
		return info, fmt.Errorf("exec in %s: %w", name, err)
	}
	key := name + "/" + id
	e.held.claim(key)
	e.finishMu.Lock()
	if e.execCallers == nil {
		e.execCallers = map[string]context.Context{}
	}
	e.execCallers[key] = context.WithoutCancel(ctx) // whoever records the end, it is this caller's
	e.finishMu.Unlock()
	go func() {
		defer e.held.done(key)
		_, _ = proc.Wait() // the holder is this daemon's child until it restarts
		e.finishExec(context.WithoutCancel(ctx), name, id)
	}()
	return e.execInfo(name, id)
}

func newExecID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("exec id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// heldEnd is how the exec in dir ended; ok is false while it runs. A
// holder gone without a status (killed) ended it as enforcerd's failure.
func heldEnd(dir string) (st container.HeldStatus, ok bool, err error) {
	if st, ok, err = container.ReadHeldStatus(dir); ok || err != nil {
		return st, ok, err
	}
	if container.HolderPid(dir) != 0 {
		return st, false, nil
	}
	// The holder writes its status before it exits: read again.
	if st, ok, err = container.ReadHeldStatus(dir); ok || err != nil {
		return st, ok, err
	}
	var ended time.Time
	if fi, err := os.Stat(filepath.Join(dir, container.HeldOutputFile)); err == nil {
		ended = fi.ModTime().UTC()
	}
	return container.HeldStatus{Exit: api.ExitEnforcerd, Reason: container.HeldFailed, Ended: ended,
		Error: fmt.Sprintf("exec %s: its holder process is gone without a status (killed?)", filepath.Base(dir))}, true, nil
}

// lastFrame is the frame that ends an exec's stream.
func lastFrame(st container.HeldStatus) api.ExecFrame {
	code := st.Exit
	if st.Reason == container.HeldExited {
		return api.ExecFrame{Exit: &code}
	}
	return api.ExecFrame{Error: api.OneLine(st.Error), Exit: &code}
}

// finishExec records the end event of an exec once (a marker file keeps
// a restarted daemon from recording it again).
func (e *Engine) finishExec(ctx context.Context, name, id string) {
	e.finishMu.Lock() // the holder's watcher and a stream's end may both get here
	defer e.finishMu.Unlock()
	key := name + "/" + id
	if c, ok := e.execCallers[key]; ok {
		ctx = c // the request's context: its caller goes on the event
		defer delete(e.execCallers, key)
	}
	dir := e.execDir(name, id)
	if _, err := os.Stat(filepath.Join(dir, recordedMarker)); err == nil {
		return
	}
	spec, _, err := container.ReadHeldSpec(dir)
	if err != nil {
		return // removed with its session
	}
	st, ok, err := heldEnd(dir)
	if err != nil || !ok {
		return
	}
	if err := os.WriteFile(filepath.Join(dir, recordedMarker), nil, 0o600); err != nil {
		return
	}
	action, detail := "exec", map[string]any{"args": spec.Args, "exec_id": id, "exit": st.Exit}
	var stErr error
	switch st.Reason {
	case container.HeldExited:
	case container.HeldTimeout:
		action, detail["timeout"] = "exec_timeout", spec.Timeout.String()
		stErr = errors.New(st.Error)
	case container.HeldOOM:
		action = "oom"
		stErr = errors.New(st.Error)
	default:
		stErr = errors.New(st.Error)
	}
	e.recordCall(ctx, name, action, detail, stErr)
}

// adoptExecs runs after the sessions are re-adopted: it watches the
// running execs of live sessions (their holders are no longer this
// daemon's children), records the ends it missed while down, and stops
// and removes the execs of sessions that are gone.
func (e *Engine) adoptExecs() {
	sessions, err := os.ReadDir(e.execRoot())
	if err != nil {
		return
	}
	for _, sd := range sessions {
		name := sd.Name()
		e.mu.Lock()
		_, live := e.sessions[name]
		e.mu.Unlock()
		if !live {
			if err := e.removeExecs(name); err != nil {
				e.log.Error("remove execs of a gone session", "session", name, "err", err)
			} else {
				e.log.Warn("reaped execs of a gone session", "session", name)
			}
			continue
		}
		ids, _ := os.ReadDir(filepath.Join(e.execRoot(), name))
		for _, x := range ids {
			id := x.Name()
			if !execIDPattern.MatchString(id) {
				continue
			}
			dir := e.execDir(name, id)
			if _, ok, _ := heldEnd(dir); ok {
				e.finishExec(context.Background(), name, id)
				continue
			}
			key := name + "/" + id
			if !e.held.claim(key) {
				continue
			}
			e.log.Info("re-adopted exec", "session", name, "exec", id, "holder_pid", container.HolderPid(dir))
			go func() {
				defer e.held.done(key)
				for container.HolderPid(dir) != 0 {
					time.Sleep(250 * time.Millisecond)
				}
				e.finishExec(context.Background(), name, id)
			}()
		}
	}
}

// removeExecs stops the holders of a session's execs (their commands died
// with the sandbox, or die now) and removes their directories.
func (e *Engine) removeExecs(name string) error {
	root := filepath.Join(e.execRoot(), name)
	ids, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var wg sync.WaitGroup
	for _, x := range ids {
		dir := filepath.Join(root, x.Name())
		wg.Add(1)
		go func() { defer wg.Done(); container.StopHolder(dir, holderStopGrace) }()
	}
	wg.Wait()
	if err := os.RemoveAll(root); err != nil {
		return fmt.Errorf("remove execs of %s: %w", name, err)
	}
	return nil
}

// execDirOf is the directory of a live session's exec.
func (e *Engine) execDirOf(name, id string) (string, error) {
	e.mu.Lock()
	_, ok := e.sessions[name]
	e.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	dir := e.execDir(name, id)
	if !execIDPattern.MatchString(id) {
		return "", fmt.Errorf("exec %q of session %q: %w (an exec id is 16 hex digits)", id, name, api.ErrUnknownExec)
	}
	if _, err := os.Stat(filepath.Join(dir, container.HeldOutputFile)); err != nil {
		return "", fmt.Errorf("exec %q of session %q: %w", id, name, api.ErrUnknownExec)
	}
	return dir, nil
}

func (e *Engine) execInfo(name, id string) (api.ExecInfo, error) {
	dir, err := e.execDirOf(name, id)
	if err != nil {
		return api.ExecInfo{}, err
	}
	spec, started, err := container.ReadHeldSpec(dir)
	if err != nil {
		return api.ExecInfo{}, fmt.Errorf("exec %q of session %q: %w", id, name, err)
	}
	info := api.ExecInfo{ID: id, Session: name, Args: spec.Args, State: api.ExecRunning, Started: started.UTC()}
	if fi, err := os.Stat(filepath.Join(dir, container.HeldOutputFile)); err == nil {
		info.OutputBytes = fi.Size()
	}
	st, ok, err := heldEnd(dir)
	if err != nil {
		return info, fmt.Errorf("exec %q of session %q: %w", id, name, err)
	}
	if ok {
		fr := lastFrame(st)
		ended := st.Ended
		info.State, info.Exit, info.Error, info.Ended = api.ExecExited, fr.Exit, fr.Error, &ended
	}
	return info, nil
}

// InspectExec is one exec of a session.
func (e *Engine) InspectExec(name, id string) (api.ExecInfo, error) { return e.execInfo(name, id) }

// ListExecs is every exec of a session, oldest first.
func (e *Engine) ListExecs(name string) ([]api.ExecInfo, error) {
	e.mu.Lock()
	_, ok := e.sessions[name]
	e.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	ids, _ := os.ReadDir(filepath.Join(e.execRoot(), name))
	out := []api.ExecInfo{}
	for _, x := range ids {
		if info, err := e.execInfo(name, x.Name()); err == nil {
			out = append(out, info)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out, nil
}

// KillExec stops a running exec (its holder kills the command's process
// group) and returns it ended.
func (e *Engine) KillExec(name, id string) (api.ExecInfo, error) {
	dir, err := e.execDirOf(name, id)
	if err != nil {
		return api.ExecInfo{}, err
	}
	container.StopHolder(dir, holderStopGrace)
	return e.execInfo(name, id)
}

// ExecOutput sends an exec's frames from offset on, then its last frame
// once it ended; with follow it waits for more until then (or ctx ends).
func (e *Engine) ExecOutput(ctx context.Context, name, id string, offset int64, follow bool, fn func(api.ExecFrame) error) error {
	dir, err := e.execDirOf(name, id)
	if err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(dir, container.HeldOutputFile))
	if err != nil {
		return fmt.Errorf("exec %q of session %q: %w", id, name, err)
	}
	defer f.Close()
	if offset > 0 {
		ok, err := container.HeldBoundary(f, offset)
		if err != nil {
			return fmt.Errorf("exec %q of session %q: %w", id, name, err)
		}
		if !ok {
			return badRequest(fmt.Errorf("offset %d: not the offset of a frame of exec %s (want 0 or a frame's offset)", offset, id))
		}
	}
	off := offset
	for {
		recs, next, err := container.ReadHeldRecords(f, off, outputChunk)
		if err != nil {
			return fmt.Errorf("exec %q of session %q: %w", id, name, err)
		}
		for _, r := range recs {
			stream := "stdout"
			if r.Stream == container.StreamStderr {
				stream = "stderr"
			}
			if err := fn(api.OutputFrame(stream, r.Data, r.End)); err != nil {
				return err
			}
		}
		off = next
		if len(recs) > 0 {
			continue
		}
		st, ended, err := heldEnd(dir)
		if err != nil {
			return fmt.Errorf("exec %q of session %q: %w", id, name, err)
		}
		if ended {
			// The output is complete before the status is written; read
			// what came since the last read, then end.
			if recs, _, _ := container.ReadHeldRecords(f, off, 1); len(recs) > 0 {
				continue
			}
			// Record the end before the caller hears of it: a caller that
			// acts on the exit (stops the daemon, reads the events) finds
			// the event in place.
			e.finishExec(context.Background(), name, id)
			return fn(lastFrame(st))
		}
		if !follow {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(followPoll):
		}
	}
}
