package eventlog

import (
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// BenchmarkEventLogRecordDNS is the DNS answer path's share of the event
// log: one decision recorded per answer, as daemon.Engine.recordDNSDecision does. The
// writer is let drain every 1024 events outside the timer (at most 1024
// queued: nothing is dropped), so the figure is the answer's cost only;
// "written" is the writer's own throughput, the time to record and write.
func BenchmarkEventLogRecordDNS(b *testing.B) {
	ev := api.Event{Session: "s", Kind: api.EventKindDNS, Action: "allowed", Detail: map[string]any{
		"name": "h1.allowed.test.", "type": "A", "addrs": []string{"198.18.1.1"}, "upstream": "198.18.0.53:5353", "upstream_ms": 0.2}}
	open := func(b *testing.B) *Log {
		l, err := Open(b.TempDir(), 0, StoreOptions{Retention: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		l.Open("s", nil)
		return l
	}
	b.Run("answer", func(b *testing.B) {
		l := open(b)
		defer l.Shutdown()
		for i := range b.N {
			ev.Time = time.Now()
			recordDNS(l, ev)
			if i%1024 == 1023 {
				b.StopTimer()
				drainEvents(l)
				b.StartTimer()
			}
		}
	})
	b.Run("written", func(b *testing.B) {
		l := open(b)
		for i := range b.N {
			ev.Time = time.Now()
			recordDNS(l, ev)
			if i%1024 == 1023 {
				drainEvents(l)
			}
		}
		l.Shutdown()
	})
}
