// Package apitest is an in-memory api.Engine for tests of the API's
// consumers (the handler, the client, the CLI), as net/http/httptest is for
// HTTP. It lives apart from package api so no product binary links it.
package apitest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// Engine is an in-memory api.Engine. Names steer failures: a create of
// "bad-*" is a bad request, "full-*" exhausts the pool, "boom-*" fails
// internally. ExecFn, when set, replaces the default exec (which prints
// "ran ARGS"). Set fields before serving.
type Engine struct {
	ExecFn    func(ctx context.Context, name string, req api.ExecRequest, stdout, stderr io.Writer) (int, error)
	Unhealthy error // what Healthy returns

	mu       sync.Mutex
	sessions map[string]api.SessionInfo
	creates  []api.CreateRequest
	execs    []api.ExecRequest
	runs     execRuns // the execs started, by ID (execs.go)
	events   map[string][]api.Event
	subs     map[string][]chan api.Event
	allSubs  []allSub
	images   map[string]api.ImageInfo // images.go
	reports  map[string]api.LedgerReport
}

// allSub is a follower of every session's events carrying a label.
type allSub struct {
	key, value string
	ch         chan api.Event
}

// New returns an empty engine.
func New() *Engine {
	return &Engine{sessions: map[string]api.SessionInfo{}, events: map[string][]api.Event{}, subs: map[string][]chan api.Event{}}
}

// Creates are the create requests received, in order.
func (f *Engine) Creates() []api.CreateRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]api.CreateRequest(nil), f.creates...)
}

// Execs are the exec requests received, in order.
func (f *Engine) Execs() []api.ExecRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]api.ExecRequest(nil), f.execs...)
}

// Record appends an event to its session's history and sends it to the
// session's followers.
func (f *Engine) Record(ev api.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recordLocked(ev)
}

func (f *Engine) recordLocked(ev api.Event) {
	f.events[ev.Session] = append(f.events[ev.Session], ev)
	for _, ch := range f.subs[ev.Session] {
		ch <- ev // buffered; tests record few events
	}
	for _, s := range f.allSubs {
		if f.labelledLocked(ev.Session, s.key, s.value) {
			s.ch <- ev
		}
	}
}

func (f *Engine) labelledLocked(session, key, value string) bool {
	if key == "" {
		return true
	}
	v, ok := f.sessions[session].Labels[key]
	return ok && v == value
}

func (f *Engine) Create(ctx context.Context, req api.CreateRequest) (api.SessionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creates = append(f.creates, req)
	switch {
	case strings.HasPrefix(req.Name, "bad-"):
		return api.SessionInfo{}, fmt.Errorf("allow entry %q: not a name, wildcard or CIDR: %w", "x y", api.ErrBadRequest)
	case strings.HasPrefix(req.Name, "full-"):
		return api.SessionInfo{}, fmt.Errorf("%w: no free /30 in 10.20.0.0/16", api.ErrPoolExhausted)
	case strings.HasPrefix(req.Name, "boom-"):
		return api.SessionInfo{}, errors.New("add veth enfboomh: file exists")
	}
	if _, ok := f.sessions[req.Name]; ok {
		return api.SessionInfo{}, fmt.Errorf("session %q already exists: %w", req.Name, api.ErrNameTaken)
	}
	labels := req.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	info := api.SessionInfo{
		Name: req.Name, Netns: "enf-" + req.Name, GuestIP: "10.20.0.2", GatewayIP: "10.20.0.1",
		HostVeth: "enf" + req.Name + "h", Egress: "allowlist", Policy: api.PolicyView{Allow: req.Allow, Deny: req.Deny, OnDeny: cmp.Or(req.OnDeny, "reject"), NameCheck: cmp.Or(req.NameCheck, "tls"), QUIC: cmp.Or(req.QUIC, "refuse")},
		Sandbox: !req.NetworkOnly, Rootfs: req.Rootfs, Image: req.Image, Attested: []api.AttestedAddr{}, Labels: labels,
		Created: time.Date(2025, 1, 2, 3, 0, 0, 0, time.UTC),
	}
	f.sessions[req.Name] = info
	ev := api.Event{Time: time.Now().UTC(), Session: req.Name, Kind: api.EventKindLifecycle, Action: "created"}
	if c, ok := api.CallerFrom(ctx); ok {
		ev.Caller = &c
	}
	f.recordLocked(ev)
	return info, nil
}

