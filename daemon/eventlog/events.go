package eventlog

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// defaultEventCapacity bounds each session's ring when New is given
// no capacity. Rings grow on demand up to their bound, so an idle session
// costs a few events, not the bound: 1000 live sessions stay cheap.
const defaultEventCapacity = 1000

// defaultSubscriberBuffer is a follower's channel capacity.
const defaultSubscriberBuffer = 64

// Log keeps each live session's operator records (kind lifecycle)
// for the session's life and a bounded sample of its guest-driven events
// (dns, flow) with their exact counts (eventtally.go), fans new ones out to the session's followers and to the followers of
// every session, and (Open) persists every event to its session's
// file (eventStore). A ring exists from Open (create) or Load (adopt) to
// Close (delete); an event of a name without one (a refused create of a
// new name, a DNS answer racing a delete) goes to the file and to the
// followers of every session only. Record never blocks on a follower: a
// follower whose channel is full misses events and, as soon as it has
// room again, receives one marker event of kind "missed" counting them.
// The files are the store's writer's (eventstore.go); events are queued
// to it under mu, so each file's order is its ring's. mu guards every
// field and every ring; channels are sent to and closed only under mu.
type Log struct {
	mu       sync.Mutex
	capacity int
	buffer   int
	sessions map[string]*eventRing
	all      map[*subscriber]struct{} // followers of every session
	store    *eventStore              // nil: in memory only
	stop     chan struct{}            // ends the prune loop; nil without a store
	stopOnce sync.Once

	// lineRate and lineBurst are each session's sample budget
	// (guestLineRate, guestLineBurst; a test may raise them).
	lineRate, lineBurst float64
}

// eventRing is one session's events: buf holds up to capacity lines of
// guest-driven events (the sample), the oldest at start once full; ops the
// operator's records since the session's creation (the newest
// maxOperatorRecords of them; the file keeps all); tally the counts of
// the guest-driven events. labels are the session's, for the followers of
// every session that filter by label.
type eventRing struct {
	buf    []api.Event
	start  int
	ops    []api.Event
	tally  guestTally
	subs   map[*subscriber]struct{}
	labels map[string]string
}

// maxOperatorRecords bounds the operator records a live session keeps in
// memory (some 5 MiB); past it the oldest are read from its file only.
// They come only from API calls.
const maxOperatorRecords = 10000

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

// New returns a log keeping capacity events per session (<= 0 means
// defaultEventCapacity) in memory only.
func New(capacity int) *Log {
	if capacity <= 0 {
		capacity = defaultEventCapacity
	}
	return &Log{capacity: capacity, buffer: defaultSubscriberBuffer, lineRate: guestLineRate, lineBurst: guestLineBurst,
		sessions: map[string]*eventRing{}, all: map[*subscriber]struct{}{}}
}

// StoreOptions are the bounds of the persisted events.
type StoreOptions struct {
	MaxBytes  int64         // a session's file is rotated past it (<= 0: defaultEventFileBytes)
	Retention time.Duration // how long a removed session's files are kept (0: removed with it)
	Log       *slog.Logger  // nil: discard
	// Now is the prune's clock (nil: time.Now); a test moves it past the
	// retention.
	Now func() time.Time
}

// Open returns a log that also persists every event under dir
// (created 0700), and prunes the files of removed sessions past the
// retention every pruneInterval. Shutdown ends it.
func Open(dir string, capacity int, opts StoreOptions) (*Log, error) {
	st, err := openEventStore(dir, opts)
	if err != nil {
		return nil, err
	}
	l := New(capacity)
	l.store = st
	l.stop = make(chan struct{})
	go l.pruneLoop(pruneInterval(opts.Retention))
	return l, nil
}

// countsInterval is how often the counts of the sessions whose counts
// changed are written to their files: what a daemon killed loses of them.
const countsInterval = 2 * time.Second

func (l *Log) pruneLoop(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	c := time.NewTicker(countsInterval)
	defer c.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.Prune()
		case <-c.C:
			l.writeCounts()
		}
	}
}

// writeCounts queues the write of every changed session's counts.
func (l *Log) writeCounts() {
	if l.store == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, r := range l.sessions {
		l.writeCountsLocked(name, r)
	}
}

func (l *Log) writeCountsLocked(name string, r *eventRing) {
	if !r.tally.dirty {
		return
	}
	c := r.tally.snapshot()
	r.tally.dirty = false
	l.store.enqueue(storeOp{fn: func() { l.store.writeCountsLocked(name, c) }})
}

