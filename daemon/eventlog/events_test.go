package eventlog

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

func testEvent(session string, i int) api.Event {
	return api.Event{Time: time.Unix(int64(i), 0).UTC(), Session: session, Kind: api.EventKindDNS, Action: fmt.Sprint(i)}
}

func eventActions(evs []api.Event) []string {
	out := []string{}
	for _, e := range evs {
		out = append(out, e.Action)
	}
	return out
}

func TestEventRing(t *testing.T) {
	l := New(3)
	l.Open("a", nil)
	l.Open("b", nil)
	l.Open("c", nil)
	for i := 1; i <= 5; i++ {
		l.Record(testEvent("a", i))
	}
	l.Record(testEvent("b", 9))
	if got := eventActions(l.Recorded("a")); !reflect.DeepEqual(got, []string{"3", "4", "5"}) {
		t.Fatalf("ring a: %v", got)
	}
	if got := eventActions(l.Recorded("b")); !reflect.DeepEqual(got, []string{"9"}) {
		t.Fatalf("ring b: %v", got)
	}
	if got := l.Recorded("none"); got == nil || len(got) != 0 {
		t.Fatalf("unknown session: %#v", got)
	}
	// Recorded is a copy.
	r := l.Recorded("a")
	r[0].Action = "x"
	if l.Recorded("a")[0].Action != "3" {
		t.Fatal("Recorded shares the ring")
	}
	// A zero time is stamped.
	l.Record(api.Event{Session: "c", Kind: api.EventKindDNS})
	if l.Recorded("c")[0].Time.IsZero() {
		t.Fatal("time not stamped")
	}
	l.Close("a")
	l.Close("a")
	if len(l.Recorded("a")) != 0 {
		t.Fatal("closed session still has events")
	}
	if New(0).capacity != defaultEventCapacity {
		t.Fatal("default capacity")
	}
}

func recvEvent(t *testing.T, ch <-chan api.Event) api.Event {
	t.Helper()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatal("channel closed")
		}
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
	}
	return api.Event{}
}

func TestEventFollow(t *testing.T) {
	l := New(10)
	l.Open("a", nil)
	l.Open("b", nil)
	l.Record(testEvent("a", 1))
	l.Record(testEvent("a", 2))
	ctx, cancel := context.WithCancel(context.Background())
	rec, ch := l.Follow(ctx, "a")
	if got := eventActions(rec); !reflect.DeepEqual(got, []string{"1", "2", SummaryActionCounts}) {
		t.Fatalf("recorded %v", got)
	}
	l.Record(testEvent("b", 7)) // another session: not delivered
	l.Record(testEvent("a", 3))
	if e := recvEvent(t, ch); e.Action != "3" {
		t.Fatalf("followed %v", e)
	}
	cancel() // ctx end closes the channel
	for range ch {
	}

	// Read without follow: no channel.
	got, none, err := l.Read(context.Background(), "a", false)
	if err != nil || none != nil || len(got) != 4 || got[3].Kind != api.EventKindSummary || got[3].Detail["dns_3"] != uint64(1) {
		t.Fatalf("Read: %v %v %v", got, none, err)
	}
	// Read with follow; Close(session) closes it.
	_, ch2, _ := l.Read(context.Background(), "a", true)
	l.Close("a")
	if _, ok := <-ch2; ok {
		t.Fatal("channel open after Close")
	}

	// Subscribe's cancel is idempotent and closes the channel.
	l.Open("a", nil)
	ch3, unsub := l.Subscribe("a")
	unsub()
	unsub()
	if _, ok := <-ch3; ok {
		t.Fatal("channel open after cancel")
	}
}

// TestEventSlowFollower: Record never blocks; a full follower drops and
// later gets one marker counting what it missed, then new events.
func TestEventSlowFollower(t *testing.T) {
	l := New(1000)
	l.Open("a", nil)
	l.buffer = 2
	ch, cancel := l.Subscribe("a")
	defer cancel()
	fast, cancelFast := l.Subscribe("a")
	defer cancelFast()
	done := make(chan struct{})
	go func() {
		for i := 1; i <= 5; i++ {
			l.Record(testEvent("a", i))
			if i <= 2 {
				recvEvent(t, fast) // keep the fast follower drained only at first
			}
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Record blocked on a slow follower")
	}
	if got := []string{recvEvent(t, ch).Action, recvEvent(t, ch).Action}; !reflect.DeepEqual(got, []string{"1", "2"}) {
		t.Fatalf("slow follower got %v", got)
	}
	l.Record(testEvent("a", 6)) // room again: the marker first, then 6
	m := recvEvent(t, ch)
	if m.Kind != api.EventKindMissed || m.Detail["count"] != 3 {
		t.Fatalf("marker %+v", m)
	}
	if e := recvEvent(t, ch); e.Action != "6" {
		t.Fatalf("after marker %+v", e)
	}
	// The ring itself lost nothing.
	if n := len(l.Recorded("a")); n != 6 {
		t.Fatalf("ring holds %d", n)
	}
}