func (f *Engine) Delete(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sessions[name]; !ok {
		return fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	delete(f.sessions, name)
	delete(f.events, name)
	for _, ch := range f.subs[name] {
		close(ch)
	}
	delete(f.subs, name)
	return nil
}

func (f *Engine) DeleteAttachment(ctx context.Context, name string, at api.AttachmentRef) error {
	f.mu.Lock()
	s, ok := f.sessions[name]
	f.mu.Unlock()
	if ok && (s.ContainerID != at.ContainerID || s.IfName != at.IfName) {
		return fmt.Errorf("session %q is another attachment's: %w", name, api.ErrNameTaken)
	}
	return f.Delete(ctx, name)
}

func (f *Engine) DeleteByLabel(ctx context.Context, key, value string) ([]string, error) {
	var names []string
	for _, s := range f.List(key, value) {
		names = append(names, s.Name)
	}
	for _, n := range names {
		_ = f.Delete(ctx, n)
	}
	return names, nil
}

func (f *Engine) List(key, value string) []api.SessionInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.SessionInfo
	for _, s := range f.sessions {
		if v, ok := s.Labels[key]; key == "" || (ok && v == value) {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (f *Engine) Inspect(name string) (api.SessionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sessions[name]
	if !ok {
		return s, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	return s, nil
}

func (f *Engine) Exec(ctx context.Context, name string, req api.ExecRequest) (api.ExecInfo, error) {
	f.mu.Lock()
	s, ok := f.sessions[name]
	f.execs = append(f.execs, req)
	fn := f.ExecFn
	f.mu.Unlock()
	if !ok {
		return api.ExecInfo{}, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	if !s.Sandbox {
		return api.ExecInfo{}, fmt.Errorf("session %q was created with --network-only: %w", name, api.ErrNoSandbox)
	}
	if fn == nil {
		fn = func(_ context.Context, _ string, req api.ExecRequest, stdout, _ io.Writer) (int, error) {
			fmt.Fprintf(stdout, "ran %s\n", strings.Join(req.Args, " "))
			return 0, nil
		}
	}
	return f.startExec(name, req, fn), nil
}

func (f *Engine) Events(ctx context.Context, name string, follow bool) ([]api.Event, <-chan api.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sessions[name]; !ok {
		return nil, nil, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	recorded := append([]api.Event(nil), f.events[name]...)
	if !follow {
		return recorded, nil, nil
	}
	ch := make(chan api.Event, 64)
	f.subs[name] = append(f.subs[name], ch)
	return recorded, ch, nil
}

// Why answers "allowed" for a destination the session's allow list names
// as given, "dropped" otherwise.
func (f *Engine) Why(ctx context.Context, name, dest, sni string) (api.WhyAnswer, error) {
	s, err := f.Inspect(name)
	if err != nil {
		return api.WhyAnswer{}, err
	}
	ans := api.WhyAnswer{Session: name, Dest: dest, Verdict: api.WhyDropped, Reason: "not-allowed", Detail: "not in the allow list"}
	for _, a := range s.Policy.Allow {
		if a == dest {
			ans.Verdict, ans.Reason, ans.Detail, ans.Entry = api.WhyAllowed, "static", "in the allow list", a
		}
	}
	return ans, nil
}

func (f *Engine) AllEvents(ctx context.Context, key, value string, follow bool) ([]api.Event, <-chan api.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var recorded []api.Event
	for name, evs := range f.events {
		if _, live := f.sessions[name]; live && f.labelledLocked(name, key, value) {
			recorded = append(recorded, evs...)
		}
	}
	sort.SliceStable(recorded, func(i, j int) bool { return recorded[i].Time.Before(recorded[j].Time) })
	if !follow {
		return recorded, nil, nil
	}
	ch := make(chan api.Event, 64)
	f.allSubs = append(f.allSubs, allSub{key: key, value: value, ch: ch})
	go func() {
		<-ctx.Done()
		f.mu.Lock()
		defer f.mu.Unlock()
		for i, s := range f.allSubs {
			if s.ch == ch {
				f.allSubs = append(f.allSubs[:i], f.allSubs[i+1:]...)
				close(ch)
				return
			}
		}
	}()
	return recorded, ch, nil
}

func (f *Engine) Healthy() error { return f.Unhealthy }

// Report returns what SetReport set for the session, else, for a live
// session, a verified empty ledger.
func (f *Engine) Report(ctx context.Context, name string) (api.LedgerReport, error) {
	f.mu.Lock()
	rep, ok := f.reports[name]
	f.mu.Unlock()
	if ok {
		return rep, nil
	}
	if _, err := f.Inspect(name); err != nil {
		return api.LedgerReport{}, err
	}
	return api.LedgerReport{Session: name, Verified: true, Destinations: []api.LedgerDestination{}}, nil
}

// SetReport sets what Report returns for a session (live or not).
func (f *Engine) SetReport(name string, rep api.LedgerReport) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.reports == nil {
		f.reports = map[string]api.LedgerReport{}
	}
	f.reports[name] = rep
}