// Prune removes the files of sessions without a ring whose last event is
// older than the retention. The names with a ring are taken when it is
// called; a session created meanwhile has a fresh file, which is kept.
func (l *Log) Prune() {
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
func (l *Log) Shutdown() {
	if l.stop != nil {
		l.stopOnce.Do(func() { close(l.stop) })
	}
	l.writeCounts()
	if l.store != nil {
		l.store.shutdown()
	}
}

// DroppedWrites returns how many events were not written to their file
// because the writer's queue was full (or the log was shut down): they
// reached the rings and followers only.
func (l *Log) DroppedWrites() uint64 {
	if l.store == nil {
		return 0
	}
	return l.store.dropped.Load()
}

// Prepare has the writer open (make) the operator file of a session
// being created, beside the create's other work, so that its first record
// (Record, after Open) only appends. Abandon undoes it for a create that
// failed; Open takes it over.
func (l *Log) Prepare(session string) {
	if l.store != nil {
		// With done set (nobody waits on it): the writer runs it at once,
		// without the linger an op nobody waits for starts, which a
		// create's first record would have to sit out.
		l.store.enqueue(storeOp{fn: func() { l.store.prepareLocked(session) }, done: make(chan struct{})})
	}
}

// Abandon closes what Prepare opened, removing the file if nothing was
// written to it; it is queued before the failed create's record, which
// then finds no file as if Prepare had not run.
func (l *Log) Abandon(session string) {
	if l.store != nil {
		l.store.enqueue(storeOp{fn: func() { l.store.abandonLocked(session) }, quiet: true})
	}
}

// Open starts a session's ring, empty: a new session (a name used before
// starts afresh; its earlier events stay in its file).
func (l *Log) Open(session string, labels map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.openLocked(session, labels)
	// Its counts start afresh: an earlier session's counts file goes (no
	// file reads as zero counts), queued before the session's first event
	// and run with it, so a create that answered has it gone. Zero counts are not written:
	// a file is made once there is something to count (writeCounts), or
	// not at all.
	r.tally = guestTally{}
	if l.store != nil {
		l.store.enqueue(storeOp{fn: func() { l.store.removeCountsLocked(session) }, quiet: true})
	}
}

func (l *Log) openLocked(session string, labels map[string]string) *eventRing {
	r := l.sessions[session]
	if r == nil {
		r = &eventRing{}
		l.sessions[session] = r
	}
	r.labels = labels
	return r
}

// Load starts the ring of a session found again at start with its stored
// events since its last creation (its operator records, the newest
// capacity lines of the sample) and its counts, so its events read the
// same across a restart.
func (l *Log) Load(session string, labels map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.openLocked(session, labels)
	if l.store == nil {
		return
	}
	// Under mu, which the writer never takes: no event of the session is
	// recorded between the read and the ring.
	var (
		evs    []api.Event
		counts storedCounts
	)
	l.store.do(func() {
		evs, _ = l.store.readLocked(session)
		counts, _ = l.store.readCountsLocked(session)
	})
	evs = sinceCreation(evs)
	var guest []api.Event
	r.ops = nil
	for _, ev := range evs {
		if isGuestKind(ev.Kind) || ev.Kind == api.EventKindSummary {
			guest = append(guest, ev)
		} else {
			r.ops = append(r.ops, ev)
		}
	}
	if len(r.ops) > maxOperatorRecords {
		r.ops = r.ops[len(r.ops)-maxOperatorRecords:]
	}
	if len(guest) > l.capacity {
		guest = guest[len(guest)-l.capacity:]
	}
	r.buf, r.start = guest, 0
	r.tally.restore(counts)
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
func (l *Log) Record(ev api.Event) {
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
func (l *Log) RecordAsync(ev api.Event) { l.record(ev, false) }

// record counts a guest-driven event and spends the sample's budget on it
// (eventtally.go): one over the budget goes no further. Otherwise it
// appends ev to the ring, fans it out and queues its write, after the line
// reporting what the budget left out before it; it returns the channel
// closed once ev is written when wait is set and the write was queued.
func (l *Log) record(ev api.Event, wait bool) chan struct{} {
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	if l.store != nil && !wait {
		l.store.waitRoom()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.sessions[ev.Session]
	if r != nil && isGuestKind(ev.Kind) {
		r.tally.count(ev)
		// The drop log's unlogged summaries are summaries already (at most
		// one a second): they always pass.
		summary := ev.Kind == api.EventKindFlow && ev.Action == FlowActionUnlogged
		if !summary && !r.tally.take(time.Now(), l.lineRate, l.lineBurst) {
			return nil
		}
		if marker, ok := r.tally.unloggedEvent(ev.Session, ev.Time); ok {
			l.appendLocked(r, marker, false)
		}
	}
	return l.appendLocked(r, ev, wait)
}

// appendLocked queues ev's write, appends it to the ring r (nil: the name
// has none) and fans it out.
func (l *Log) appendLocked(r *eventRing, ev api.Event, wait bool) chan struct{} {
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
		switch {
		case !isGuestKind(ev.Kind) && ev.Kind != api.EventKindSummary:
			if len(r.ops) == maxOperatorRecords {
				r.ops = append(r.ops[:0:0], r.ops[1:]...)
			}
			r.ops = append(r.ops, ev)
		case len(r.buf) < l.capacity:
			r.buf = append(r.buf, ev)
		default:
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
func (l *Log) sendLocked(s *subscriber, ev api.Event) {
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

// Recorded returns a session's operator records and its sample of
// guest-driven events, merged oldest first (empty without a ring).
func (l *Log) Recorded(session string) []api.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recordedLocked(session)
}

func (l *Log) recordedLocked(session string) []api.Event {
	r := l.sessions[session]
	if r == nil {
		return []api.Event{}
	}
	guest := make([]api.Event, 0, len(r.buf))
	guest = append(guest, r.buf[r.start:]...)
	guest = append(guest, r.buf[:r.start]...)
	return mergeByTime(r.ops, guest)
}

// mergeByTime merges two lists each oldest first; at equal times a's
// event comes first.
func mergeByTime(a, b []api.Event) []api.Event {
	out := make([]api.Event, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if b[0].Time.Before(a[0].Time) {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	out = append(out, a...)
	return append(out, b...)
}

// summaryLocked is the counts line of a session with a ring.
func (l *Log) summaryLocked(session string) (api.Event, bool) {
	r := l.sessions[session]
	if r == nil {
		return api.Event{}, false
	}
	return summaryEvent(session, time.Now().UTC(), r.tally.snapshot()), true
}

// Subscribe returns a channel of the session's new events and a cancel
// function that unsubscribes and closes it (idempotent). The channel is
// also closed by Close(session); for a session without a ring it is
// closed already.
func (l *Log) Subscribe(session string) (<-chan api.Event, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.subscribeLocked(session)
}

func (l *Log) subscribeLocked(session string) (<-chan api.Event, func()) {
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
func (l *Log) Follow(ctx context.Context, session string) ([]api.Event, <-chan api.Event) {
	l.mu.Lock()
	recorded := l.recordedLocked(session)
	if sum, ok := l.summaryLocked(session); ok {
		recorded = append(recorded, sum)
	}
	ch, cancel := l.subscribeLocked(session)
	l.mu.Unlock()
	go func() {
		<-ctx.Done()
		cancel()
	}()
	return recorded, ch
}

// Read is what Engine.Events returns: for a session with a ring its
// events, ending with its counts line, and, with follow, the channel of
// later ones (nil without); for a removed session whose files are kept,
// the stored events and its counts line and, with follow, a closed
// channel; otherwise api.ErrNotFound.
func (l *Log) Read(ctx context.Context, session string, follow bool) ([]api.Event, <-chan api.Event, error) {
	l.mu.Lock()
	if l.sessions[session] == nil {
		l.mu.Unlock()
		var (
			evs    []api.Event
			counts storedCounts
			found  bool
			at     time.Time
		)
		if l.store != nil {
			// After every event queued so far: the files have them all.
			l.store.do(func() {
				evs, found = l.store.readLocked(session)
				counts, at = l.store.readCountsLocked(session)
			})
		}
		if !found {
			return nil, nil, fmt.Errorf("session %q: %w", session, api.ErrNotFound)
		}
		if len(evs) > 0 && evs[len(evs)-1].Time.After(at) {
			at = evs[len(evs)-1].Time // (the counts are written with the last record, or before)
		}
		evs = append(evs, summaryEvent(session, at.UTC(), counts))
		var ch chan api.Event
		if follow {
			ch = make(chan api.Event)
			close(ch)
		}
		return evs, ch, nil
	}
	if !follow {
		recorded := l.recordedLocked(session)
		sum, _ := l.summaryLocked(session)
		l.mu.Unlock()
		return append(recorded, sum), nil, nil
	}
	l.mu.Unlock()
	recorded, ch := l.Follow(ctx, session)
	return recorded, ch, nil
}

// ReadAll is what Engine.AllEvents returns: the rings of the sessions
// carrying key=value (every ring when key is ""), merged oldest first,
// and, with follow, a channel of every such session's later events, with
// no gap and no duplicate, closed when ctx ends.
func (l *Log) ReadAll(ctx context.Context, key, value string, follow bool) ([]api.Event, <-chan api.Event) {
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
// kept for the retention. It returns once every event queued before it is
// written (the sync and close follow on the writer, unwaited for).
func (l *Log) Close(session string) {
	done := make(chan struct{})
	l.mu.Lock()
	if r := l.sessions[session]; r != nil && l.store != nil {
		// Its last counts, if they changed since written (otherwise the
		// file has them, or there is none: zero counts).
		l.writeCountsLocked(session, r)
	}
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
