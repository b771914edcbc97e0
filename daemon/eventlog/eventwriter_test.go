package eventlog

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// fileLines returns the NDJSON lines of a session's file.
func fileLines(t *testing.T, dir, name string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name+eventFileExt))
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return strings.Count(string(b), "\n")
}

// TestEventWriterAsync: a queued event is in the ring at once and on file
// within milliseconds, in order with the waited-for ones; a removed
// session's read sees its events still queued at the removal.
func TestEventWriterAsync(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, 0, StoreOptions{Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown()
	l.Open("a", nil)
	l.Record(testEvent("a", 1))
	for i := 2; i <= 50; i++ {
		l.RecordAsync(testEvent("a", i))
	}
	if got := len(l.Recorded("a")); got != 50 {
		t.Fatalf("ring has %d events right after recording, want 50", got)
	}
	deadline := time.Now().Add(time.Second)
	for fileLines(t, dir, "a") < 50 {
		if time.Now().After(deadline) {
			t.Fatalf("queued events not on file within 1 s: %d lines", fileLines(t, dir, "a"))
		}
		time.Sleep(time.Millisecond)
	}
	l.RecordAsync(testEvent("a", 51))
	l.Close("a") // the file is closed after the queued event
	evs, _, err := l.Read(context.Background(), "a", false)
	if err != nil || len(evs) != 52 {
		t.Fatalf("read of the removed session: %d events, %v; want 51 and the counts", len(evs), err)
	}
	if sum := evs[51]; sum.Action != SummaryActionCounts || sum.Detail["dns_51"] != uint64(1) {
		t.Errorf("the removed session's counts: %+v", sum)
	}
	evs = evs[:51]
	for i, ev := range evs {
		if ev.Action != testEvent("a", i+1).Action {
			t.Fatalf("out of order at %d: %s", i, actionsOf(evs))
		}
	}
	if l.DroppedWrites() != 0 {
		t.Errorf("dropped %d writes without a full queue", l.DroppedWrites())
	}
}

// TestEventWriterFullQueue: with the writer held up, queued events past
// maxQueuedEvents wait maxRoomWait each and are then not written but
// counted (and reach the ring), a waited-for event still is, and Shutdown
// drains what was queued.
func TestEventWriterFullQueue(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, maxQueuedEvents+200, StoreOptions{Retention: time.Hour, MaxBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	l.lineBurst = 1 << 20 // every line into the queue: this test is the writer's
	l.Open("f", nil)
	hold, held := make(chan struct{}), make(chan struct{})
	l.store.enqueue(storeOp{fn: func() { close(held); <-hold }})
	<-held
	const extra = 100
	for i := range maxQueuedEvents {
		l.RecordAsync(api.Event{Session: "f", Kind: api.EventKindDNS, Action: "allowed", Time: time.Unix(int64(i+1), 0).UTC()})
	}
	start := time.Now()
	for i := range extra {
		l.RecordAsync(api.Event{Session: "f", Kind: api.EventKindDNS, Action: "allowed", Time: time.Unix(int64(maxQueuedEvents+i+1), 0).UTC()})
	}
	if took := time.Since(start); took < extra*maxRoomWait || took > extra*maxRoomWait+time.Second {
		t.Errorf("%d events into a full queue took %s, want about %s each (the bounded wait)", extra, took, maxRoomWait)
	}
	if got := l.DroppedWrites(); got != extra {
		t.Errorf("dropped %d writes, want %d", got, extra)
	}
	if got := len(l.Recorded("f")); got != maxQueuedEvents+extra {
		t.Errorf("ring has %d events, want all %d", got, maxQueuedEvents+extra)
	}
	waited := make(chan struct{})
	go func() { l.Record(testEvent("f", 1<<30)); close(waited) }()
	select {
	case <-waited:
		t.Fatal("a waited-for event returned before the held writer wrote it")
	case <-time.After(20 * time.Millisecond):
	}
	close(hold)
	<-waited
	l.Shutdown()
	if got := fileLines(t, dir, "f"); got != maxQueuedEvents+1 {
		t.Errorf("file has %d lines, want %d (the queue and the waited-for event)", got, maxQueuedEvents+1)
	}
	// After Shutdown: kept in memory only, counted.
	l.RecordAsync(testEvent("f", 2))
	if got := l.DroppedWrites(); got != extra+1 {
		t.Errorf("after shutdown: dropped %d, want %d", got, extra+1)
	}
}

// TestEventStoreRotates: a file past its bound becomes .1 (one kept), and
// reading gives the newest events of both in order.
func TestEventStoreRotates(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, 0, StoreOptions{MaxBytes: 1000, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown()
	l.Open("r", nil)
	for i := range 100 {
		l.Record(testEvent("r", i+1))
	}
	l.Record(api.Event{Session: "r", Kind: api.EventKindLifecycle, Action: "created", Time: time.Unix(0, 1).UTC()})
	for _, f := range []string{"r.ndjson", "r.ndjson.1"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Size() > 1000 {
			t.Errorf("%s: %v", f, err)
		}
	}
	evs, _ := l.store.read("r")
	if len(evs) < 10 || len(evs) >= 100 || evs[len(evs)-1].Action != "100" {
		t.Fatalf("read %d events, last %+v", len(evs), evs[len(evs)-1])
	}
	for i := 1; i < len(evs); i++ {
		if !evs[i-1].Time.Before(evs[i].Time) {
			t.Fatalf("out of order at %d: %v", i, actionsOf(evs))
		}
	}
	// A torn last line (a machine crash mid-write) is skipped.
	f, _ := os.OpenFile(filepath.Join(dir, "r.ndjson"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"time":"2025-`)
	f.Close()
	if again, _ := l.store.read("r"); len(again) != len(evs) {
		t.Errorf("with a torn line: %d events, want %d", len(again), len(evs))
	}
}

func actionsOf(evs []api.Event) string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Action)
	}
	return strings.Join(out, " ")
}

// TestEventCountsFileOnlyWhenCounted: a session with nothing counted
// writes no counts file, at its removal either, and reads zero counts; a
// new session of a name whose predecessor counted something starts from
// zero (the earlier file is gone once its first event is written), and its
// own counts are written at its removal (the positive control).
func TestEventCountsFileOnlyWhenCounted(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, 0, StoreOptions{Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown()
	counts := filepath.Join(dir, operatorDir, "a"+countsFileExt)
	lifecycle := func(i int) api.Event {
		return api.Event{Time: time.Unix(int64(i), 0).UTC(), Session: "a", Kind: api.EventKindLifecycle, Action: fmt.Sprint("op", i)}
	}
	l.Open("a", nil)
	l.Record(lifecycle(1))
	l.Close("a")
	if _, err := os.Stat(counts); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("counts file of a session with nothing counted: %v, want none", err)
	}
	evs, _, err := l.Read(context.Background(), "a", false)
	if err != nil || len(evs) != 2 || evs[1].Action != SummaryActionCounts || evs[1].Detail["unlogged"] != uint64(0) || len(evs[1].Detail) != 1 {
		t.Fatalf("read of the removed session: %+v, %v; want its record and zero counts", evs, err)
	}

	l.Open("a", nil)
	l.Record(lifecycle(2))
	l.Record(testEvent("a", 3)) // a dns event: counted
	l.Close("a")
	if _, err := os.Stat(counts); err != nil {
		t.Fatalf("counts file of a session that counted: %v", err)
	}

	l.Open("a", nil)
	l.Record(lifecycle(4))
	if _, err := os.Stat(counts); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the predecessor's counts file after the new session's first event: %v, want removed", err)
	}
	l.Close("a")
	evs, _, err = l.Read(context.Background(), "a", false)
	if err != nil || len(evs) == 0 || evs[len(evs)-1].Detail["dns_3"] != nil {
		t.Fatalf("read of the new session: %+v, %v; want no counts of its predecessor", evs, err)
	}
}

// TestEventPrepareAbandon: Prepare makes a create's operator file ahead
// of its first record, which lands in it; a failed create's Abandon
// removes the still-empty file, so its error record finds none and is not
// written (as without Prepare); a name whose file holds records keeps it.
func TestEventPrepareAbandon(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, 0, StoreOptions{Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Shutdown()
	opFile := func(name string) string { return filepath.Join(dir, operatorDir, name+eventFileExt) }
	failed := func(name string) api.Event {
		return api.Event{Session: name, Kind: api.EventKindLifecycle, Action: "create_failed", Detail: map[string]any{"outcome": "error"}}
	}
	created := func(name string) api.Event {
		return api.Event{Session: name, Kind: api.EventKindLifecycle, Action: "created", Detail: map[string]any{"outcome": "ok"}}
	}

	l.Prepare("ok")
	l.Open("ok", nil)
	l.Record(created("ok"))
	if b, err := os.ReadFile(opFile("ok")); err != nil || !strings.Contains(string(b), `"created"`) {
		t.Fatalf("prepared file after the first record: %q, %v", b, err)
	}

	l.Prepare("bad")
	l.Abandon("bad")
	l.Record(failed("bad"))
	if _, err := os.Stat(opFile("bad")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file of a failed create of a new name: %v, want none", err)
	}

	l.Close("ok") // its file stays (retention)
	l.Prepare("ok")
	l.Abandon("ok")
	l.Record(failed("ok"))
	if b, err := os.ReadFile(opFile("ok")); err != nil || !strings.Contains(string(b), `"create_failed"`) {
		t.Fatalf("file of a failed create of a name with records: %q, %v; want both records", b, err)
	}
}
