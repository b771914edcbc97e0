package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// defaultEventCapacity bounds each session's ring when NewEventLog is given
// no capacity. Rings grow on demand up to their bound, so an idle session
// costs a few events, not the bound: 1000 live sessions stay cheap.
const defaultEventCapacity = 1000

// defaultSubscriberBuffer is a follower's channel capacity.
const defaultSubscriberBuffer = 64

// EventLog keeps each session's recent events in a bounded ring and fans
// new ones out to followers. Record never blocks: a follower whose channel
// is full misses events and, as soon as it has room again, receives one
// marker event of kind "dropped" counting what it missed. mu guards every
// field and every ring; channels are sent to and closed only under mu.
type EventLog struct {
	mu       sync.Mutex
	capacity int
	buffer   int
	sessions map[string]*eventRing
}

// eventRing is one session's events: buf holds up to capacity events, the
// oldest at start once full.
type eventRing struct {
	buf   []api.Event
	start int
	subs  map[*subscriber]struct{}
}

type subscriber struct {
	ch      chan api.Event
	dropped int
}

// NewEventLog returns a log keeping capacity events per session (<= 0 means
// defaultEventCapacity).
func NewEventLog(capacity int) *EventLog {
	if capacity <= 0 {
		capacity = defaultEventCapacity
	}
	return &EventLog{capacity: capacity, buffer: defaultSubscriberBuffer, sessions: map[string]*eventRing{}}
}

func (l *EventLog) ringLocked(session string) *eventRing {
	r := l.sessions[session]
	if r == nil {
		r = &eventRing{}
		l.sessions[session] = r
	}
	return r
}

// Record appends ev to its session's ring (ev.Session) and sends it to the
// session's followers without blocking.
func (l *EventLog) Record(ev api.Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.ringLocked(ev.Session)
	if len(r.buf) < l.capacity {
		r.buf = append(r.buf, ev)
	} else {
		r.buf[r.start] = ev
		r.start = (r.start + 1) % len(r.buf)
	}
	for s := range r.subs {
		if s.dropped > 0 {
			marker := api.Event{Time: ev.Time, Session: ev.Session, Kind: api.EventKindDropped,
				Detail: map[string]any{"count": s.dropped}}
			select {
			case s.ch <- marker:
				s.dropped = 0
			default:
				s.dropped++
				continue
			}
		}
		select {
		case s.ch <- ev:
		default:
			s.dropped++
		}
	}
}

// Recorded returns a copy of a session's events, oldest first.
func (l *EventLog) Recorded(session string) []api.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recordedLocked(session)
}

func (l *EventLog) recordedLocked(session string) []api.Event {
	r := l.sessions[session]
	if r == nil {
		return []api.Event{}
	}
	out := make([]api.Event, 0, len(r.buf))
	out = append(out, r.buf[r.start:]...)
	return append(out, r.buf[:r.start]...)
}

// Subscribe returns a channel of the session's new events and a cancel
// function that unsubscribes and closes it (idempotent). The channel is
// also closed by Close(session).
func (l *EventLog) Subscribe(session string) (<-chan api.Event, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.subscribeLocked(session)
}

func (l *EventLog) subscribeLocked(session string) (<-chan api.Event, func()) {
	r := l.ringLocked(session)
	if r.subs == nil {
		r.subs = map[*subscriber]struct{}{}
	}
	s := &subscriber{ch: make(chan api.Event, l.buffer)}
	r.subs[s] = struct{}{}
	cancel := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		// The ring may have been closed (and a new one made) since.
		if cur := l.sessions[session]; cur != nil {
			if _, ok := cur.subs[s]; ok {
				delete(cur.subs, s)
				close(s.ch)
			}
		}
	}
	return s.ch, cancel
}

// Follow returns the recorded events and a channel of the ones after them,
// with no gap and no duplicate between the two. The channel is closed when
// ctx ends or the session is closed. It is what Engine.Events needs.
func (l *EventLog) Follow(ctx context.Context, session string) ([]api.Event, <-chan api.Event) {
	l.mu.Lock()
	recorded := l.recordedLocked(session)
	ch, cancel := l.subscribeLocked(session)
	l.mu.Unlock()
	go func() {
		<-ctx.Done()
		cancel()
	}()
	return recorded, ch
}

// Read is what Engine.Events returns for a known session: the recorded
// events and, with follow, the channel of later ones (nil without).
func (l *EventLog) Read(ctx context.Context, session string, follow bool) ([]api.Event, <-chan api.Event, error) {
	if !follow {
		return l.Recorded(session), nil, nil
	}
	recorded, ch := l.Follow(ctx, session)
	return recorded, ch, nil
}

// Close forgets a session's events and closes its followers' channels.
func (l *EventLog) Close(session string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.sessions[session]
	if r == nil {
		return
	}
	for s := range r.subs {
		close(s.ch)
	}
	delete(l.sessions, session)
}
