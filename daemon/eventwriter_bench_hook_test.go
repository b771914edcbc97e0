package daemon

import "github.com/enforcerd/enforcerd/api"

// recordDNS is how the daemon records a DNS decision.
func recordDNS(l *EventLog, ev api.Event) { l.RecordAsync(ev) }

// drainEvents waits until the writer wrote everything queued.
func drainEvents(l *EventLog) { l.store.do(func() {}) }
