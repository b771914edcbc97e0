package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/daemon/eventlog"
	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/netpolicy"
)

// restartPersisted is restart with the events persisted under the state
// dir, as Open wires them; the previous daemon's log is shut down first,
// as serve's exit does.
// eventsNow is the persisted events' clock: now, moved on by eventsSkew.
func (w *world) eventsNow() time.Time { return time.Now().Add(time.Duration(w.eventsSkew.Load())) }

func (w *world) restartPersisted(retention time.Duration) {
	w.t.Helper()
	if w.d != nil {
		w.d.events.Shutdown()
	}
	guard, err := netpolicy.NewGuard(smPool, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	store, err := NewStateStore(w.stateDir)
	if err != nil {
		w.t.Fatal(err)
	}
	events, err := eventlog.Open(filepath.Join(w.stateDir, "events"), 0, eventlog.StoreOptions{Retention: retention, Now: w.eventsNow})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(events.Shutdown)
	w.dns = &fakeResolver{in: w.in, reg: map[netip.Addr]dnsproxy.SessionPolicy{}}
	cfg := Config{StateDir: w.stateDir, NamePrefix: smPrefix, Pool: smPool, ImagesDirs: []string{w.images}, EventsRetention: retention}
	w.d = New(cfg, Parts{
		Network: w.nets, Firewall: w.fw, Resolver: w.dns, Sandboxes: w.boxes,
		Guard: guard, Pin: fakePin, DNSAddr: smDNSAddr, Store: store, Events: events,
	})
	if err := w.d.Reconcile(); err != nil {
		w.t.Fatalf("reconcile: %v", err)
	}
}

func asCaller(uid uint32) context.Context {
	return api.WithCaller(context.Background(), api.Caller{UID: uid, GID: uid + 1, PID: int32(uid) + 2})
}

// eventsOf returns a session's events without their last line, the
// counts (required).
func eventsOf(t *testing.T, d *Engine, name string) []api.Event {
	t.Helper()
	evs, _, err := d.Events(context.Background(), name, false)
	if err != nil {
		t.Fatalf("events of %s: %v", name, err)
	}
	if n := len(evs); n == 0 || evs[n-1].Kind != api.EventKindSummary || evs[n-1].Action != eventlog.SummaryActionCounts {
		t.Fatalf("events of %s do not end with the counts: %s", name, actionsOf(evs))
	}
	return evs[:len(evs)-1]
}

func actionsOf(evs []api.Event) string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Action)
	}
	return strings.Join(out, " ")
}

