package daemon

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

func TestGrantParse(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	g, err := newGrant([]string{"a.example.com:443"}, "10m", true, now)
	if err != nil || g == nil || !g.Deadline.Equal(now.Add(10*time.Minute)) || !g.KeepEstablished || !slices.Equal(g.Entries, []string{"a.example.com:443"}) {
		t.Fatalf("10m: %+v, %v", g, err)
	}
	if g, err := newGrant([]string{"a.example.com"}, "", true, now); g != nil || err != nil {
		t.Fatalf("no allow_for (keep_established is an update's own then): %+v, %v", g, err)
	}
	w := newWorld(t)
	if _, err := w.d.Create(context.Background(), api.CreateRequest{Name: "k1", NetworkOnly: true, Allow: []string{"a.example.com"}, KeepEstablished: true}); err == nil || err.Error() != errKeepWithoutGrant.Error() || api.StatusOf(err) != 400 {
		t.Errorf("create with keep_established and no allow_for: %v", err)
	}
	for _, tc := range []struct {
		allow    []string
		allowFor string
		keep     bool
		want     string
	}{
		{[]string{"a.example.com"}, "10", false, `allow_for "10": want a positive duration such as 90s, 10m or 2h`},
		{[]string{"a.example.com"}, "0s", false, `allow_for "0s": want a positive duration such as 90s, 10m or 2h`},
		{[]string{"a.example.com"}, "-1m", false, `allow_for "-1m": want a positive duration such as 90s, 10m or 2h`},
		{nil, "10m", false, `allow_for "10m" with no allow entries: want --allow ENTRY --for DURATION (it applies to the allow entries of the same call)`},
	} {
		if _, err := newGrant(tc.allow, tc.allowFor, tc.keep, now); err == nil || err.Error() != tc.want {
			t.Errorf("%q %v: %v, want %s", tc.allowFor, tc.allow, err, tc.want)
		}
	}
}

func TestGrantDeadlines(t *testing.T) {
	now := time.Now()
	gs := []GrantRecord{
		{Entries: []string{"a"}, Deadline: now.Add(-time.Second)},
		{Entries: []string{"b"}, Deadline: now.Add(time.Hour)},
		{Entries: []string{"c"}, Deadline: now.Add(time.Minute)},
	}
	if d := dueGrants(gs, now); !slices.Equal(d, []int{0}) {
		t.Fatalf("due %v", d)
	}
	if next, ok := nextDeadline(gs); !ok || !next.Equal(gs[0].Deadline) {
		t.Fatalf("next %v %v", next, ok)
	}
	ended := endDueGrants(gs, now)
	if ended[0].Ended == nil || ended[1].Ended != nil || gs[0].Ended != nil {
		t.Fatalf("endDueGrants: %+v (the input must stay as it was: %+v)", ended, gs)
	}
	if next, _ := nextDeadline(ended); !next.Equal(gs[2].Deadline) {
		t.Fatalf("next after the first ended: %v", next)
	}
}

