package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
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

// EventLog keeps each live session's recent events in a bounded ring,
// fans new ones out to the session's followers and to the followers of
// every session, and (OpenEventLog) persists every event to its session's
// file (eventStore). A ring exists from Open (create) or Load (adopt) to
// Close (delete); an event of a name without one (a refused create of a
// new name, a DNS answer racing a delete) goes to the file and to the
// followers of every session only. Record never blocks on a follower: a
// follower whose channel is full misses events and, as soon as it has
// room again, receives one marker event of kind "missed" counting them.
// The files are the store's writer's (eventstore.go); events are queued
// to it under mu, so each file's order is its ring's. mu guards every
// field and every ring; channels are sent to and closed only under mu.
type EventLog struct {
	mu       sync.Mutex
	capacity int
	buffer   int
	sessions map[string]*eventRing
	all      map[*subscriber]struct{} // followers of every session
	store    *eventStore              // nil: in memory only
	stop     chan struct{}            // ends the prune loop; nil without a store
	stopOnce sync.Once
}

// eventRing is one session's events: buf holds up to capacity events, the
// oldest at start once full. labels are the session's, for the followers
// of every session that filter by label.
type eventRing struct {
	buf    []api.Event
	start  int
	subs   map[*subscriber]struct{}
	labels map[string]string
}

// subscriber is one follower. A follower of every session keeps only
// the events of sessions carrying key=value (every one when key is "").
type subscriber struct {
	ch         chan api.Event
	missed     int
	key, value string
}

func (s *subscriber) wants(labels map[string]string) bool {
	if s.key == "" {
		return true
	}
	v, ok := labels[s.key]
	return ok && v == s.value
}

// NewEventLog returns a log keeping capacity events per session (<= 0 means
// defaultEventCapacity) in memory only.
func NewEventLog(capacity int) *EventLog {
	if capacity <= 0 {
		capacity = defaultEventCapacity
	}
	return &EventLog{capacity: capacity, buffer: defaultSubscriberBuffer,
		sessions: map[string]*eventRing{}, all: map[*subscriber]struct{}{}}
}

// EventStoreOptions are the bounds of the persisted events.
type EventStoreOptions struct {
	MaxBytes  int64         // a session's file is rotated past it (<= 0: defaultEventFileBytes)
	Retention time.Duration // how long a removed session's files are kept (0: removed with it)
	Log       *slog.Logger  // nil: discard
}

// OpenEventLog returns a log that also persists every event under dir
// (created 0700), and prunes the files of removed sessions past the
// retention every pruneInterval. Shutdown ends it.
func OpenEventLog(dir string, capacity int, opts EventStoreOptions) (*EventLog, error) {
	st, err := openEventStore(dir, opts)
	if err != nil {
		return nil, err
	}
	l := NewEventLog(capacity)
	l.store = st
	l.stop = make(chan struct{})
	go l.pruneLoop(pruneInterval(opts.Retention))
	return l, nil
}

func (l *EventLog) pruneLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.Prune()
		}
	}
}

// Prune removes the files of sessions without a ring whose last event is
// older than the retention. The names with a ring are taken when it is
// called; a session created meanwhile has a fresh file, which is kept.
func (l *EventLog) Prune() {
	if l.store == nil {
		return
	}
	l.mu.Lock()
	live := make(map[string]bool, len(l.sessions))
	for name := range l.sessions {
		live[name] = true
	}
	l.mu.Unlock()
	l.store.do(func() { l.store.pruneLocked(func(name string) bool { return live[name] }) })
}

// Shutdown stops the prune loop, lets the writer write everything queued,
// and syncs and closes the open files. The log must not be used after: an
// event recorded after is kept in memory only, and counted as not
// written.
func (l *EventLog) Shutdown() {
	if l.stop != nil {
		l.stopOnce.Do(func() { close(l.stop) })
	}
	if l.store != nil {
		l.store.shutdown()
	}
}

// DroppedWrites returns how many events were not written to their file
// because the writer's queue was full (or the log was shut down): they
// reached the rings and followers only.
func (l *EventLog) DroppedWrites() uint64 {
	if l.store == nil {
		return 0
	}
	return l.store.dropped.Load()
}

// Open starts a session's ring, empty: a new session (a name used before
// starts afresh; its earlier events stay in its file).
func (l *EventLog) Open(session string, labels map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.openLocked(session, labels)
}

func (l *EventLog) openLocked(session string, labels map[string]string) *eventRing {
	r := l.sessions[session]
	if r == nil {
		r = &eventRing{}
		l.sessions[session] = r
	}
	r.labels = labels
	return r
}

// Load starts the ring of a session found again at start with its stored
// events since its last creation (the newest capacity of them), so its
// events read the same across a restart.
func (l *EventLog) Load(session string, labels map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.openLocked(session, labels)
	if l.store == nil {
		return
	}
	// Under mu, which the writer never takes: no event of the session is
	// recorded between the read and the ring.
	evs, _ := l.store.read(session)
	evs = sinceCreation(evs)
	if len(evs) > l.capacity {
		evs = evs[len(evs)-l.capacity:]
	}
	r.buf, r.start = append([]api.Event(nil), evs...), 0
}

// sinceCreation keeps the events of a name's current incarnation: from
// its last "created" event, or after its last "deleted" one when the
// "created" was rotated away.
func sinceCreation(evs []api.Event) []api.Event {
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind != api.EventKindLifecycle {
			continue
		}
		switch evs[i].Action {
		case "created":
			return evs[i:]
		case "deleted":
			return evs[i+1:]
		}
	}
	return evs
}

