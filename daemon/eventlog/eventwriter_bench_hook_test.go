package eventlog

import "github.com/enforcerd/enforcerd/api"

// recordDNS is how the daemon records a DNS decision.
func recordDNS(l *Log, ev api.Event) { l.RecordAsync(ev) }

// drainEvents waits until the writer wrote everything queued.
func drainEvents(l *Log) { l.store.do(func() {}) }