// waitGrantEnded polls inspect until the session's grant i has ended.
func waitGrantEnded(t *testing.T, d *Engine, name string, i int) api.SessionInfo {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		in, err := d.Inspect(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(in.Policy.Grants) > i && in.Policy.Grants[i].Ended != nil {
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("grant %d of %s never ended: %+v", i, name, in.Policy.Grants)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestGrantExpiresRevokes: an update's --allow --for entries are revoked
// at the deadline like a --revoke (the kernel's batch, the DNS policy,
// flows cut), the record says the grant ended, an operator event marks
// it, and why answers grant-expired; the entries without --for stay.
func TestGrantExpiresRevokes(t *testing.T) {
	w := newWorld(t)
	w.mustCreate(api.CreateRequest{Name: "g1", NetworkOnly: true, Allow: []string{"a.example.com", "93.184.216.7"}})
	in, err := w.d.UpdatePolicy(context.Background(), "g1", api.PolicyUpdate{Allow: []string{"b.example.com:443", "93.184.217.0/24"}, AllowFor: "300ms"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Policy.Grants) != 1 || in.Policy.Grants[0].Ended != nil || time.Until(in.Policy.Grants[0].Deadline) > time.Second {
		t.Fatalf("grants after the update: %+v", in.Policy.Grants)
	}
	if !slices.Contains(in.Policy.Allow, "b.example.com:443") {
		t.Fatalf("the granted entry is not allowed: %v", in.Policy.Allow)
	}
	in = waitGrantEnded(t, w.d, "g1", 0)
	if slices.Contains(in.Policy.Allow, "b.example.com:443") || slices.Contains(in.Policy.Allow, "93.184.217.0/24") {
		t.Errorf("the granted entries survived their end: %v", in.Policy.Allow)
	}
	if !slices.Contains(in.Policy.Allow, "a.example.com") || !slices.Contains(in.Policy.Allow, "93.184.216.7") {
		t.Errorf("the control entries went with the grant: %v", in.Policy.Allow)
	}
	if in.Policy.Generation != 3 {
		t.Errorf("generation %d, want 3 (the grant's end is an update)", in.Policy.Generation)
	}
	if st := targetsString(w.fw.lastUpdate.New.Static); strings.Contains(st, "93.184.217") || !strings.Contains(st, "93.184.216.7") {
		t.Errorf("the kernel's batch after the grant's end: %s", st)
	}
	// The record holds the end (a restart does not grant again).
	raw, err := os.ReadFile(filepath.Join(w.stateDir, "sessions", "g1.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec SessionRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Grants) != 1 || rec.Grants[0].Ended == nil {
		t.Errorf("record's grants: %+v", rec.Grants)
	}
	evs, _, _ := w.d.Events(context.Background(), "g1", false)
	var ended *api.Event
	for i := range evs {
		if evs[i].Action == "grant_expired" {
			ended = &evs[i]
		}
	}
	if ended == nil || ended.Kind != api.EventKindLifecycle || ended.Detail["outcome"] != "ok" {
		t.Fatalf("no grant_expired operator event: %s", actionsOf(evs))
	}
	ans, err := w.d.Why(context.Background(), "g1", "b.example.com:443", "")
	if err != nil || ans.Reason != ReasonGrantExpired || ans.Verdict != api.WhyNXDomain {
		t.Errorf("why b.example.com:443: %+v, %v", ans, err)
	}
	ans, err = w.d.Why(context.Background(), "g1", "93.184.217.9:443", "")
	if err != nil || ans.Reason != ReasonGrantExpired {
		t.Errorf("why 93.184.217.9:443: %+v, %v", ans, err)
	}
	if ans, _ := w.d.Why(context.Background(), "g1", "a.example.com", ""); ans.Reason == ReasonGrantExpired {
		t.Errorf("why of the control: %+v", ans)
	}
}

// TestGrantEndsAcrossRestart: a deadline that passed while the daemon was
// down ends the grant when the next daemon adopts the session; a locked
// session's grant ends too.
func TestGrantEndsAcrossRestart(t *testing.T) {
	w := newWorld(t)
	w.mustCreate(api.CreateRequest{Name: "g2", NetworkOnly: true, Allow: []string{"93.184.216.9"}, AllowFor: "1h", Locked: true})
	w.mustCreate(api.CreateRequest{Name: "g3", NetworkOnly: true, Allow: []string{"93.184.216.10"}, AllowFor: "1h"})
	path := filepath.Join(w.stateDir, "sessions", "g2.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec SessionRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Grants) != 1 || rec.Request.AllowFor != "" {
		t.Fatalf("record: grants %+v, request allow_for %q", rec.Grants, rec.Request.AllowFor)
	}
	rec.Grants[0].Deadline = time.Now().Add(-time.Minute).UTC()
	if err := w.d.state.Save(rec); err != nil {
		t.Fatal(err)
	}
	w.d.stopGrants() // the first daemon is gone
	w.restart(nil)
	in := waitGrantEnded(t, w.d, "g2", 0)
	if len(in.Policy.Allow) != 0 {
		t.Errorf("allow after the grant's end: %v", in.Policy.Allow)
	}
	if in, _ := w.d.Inspect("g3"); len(in.Policy.Grants) != 1 || in.Policy.Grants[0].Ended != nil || len(in.Policy.Allow) != 1 {
		t.Errorf("control (deadline ahead): %+v", in.Policy)
	}
}

// TestGrantRevokedBeforeItsEnd: a grant whose entries a caller revoked
// before the deadline ends without another update (the generation stays).
func TestGrantRevokedBeforeItsEnd(t *testing.T) {
	w := newWorld(t)
	w.mustCreate(api.CreateRequest{Name: "g4", NetworkOnly: true, Allow: []string{"93.184.216.9"}, AllowFor: "400ms"})
	if _, err := w.d.UpdatePolicy(context.Background(), "g4", api.PolicyUpdate{Revoke: []string{"93.184.216.9"}, Allow: []string{"93.184.216.10"}}, false); err != nil {
		t.Fatal(err)
	}
	in := waitGrantEnded(t, w.d, "g4", 0)
	if in.Policy.Generation != 2 || !slices.Equal(in.Policy.Allow, []string{"93.184.216.10"}) {
		t.Errorf("after the grant's end: generation %d, allow %v; want 2 and the caller's entry kept", in.Policy.Generation, in.Policy.Allow)
	}
}