// Record appends ev to its session's ring (ev.Session), sends it to the
// followers without blocking, and returns once the writer wrote it to the
// session's file: an API call's event is on file before the call answers,
// so a daemon killed after the answer has it.
func (l *EventLog) Record(ev api.Event) {
	if done := l.record(ev, true); done != nil {
		<-done
	}
}

// RecordAsync is Record without the wait for the write: for the events on
// a hot path (a DNS answer, a flow drop), which must not wait for a
// write(2). The ring and the followers have the event at once; the file
// within the writer's latency (see eventstore.go), or never when its queue
// stays full for maxRoomWait, the most RecordAsync waits (counted:
// DroppedWrites).
func (l *EventLog) RecordAsync(ev api.Event) { l.record(ev, false) }

// record appends ev to the ring, fans it out and queues its write; it
// returns the channel closed once written when wait is set and the write
// was queued.
func (l *EventLog) record(ev api.Event, wait bool) chan struct{} {
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	if l.store != nil && !wait {
		l.store.waitRoom()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.sessions[ev.Session]
	var done chan struct{}
	if l.store != nil {
		// Queued under mu: the file's order is the ring's.
		op := storeOp{ev: ev, keepOpen: r != nil}
		if wait {
			op.done = make(chan struct{})
		}
		if l.store.enqueue(op) {
			done = op.done
		}
	}
	labels := requestLabels(ev)
	if r != nil {
		if len(r.buf) < l.capacity {
			r.buf = append(r.buf, ev)
		} else {
			r.buf[r.start] = ev
			r.start = (r.start + 1) % len(r.buf)
		}
		for s := range r.subs {
			l.sendLocked(s, ev)
		}
		labels = r.labels
	}
	for s := range l.all {
		if s.wants(labels) {
			l.sendLocked(s, ev)
		}
	}
	return done
}

// requestLabels are the labels a create event carries (detail.labels),
// which is all a follower filtering by label knows of a name without a
// ring.
func requestLabels(ev api.Event) map[string]string {
	labels, _ := ev.Detail["labels"].(map[string]string)
	return labels
}

// sendLocked sends ev to s without blocking, preceded by the marker of
// what s missed when it has room again.
func (l *EventLog) sendLocked(s *subscriber, ev api.Event) {
	if s.missed > 0 {
		marker := api.Event{Time: ev.Time, Session: ev.Session, Kind: api.EventKindMissed,
			Detail: map[string]any{"count": s.missed}}
		select {
		case s.ch <- marker:
			s.missed = 0
		default:
			s.missed++
			return
		}
	}
	select {
	case s.ch <- ev:
	default:
		s.missed++
	}
}

// Recorded returns a copy of a session's ring, oldest first (empty
// without one).
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
// also closed by Close(session); for a session without a ring it is
// closed already.
func (l *EventLog) Subscribe(session string) (<-chan api.Event, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.subscribeLocked(session)
}

func (l *EventLog) subscribeLocked(session string) (<-chan api.Event, func()) {
	s := &subscriber{ch: make(chan api.Event, l.buffer)}
	r := l.sessions[session]
	if r == nil {
		close(s.ch)
		return s.ch, func() {}
	}
	if r.subs == nil {
		r.subs = map[*subscriber]struct{}{}
	}
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
// ctx ends or the session is closed.
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

// Read is what Engine.Events returns: for a session with a ring its
// events and, with follow, the channel of later ones (nil without); for a
// removed session whose file is kept, the stored events and, with follow,
// a closed channel; otherwise api.ErrNotFound.
func (l *EventLog) Read(ctx context.Context, session string, follow bool) ([]api.Event, <-chan api.Event, error) {
	l.mu.Lock()
	if l.sessions[session] == nil {
		l.mu.Unlock()
		var (
			evs   []api.Event
			found bool
		)
		if l.store != nil {
			// After every event queued so far: the file has them all.
			evs, found = l.store.read(session)
		}
		if !found {
			return nil, nil, fmt.Errorf("session %q: %w", session, api.ErrNotFound)
		}
		var ch chan api.Event
		if follow {
			ch = make(chan api.Event)
			close(ch)
		}
		return evs, ch, nil
	}
	l.mu.Unlock()
	if !follow {
		return l.Recorded(session), nil, nil
	}
	recorded, ch := l.Follow(ctx, session)
	return recorded, ch, nil
}

// ReadAll is what Engine.AllEvents returns: the rings of the sessions
// carrying key=value (every ring when key is ""), merged oldest first,
// and, with follow, a channel of every such session's later events, with
// no gap and no duplicate, closed when ctx ends.
func (l *EventLog) ReadAll(ctx context.Context, key, value string, follow bool) ([]api.Event, <-chan api.Event) {
	s := &subscriber{ch: make(chan api.Event, l.buffer), key: key, value: value}
	l.mu.Lock()
	var out []api.Event
	for name, r := range l.sessions {
		if s.wants(r.labels) {
			out = append(out, l.recordedLocked(name)...)
		}
	}
	if follow {
		l.all[s] = struct{}{}
	}
	l.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	if out == nil {
		out = []api.Event{}
	}
	if !follow {
		return out, nil
	}
	go func() {
		<-ctx.Done()
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.all, s)
		close(s.ch)
	}()
	return out, s.ch
}

// Close ends a session's ring: its followers' channels are closed, its
// file is synced and closed (after its queued events are written), and
// kept for the retention. It returns once the file is closed.
func (l *EventLog) Close(session string) {
	done := make(chan struct{})
	l.mu.Lock()
	queued := l.store != nil && l.store.enqueue(storeOp{fn: func() { l.store.closeLocked(session) }, done: done})
	if r := l.sessions[session]; r != nil {
		for s := range r.subs {
			close(s.ch)
		}
		delete(l.sessions, session)
	}
	l.mu.Unlock()
	if queued {
		<-done
	}
}