// TestAuditTrail: every API call that changes something is an event with
// its caller and outcome; the events survive a restart of the daemon
// (the adopted session's ring reads as before, then "adopted"); a removed
// session's events stay readable for the retention; no scope credential
// reaches the record, the events or their files.
func TestAuditTrail(t *testing.T) {
	w := newWorld(t)
	w.restartPersisted(time.Hour)
	const secret = "hunter2"
	req := api.CreateRequest{Name: "a1", NetworkOnly: true, Allow: []string{"api.example.com"},
		Scope: []string{"https://user:" + secret + "@docs.example.com/x"}, Labels: map[string]string{"run": "7"}}
	if _, err := w.d.Create(asCaller(1000), req); err != nil {
		t.Fatal(err)
	}
	if _, err := w.d.Create(asCaller(1001), api.CreateRequest{Name: "a1", NetworkOnly: true}); !errors.Is(err, api.ErrNameTaken) {
		t.Fatalf("second create: %v", err)
	}
	if _, err := w.d.Create(asCaller(1000), api.CreateRequest{Name: "b1", Rootfs: w.image}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.d.Exec(asCaller(1002), "b1", api.ExecRequest{Args: []string{"id", "-u"}}); err == nil {
		t.Fatal("the fake exec ran")
	}
	w.d.recordDNSDecision(dnsproxy.Event{Time: time.Now(), Session: "a1", Name: "api.example.com.", Type: "A", Verdict: dnsproxy.VerdictAllowed,
		Dropped: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})

	evs := eventsOf(t, w.d, "a1")
	if got := actionsOf(evs); got != "created create_failed filtered" {
		t.Fatalf("a1: %s", got)
	}
	created, refused := evs[0], evs[1]
	if created.Caller == nil || *created.Caller != (api.Caller{UID: 1000, GID: 1001, PID: 1002}) || created.Detail["outcome"] != "ok" {
		t.Errorf("created: caller %+v detail %v", created.Caller, created.Detail)
	}
	if fmt.Sprint(created.Detail["scope"]) != "[https://docs.example.com/x]" || fmt.Sprint(created.Detail["labels"]) != "map[run:7]" {
		t.Errorf("created: essentials %v", created.Detail)
	}
	if refused.Caller == nil || refused.Caller.UID != 1001 || refused.Detail["outcome"] != "error" ||
		refused.Detail["error"] != `session "a1" already exists: session name taken` {
		t.Errorf("refused create: caller %+v detail %v", refused.Caller, refused.Detail)
	}
	exec := eventsOf(t, w.d, "b1")[1]
	if exec.Action != "exec" || exec.Caller == nil || exec.Caller.UID != 1002 || exec.Detail["exit"] != 125 ||
		exec.Detail["outcome"] != "error" || fmt.Sprint(exec.Detail["args"]) != "[id -u]" {
		t.Errorf("exec: %+v", exec)
	}

	// A restart, the first daemon's events all on file: the rings read
	// the same, then adopted.
	before := eventsOf(t, w.d, "a1")
	w.restartPersisted(time.Hour)
	after := eventsOf(t, w.d, "a1")
	if got, want := actionsOf(after), actionsOf(before)+" adopted"; got != want {
		t.Fatalf("a1 after the restart: %s, want %s", got, want)
	}
	if after[0].Caller == nil || after[0].Caller.UID != 1000 || !after[0].Time.Equal(before[0].Time) {
		t.Errorf("a1's created after the restart: %+v", after[0])
	}

	if err := w.d.Delete(asCaller(1003), "a1"); err != nil {
		t.Fatal(err)
	}
	if err := w.d.Delete(asCaller(1003), "a1"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	// Removed, within the retention: readable; a follow ends at once.
	evs, ch, err := w.d.Events(context.Background(), "a1", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, open := <-ch; open {
		t.Error("follow of a removed session: channel open")
	}
	last := evs[len(evs)-3 : len(evs)-1]
	if actionsOf(last) != "deleted delete_failed" || evs[len(evs)-1].Action != eventlog.SummaryActionCounts || last[0].Caller == nil || last[0].Caller.UID != 1003 ||
		last[1].Detail["error"] != `session "a1": unknown session` {
		t.Errorf("removed a1: %s %+v", actionsOf(evs), last)
	}
	if _, _, err := w.d.Events(context.Background(), "never", false); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("events of a name never used: %v", err)
	}

	// No file holds the credential.
	_ = filepath.Walk(w.stateDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if data, _ := os.ReadFile(p); strings.Contains(string(data), secret) {
				t.Errorf("%s holds the scope's password", p)
			}
		}
		return nil
	})
	rec, err := os.ReadFile(filepath.Join(w.stateDir, "sessions", "b1.json"))
	if err != nil || strings.Contains(string(rec), "@") {
		t.Errorf("b1's record: %v %s", err, rec)
	}

	// The retention passed: the next prune removes a1's files, not b1's.
	w.eventsSkew.Store(int64(2 * time.Hour))
	w.d.events.Prune()
	if _, _, err := w.d.Events(context.Background(), "a1", false); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("a1 past its retention: %v", err)
	}
	if _, err := os.Stat(filepath.Join(w.stateDir, "events", "operator", "b1.ndjson")); err != nil {
		t.Errorf("b1 (live) pruned: %v", err)
	}
}

// TestAllEventsByLabel: the stream of every session keeps the label's
// sessions, recorded and followed, refused creates by their request's
// labels.
func TestAllEventsByLabel(t *testing.T) {
	w := newWorld(t)
	w.restartPersisted(time.Hour)
	for _, r := range []api.CreateRequest{
		{Name: "l1", NetworkOnly: true, Labels: map[string]string{"run": "1"}},
		{Name: "l2", NetworkOnly: true, Labels: map[string]string{"run": "2"}},
	} {
		if _, err := w.d.Create(asCaller(0), r); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	recorded, ch, err := w.d.AllEvents(ctx, "run", "1", true)
	if err != nil || len(recorded) != 1 || recorded[0].Session != "l1" {
		t.Fatalf("recorded %+v %v", recorded, err)
	}
	_ = w.d.Delete(asCaller(0), "l2")
	_, _ = w.d.Create(asCaller(0), api.CreateRequest{Name: "bad", Labels: map[string]string{"run": "1"}}) // neither rootfs nor network-only
	_ = w.d.Delete(asCaller(0), "l1")
	var got []string
	for range 2 {
		select {
		case ev := <-ch:
			got = append(got, ev.Session+":"+ev.Action)
		case <-time.After(5 * time.Second):
			t.Fatalf("followed %v, then nothing", got)
		}
	}
	if strings.Join(got, " ") != "bad:create_failed l1:deleted" {
		t.Errorf("followed %v", got)
	}
	cancel()
	for range ch {
	}
}
