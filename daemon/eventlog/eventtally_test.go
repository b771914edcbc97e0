package eventlog

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// TestGuestFloodKeepsOperatorRecords: 100,000 DNS decisions of a session
// (a guest's flood) leave every operator record in its ring, its file and
// a read after a restart and after removal; the guest lines are a bounded
// sample (the file rotated, the ring at its capacity, the early lines gone
// from both: the control that the flood did push lines out), while the
// counts are exact, and the lines left out are counted and reported.
func TestGuestFloodKeepsOperatorRecords(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, 0, StoreOptions{MaxBytes: 16 << 10, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { l.Shutdown() }()
	l.lineRate = 0 // no refill: the sample is exactly the burst, whatever the machine's pace
	op := func(action string, uid uint32) api.Event {
		return api.Event{Session: "g", Kind: api.EventKindLifecycle, Action: action, Caller: &api.Caller{UID: uid},
			Detail: map[string]any{"outcome": "ok"}}
	}
	l.Open("g", nil)
	l.Record(op("created", 1000))
	l.RecordAsync(api.Event{Session: "g", Kind: api.EventKindDNS, Action: "allowed", Detail: map[string]any{"name": "first.example."}})
	l.Record(op("policy_updated", 1001))
	const flood = 100000
	for i := range flood {
		action := "denied"
		if i%4 == 0 {
			action = "allowed"
		}
		l.RecordAsync(api.Event{Session: "g", Kind: api.EventKindDNS, Action: action, Detail: map[string]any{"name": "x.example."}})
	}
	l.RecordAsync(api.Event{Session: "g", Kind: api.EventKindFlow, Action: FlowActionUnlogged, Detail: map[string]any{"count": uint64(7)}})
	l.Record(op("exec", 1002))

	check := func(when string, evs []api.Event) {
		t.Helper()
		var ops []string
		dns := 0
		for _, ev := range evs {
			switch ev.Kind {
			case api.EventKindLifecycle:
				if ev.Caller == nil {
					t.Errorf("%s: %s without its caller", when, ev.Action)
				}
				ops = append(ops, ev.Action)
			case api.EventKindDNS:
				dns++
			}
		}
		if len(ops) < 3 || ops[0] != "created" || ops[1] != "policy_updated" || ops[2] != "exec" {
			t.Errorf("%s: operator records %v, want created, policy_updated, exec first", when, ops)
		}
		if dns > guestLineBurst || dns == 0 {
			t.Errorf("%s: %d dns lines, want a sample of at most %d", when, dns, guestLineBurst)
		}
		sum := evs[len(evs)-1]
		wantDenied, wantAllowed := uint64(flood-flood/4), uint64(flood/4+1)
		if sum.Kind != api.EventKindSummary || sum.Action != SummaryActionCounts ||
			sum.Detail["dns_denied"] != wantDenied || sum.Detail["dns_allowed"] != wantAllowed ||
			sum.Detail["flow_unlogged"] != uint64(7) || sum.Detail["unlogged"] != uint64(flood+1-guestLineBurst) {
			t.Errorf("%s: counts %+v, want %d denied, %d allowed, 7 flows unlogged, %d lines unlogged", when, sum, wantDenied, wantAllowed, flood+1-guestLineBurst)
		}
	}
	evs, _, err := l.Read(context.Background(), "g", false)
	if err != nil {
		t.Fatal(err)
	}
	check("live", evs)
	// The line before the exec reports the lines left out.
	var marker *api.Event
	for i := range evs {
		if evs[i].Kind == api.EventKindSummary && evs[i].Action == SummaryActionUnlogged {
			marker = &evs[i]
		}
	}
	if marker == nil || marker.Detail["count"] != uint64(flood+1-guestLineBurst) {
		t.Errorf("no unlogged line with the count of the lines left out: %+v", marker)
	}
	// The operator's file never rotates; the guest file did.
	if _, err := os.Stat(filepath.Join(dir, "g"+eventRotatedExt)); err != nil {
		t.Errorf("the guest file did not rotate under the flood: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, operatorDir, "g"+eventRotatedExt)); err == nil {
		t.Error("the operator's file rotated")
	}

	// A restart: the same records and counts.
	l.Shutdown()
	l2, err := Open(dir, 0, StoreOptions{MaxBytes: 16 << 10, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	l = l2
	l.Load("g", nil)
	evs, _, err = l.Read(context.Background(), "g", false)
	if err != nil {
		t.Fatal(err)
	}
	check("after a restart", evs)
	// Removed: read from the files.
	l.Record(op("deleted", 1003))
	l.Close("g")
	evs, _, err = l.Read(context.Background(), "g", false)
	if err != nil {
		t.Fatal(err)
	}
	check("removed", evs)

	// The positive control: with the guest lines in the old shared stream,
	// that flood pushes everything else out of a 1000-event ring.
	old := New(0)
	old.Open("h", nil)
	old.lineBurst = flood * 2
	old.Record(api.Event{Session: "h", Kind: api.EventKindDNS, Action: "allowed", Detail: map[string]any{"name": "first.example."}})
	for range flood {
		old.RecordAsync(api.Event{Session: "h", Kind: api.EventKindDNS, Action: "denied"})
	}
	for _, ev := range old.Recorded("h") {
		if ev.Detail["name"] == "first.example." {
			t.Error("the control: a 100,000-line flood left the first line in a 1000-line sample")
		}
	}
}
