package apitest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// execRuns are the fake's execs. A fake exec runs ExecFn in a goroutine
// and records its output as frames; a frame's Offset is its index + 1.
type execRuns struct {
	mu    sync.Mutex
	byID  map[string]*fakeExec
	order []string
	n     int
}

type fakeExec struct {
	info   api.ExecInfo
	mu     sync.Mutex
	frames []api.ExecFrame // output, then the last frame once ended
	more   chan struct{}   // closed and replaced at every new frame
	cancel context.CancelFunc
	done   chan struct{}
}

func (x *fakeExec) add(fr api.ExecFrame, last bool) {
	x.mu.Lock()
	if !last {
		fr.Offset = int64(len(x.frames) + 1)
	}
	x.frames = append(x.frames, fr)
	close(x.more)
	x.more = make(chan struct{})
	x.mu.Unlock()
}

type fakeStream struct {
	x      *fakeExec
	stream string
}

func (s fakeStream) Write(p []byte) (int, error) {
	if len(p) > 0 {
		s.x.add(api.OutputFrame(s.stream, p, 0), false)
	}
	return len(p), nil
}

// lastFrame is how the real daemon ends a stream: the status alone, or
// with the error line when the command did not end by itself.
func lastFrame(code int, err error) api.ExecFrame {
	switch {
	case err == nil:
		return api.ExecFrame{Exit: &code}
	case errors.Is(err, api.ErrExecTimeout):
		code = api.ExitTimeout
	case errors.Is(err, api.ErrNotStarted), errors.Is(err, api.ErrOOMKilled):
	default:
		code = api.ExitEnforcerd
	}
	return api.ExecFrame{Error: api.OneLine(err.Error()), Exit: &code}
}

func (f *Engine) startExec(name string, req api.ExecRequest, fn func(context.Context, string, api.ExecRequest, io.Writer, io.Writer) (int, error)) api.ExecInfo {
	r := &f.runs
	r.mu.Lock()
	if r.byID == nil {
		r.byID = map[string]*fakeExec{}
	}
	r.n++
	id := fmt.Sprintf("%016x", r.n)
	ctx, cancel := context.WithCancel(context.Background())
	x := &fakeExec{
		info:   api.ExecInfo{ID: id, Session: name, Args: req.Args, State: api.ExecRunning, Started: time.Now().UTC()},
		more:   make(chan struct{}),
		cancel: cancel,
		done:   make(chan struct{}),
	}
	r.byID[id] = x
	r.order = append(r.order, id)
	r.mu.Unlock()
	go func() {
		defer close(x.done)
		code, err := fn(ctx, name, req, fakeStream{x, "stdout"}, fakeStream{x, "stderr"})
		fr := lastFrame(code, err)
		x.mu.Lock()
		now := time.Now().UTC()
		x.info.State, x.info.Exit, x.info.Error, x.info.Ended = api.ExecExited, fr.Exit, fr.Error, &now
		x.mu.Unlock()
		x.add(fr, true)
	}()
	return x.snapshot()
}

func (x *fakeExec) snapshot() api.ExecInfo {
	x.mu.Lock()
	defer x.mu.Unlock()
	info := x.info
	info.OutputBytes = int64(len(x.frames))
	if info.State == api.ExecExited {
		info.OutputBytes--
	}
	return info
}

func (f *Engine) exec(name, id string) (*fakeExec, error) {
	f.mu.Lock()
	_, ok := f.sessions[name]
	f.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	f.runs.mu.Lock()
	defer f.runs.mu.Unlock()
	x, ok := f.runs.byID[id]
	if !ok || x.info.Session != name {
		return nil, fmt.Errorf("exec %q of session %q: %w", id, name, api.ErrUnknownExec)
	}
	return x, nil
}

func (f *Engine) ExecOutput(ctx context.Context, name, id string, offset int64, follow bool, fn func(api.ExecFrame) error) error {
	x, err := f.exec(name, id)
	if err != nil {
		return err
	}
	next := int(offset)
	for {
		x.mu.Lock()
		if next > len(x.frames) {
			x.mu.Unlock()
			return fmt.Errorf("offset %d of exec %s: %w: past the end of its output", offset, id, api.ErrBadRequest)
		}
		frames, more := x.frames[next:], x.more
		x.mu.Unlock()
		for _, fr := range frames {
			if err := fn(fr); err != nil {
				return err
			}
			if api.IsExecFrameEnd(fr) {
				return nil
			}
			next++
		}
		if !follow {
			return nil
		}
		select {
		case <-more:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (f *Engine) ListExecs(name string) ([]api.ExecInfo, error) {
	f.mu.Lock()
	_, ok := f.sessions[name]
	f.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	f.runs.mu.Lock()
	var xs []*fakeExec
	for _, id := range f.runs.order {
		if x := f.runs.byID[id]; x.info.Session == name {
			xs = append(xs, x)
		}
	}
	f.runs.mu.Unlock()
	var out []api.ExecInfo
	for _, x := range xs {
		out = append(out, x.snapshot())
	}
	return out, nil
}

func (f *Engine) InspectExec(name, id string) (api.ExecInfo, error) {
	x, err := f.exec(name, id)
	if err != nil {
		return api.ExecInfo{}, err
	}
	return x.snapshot(), nil
}

func (f *Engine) KillExec(name, id string) (api.ExecInfo, error) {
	x, err := f.exec(name, id)
	if err != nil {
		return api.ExecInfo{}, err
	}
	x.cancel()
	<-x.done
	return x.snapshot(), nil
}
