package eventlog

// The events' persistence, one api.Event per NDJSON line: a session's
// guest-driven events (the sample, eventtally.go) in
// <state-dir>/events/<name>.ndjson, rotated; its operator records in
// <state-dir>/events/operator/<name>.ndjson, never rotated (only API
// calls and the daemon write it, so no guest traffic can push a record
// out); its counts in <state-dir>/events/operator/<name>.counts.json,
// replaced whole every countsInterval while they change and when the
// session is removed after a change (a session with nothing counted has
// none: no file reads as zero counts; a new session removes its name's
// earlier one).
//
// One writer goroutine owns the files: Record queues an event (in the
// order of the rings) and the writer encodes and writes what is queued,
// each file's lines in one write(2), without fsync, so that no encoding
// and no write(2) is on a DNS answer's path. What it means for a daemon
// that is killed (kill -9, a crash):
//
//   - An event of an API call or of the daemon's own lifecycle (Record) is
//     acknowledged only once written: Record returns after the writer
//     wrote it, so the call's answer comes after the write, as before, and
//     a killed daemon loses none of them.
//   - A DNS decision or a flow drop (RecordAsync) is queued: the answer is
//     not held for the write. A killed daemon loses those still queued:
//     the writer's latency, writerLinger (1 ms, so that a burst is one
//     write) plus the write, a few milliseconds when the machine is
//     loaded. The ring has them at once, so readers see them in order
//     meanwhile.
//   - The queue is bounded (maxQueuedEvents). A queued event that finds it
//     full waits for room at most maxRoomWait (2 ms: the answer is held
//     that long at most), and is then not written (the ring and the
//     followers still have it): it is counted (Log.DroppedWrites) and
//     logged, at most once per dropLogInterval with the count since.
//
// A machine that goes down (power, a kernel crash) can lose what the
// kernel had not yet written back, at most the last few seconds (a file is
// synced when its session is removed, when it is rotated and at Shutdown,
// which drains the queue first). A torn last line is skipped when read.
//
// A guest file that would grow past maxBytes is renamed to
// <name>.ndjson.1 (replacing the one before) and started anew, so a name
// keeps at most twice maxBytes of samples. A removed session's files stay for the retention after
// their last event, readable through GET /v1/sessions/{name}/events, and
// are pruned at start and every pruneInterval.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/daemon/ledger"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// defaultEventFileBytes is where a session's event file is rotated.
const defaultEventFileBytes = 1 << 20

const (
	operatorDir      = "operator" // under the events directory
	countsFileExt    = ".counts.json"
	eventFileExt     = ".ndjson"
	eventRotatedExt  = ".ndjson.1"
	maxPruneInterval = time.Hour
	minPruneInterval = time.Minute
)

// pruneInterval is how often removed sessions' files are pruned: a tenth
// of the retention, within a minute and an hour.
func pruneInterval(retention time.Duration) time.Duration {
	return min(max(retention/10, minPruneInterval), maxPruneInterval)
}

// maxQueuedEvents bounds the events queued for the writer that no caller
// waits for (RecordAsync): about 600 bytes each, some 20 MiB at most. At a
// writer that keeps up (a batch per wake-up, one write(2) per file) the
// queue holds what arrived during one batch; it fills only when the writer
// gets too little CPU (8192 did, for a second, at 7000 answers a second on
// two cores at a load of 9).
const maxQueuedEvents = 32768

// maxRoomWait bounds how long a queued event waits for room in a full
// queue (the writer frees it all at once when it takes a batch) before it
// is dropped: the backpressure that gives the writer CPU when the answers
// outrun it, and the most a DNS answer is held for it.
const maxRoomWait = 2 * time.Millisecond

// dropLogInterval spaces the log lines about events not written.
const dropLogInterval = 10 * time.Second

// writerLinger is how long the writer lets queued events gather after it
// wakes, unless a caller waits for one: at a few thousand DNS answers a
// second, one write(2) per file every millisecond instead of one per
// event. It is the writer's latency for queued events.
const writerLinger = time.Millisecond

// maxWriteBatch bounds one write(2) of a file (a file is rotated between
// writes, so it stays within maxBytes too).
const maxWriteBatch = 64 << 10

// eventStore writes and reads the event files. Its writer goroutine owns
// the files: every file operation (an append, a read, a close, a prune) is
// a storeOp run by it in the order queued, so a read sees every event
// queued before it, and a close follows its session's last queued event.
// files holds the open files of the sessions with a ring; a name without
// one is opened, appended to and closed per batch. mu guards the queue
// fields; everything else belongs to the writer.
type eventStore struct {
	dir       string
	maxBytes  int64
	retention time.Duration
	log       *slog.Logger
	now       func() time.Time
	files     map[string]*eventFile
	failing   map[string]bool // names whose last write failed (logged once)

	mu       sync.Mutex
	pending  []storeOp
	queued   int  // appends in pending that nobody waits for
	waiting  int  // ops in pending that a caller waits for
	stopped  bool // Shutdown queued its last op: nothing is queued after
	wake     chan struct{}
	room     chan struct{} // closed (and replaced) when the writer takes a batch
	exited   chan struct{}
	dropped  atomic.Uint64
	lastDrop time.Time // when a drop was last logged
	unlogged uint64    // drops since that log line
}

// storeOp is one operation for the writer: an append of ev (keepOpen: its
// session has a ring, keep the file open), or fn. done, when not nil, is
// closed once it is done (once written, for an append).
type storeOp struct {
	ev       api.Event
	keepOpen bool
	fn       func()
	done     chan struct{}
	// quiet: queue it without waking the writer; it runs with the next
	// op that does (an op queued just before a waited-for event would
	// otherwise start the writer's linger, and the wait would sit it out).
	quiet bool
}

type eventFile struct {
	f    *os.File
	size int64
}

func openEventStore(dir string, opts StoreOptions) (*eventStore, error) {
	if err := os.MkdirAll(filepath.Join(dir, operatorDir), 0o700); err != nil {
		return nil, fmt.Errorf("create events directory %s: %w", dir, err)
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = defaultEventFileBytes
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &eventStore{dir: dir, maxBytes: opts.MaxBytes, retention: opts.Retention, log: opts.Log,
		now: opts.Now, files: map[string]*eventFile{}, failing: map[string]bool{},
		wake: make(chan struct{}, 1), room: make(chan struct{}), exited: make(chan struct{})}
	go s.writer()
	return s, nil
}

// enqueue queues op for the writer and reports whether it was: an append
// nobody waits for is refused when maxQueuedEvents are queued already
// (counted and logged), and everything after Shutdown. A caller that waits
// (done set) is never refused room: such calls are few, and each waits.
func (s *eventStore) enqueue(op storeOp) bool {
	s.mu.Lock()
	if s.stopped || (op.done == nil && op.fn == nil && s.queued >= maxQueuedEvents) {
		if op.fn == nil {
			s.dropLocked(op.ev)
		}
		s.mu.Unlock()
		return false
	}
	s.pending = append(s.pending, op)
	if op.done == nil && op.fn == nil {
		s.queued++
	}
	if op.done != nil {
		s.waiting++
	}
	s.mu.Unlock()
	if op.quiet {
		return true
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return true
}

// waitRoom waits, at most maxRoomWait, until the queue has room for an
// event nobody waits for. It is called without Log.mu (the order is
// the enqueue's, under it): a full queue at the enqueue still drops.
func (s *eventStore) waitRoom() {
	s.mu.Lock()
	if s.queued < maxQueuedEvents || s.stopped {
		s.mu.Unlock()
		return
	}
	room := s.room
	s.mu.Unlock()
	t := time.NewTimer(maxRoomWait)
	defer t.Stop()
	select {
	case <-room:
	case <-t.C:
	}
}

// dropLocked counts an event not written and logs the first drop and then
// at most one line per dropLogInterval with the count since the last.
func (s *eventStore) dropLocked(ev api.Event) {
	s.dropped.Add(1)
	s.unlogged++
	now := time.Now()
	if !s.lastDrop.IsZero() && now.Sub(s.lastDrop) < dropLogInterval {
		return
	}
	why := "the write queue is full"
	if s.stopped {
		why = "the event log is shut down"
	}
	s.log.Warn("events not persisted (they are kept in memory only): "+why, "count", s.unlogged,
		"total", s.dropped.Load(), "session", ev.Session, "kind", ev.Kind, "queue", maxQueuedEvents)
	s.lastDrop, s.unlogged = now, 0
}

// do runs fn on the writer, after everything queued before, and waits for
// it. After Shutdown it runs fn itself: the writer is gone, and so is
// every other user of the files.
func (s *eventStore) do(fn func()) {
	done := make(chan struct{})
	if !s.enqueue(storeOp{fn: fn, done: done}) {
		<-s.exited
		fn()
		return
	}
	<-done
}

// writer runs the queued operations in order until Shutdown's last one.
func (s *eventStore) writer() {
	defer close(s.exited)
	for {
		<-s.wake
		s.mu.Lock()
		linger := s.waiting == 0 && !s.stopped
		s.mu.Unlock()
		if linger {
			time.Sleep(writerLinger)
		}
		s.mu.Lock()
		ops, stopped := s.pending, s.stopped
		s.pending, s.queued, s.waiting = nil, 0, 0
		close(s.room)
		s.room = make(chan struct{})
		s.mu.Unlock()
		s.run(ops)
		if stopped {
			return
		}
	}
}

// run performs ops in order, each file's consecutive appends in one write.
func (s *eventStore) run(ops []storeOp) {
	b := newWriteBatch(s)
	for _, op := range ops {
		if op.fn != nil {
			b.flush()
			op.fn()
		} else {
			b.add(op.ev, op.keepOpen)
		}
		if op.done != nil {
			if op.fn == nil {
				b.flush() // its caller waits for the write
			}
			close(op.done)
		}
	}
	b.flush()
}

// writeBatch gathers encoded lines per file, in order, up to maxWriteBatch
// (and maxBytes) a write.
type writeBatch struct {
	s     *eventStore
	order []string
	lines map[string]*batchFile
	enc   *json.Encoder // for what appendEventJSON declines
	buf   bytes.Buffer
	line  []byte // appendEventJSON's reused buffer
}

type batchFile struct {
	buf      bytes.Buffer
	keepOpen bool
	first    api.Event // for the failure's log line
}

func newWriteBatch(s *eventStore) *writeBatch {
	b := &writeBatch{s: s, lines: map[string]*batchFile{}}
	b.enc = json.NewEncoder(&b.buf)
	b.enc.SetEscapeHTML(false)
	return b
}

func (b *writeBatch) add(ev api.Event, keepOpen bool) {
	if !b.s.wanted(ev, keepOpen) {
		return
	}
	name := fileKey(ev)
	b.buf.Reset()
	var ok bool
	if b.line, ok = appendEventJSON(b.line[:0], &ev); ok {
		b.buf.Write(b.line)
	} else if err := b.enc.Encode(ev); err != nil {
		b.s.failed(name, ev, err)
		return
	}
	bf := b.lines[name]
	if bf == nil {
		bf = &batchFile{first: ev}
		b.lines[name] = bf
		b.order = append(b.order, name)
	}
	limit := min(int64(maxWriteBatch), b.s.maxBytes)
	if bf.buf.Len() > 0 && int64(bf.buf.Len()+b.buf.Len()) > limit {
		b.s.append(name, bf.buf.Bytes(), bf.keepOpen, bf.first)
		bf.buf.Reset()
		bf.first = ev
	}
	bf.buf.Write(b.buf.Bytes())
	bf.keepOpen = bf.keepOpen || keepOpen
}

func (b *writeBatch) flush() {
	for _, name := range b.order {
		if bf := b.lines[name]; bf.buf.Len() > 0 {
			b.s.append(name, bf.buf.Bytes(), bf.keepOpen, bf.first)
		}
	}
	b.order = b.order[:0]
	clear(b.lines)
}

// fileKey names the file of an event, relative to the events directory
// and without its extension: the session name for guest-driven events and
// their summaries, operator/<name> for the operator's records.
func fileKey(ev api.Event) string {
	if isGuestKind(ev.Kind) || ev.Kind == api.EventKindSummary {
		return ev.Session
	}
	return operatorKey(ev.Session)
}

func operatorKey(name string) string { return operatorDir + "/" + name }

func isOperatorKey(key string) bool { return strings.HasPrefix(key, operatorDir+"/") }

// wanted reports whether ev goes to a file. A name that is not a session
// name has no file.
//
// A refused call on a name that has neither a session nor a file (a
// create that failed validation, an rm of an unknown name) is not written:
// any caller could otherwise make a file per name it invents. It still
// reaches the journal and the followers of every session's events.
func (s *eventStore) wanted(ev api.Event, keepOpen bool) bool {
	name := ev.Session
	if !sessionNameValid(name) {
		return false
	}
	if !keepOpen && s.files[fileKey(ev)] == nil && ev.Detail["outcome"] == "error" {
		_, err := os.Stat(s.path(name))
		_, oerr := os.Stat(s.path(operatorKey(name)))
		if errors.Is(err, os.ErrNotExist) && errors.Is(oerr, os.ErrNotExist) {
			return false
		}
	}
	return true
}

// append writes lines to name's file; keepOpen keeps the file open for
// the next (the session has a ring). A failure is logged once per name
// until a write succeeds again; the events still reached the ring and
// followers.
func (s *eventStore) append(name string, lines []byte, keepOpen bool, first api.Event) {
	if err := s.write(name, lines, keepOpen); err != nil {
		s.failed(name, first, err)
		return
	}
	delete(s.failing, name)
}

func (s *eventStore) failed(name string, ev api.Event, err error) {
	if !s.failing[name] {
		s.log.Error("persist event (it is kept in memory only)", "session", name, "kind", ev.Kind, "action", ev.Action, "err", err)
	}
	s.failing[name] = true
}

func (s *eventStore) path(name string) string { return filepath.Join(s.dir, name+eventFileExt) }

func (s *eventStore) openFile(name string) (*eventFile, error) {
	f, err := os.OpenFile(s.path(name), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &eventFile{f: f, size: fi.Size()}, nil
}

func (s *eventStore) write(name string, lines []byte, keepOpen bool) error {
	ef := s.files[name]
	if ef == nil {
		var err error
		if ef, err = s.openFile(name); err != nil {
			return err
		}
	}
	if ef.size > 0 && ef.size+int64(len(lines)) > s.maxBytes && !isOperatorKey(name) {
		// Rotate: the full file becomes .1 (replacing the one before).
		_ = ef.f.Sync()
		ef.f.Close()
		delete(s.files, name)
		if err := os.Rename(s.path(name), filepath.Join(s.dir, name+eventRotatedExt)); err != nil {
			return fmt.Errorf("rotate %s: %w", s.path(name), err)
		}
		var err error
		if ef, err = s.openFile(name); err != nil {
			return err
		}
	}
	if keepOpen {
		s.files[name] = ef
	} else {
		defer ef.f.Close()
	}
	n, err := ef.f.Write(lines)
	ef.size += int64(n)
	return err
}

// read returns a name's stored events (readLocked on the writer, after
// every event queued before).
func (s *eventStore) read(name string) ([]api.Event, bool) {
	var (
		evs   []api.Event
		found bool
	)
	s.do(func() { evs, found = s.readLocked(name) })
	return evs, found
}

// readLocked returns a name's stored events, oldest first, and whether it
// has any file. It runs on the writer (see read). Lines that do not decode (a line torn by a machine crash)
// are skipped.
func (s *eventStore) readLocked(name string) ([]api.Event, bool) {
	if !sessionNameValid(name) {
		return nil, false
	}
	var (
		out   []api.Event
		found bool
	)
	for _, p := range []string{s.path(operatorKey(name)), filepath.Join(s.dir, name+eventRotatedExt), s.path(name)} {
		f, err := os.Open(p)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				s.log.Warn("read stored events", "file", p, "err", err)
			}
			continue
		}
		found = true
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			var ev api.Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Session == name {
				out = append(out, ev)
			}
		}
		if err := sc.Err(); err != nil {
			s.log.Warn("read stored events", "file", p, "err", err)
		}
		f.Close()
	}
	if found && out == nil {
		out = []api.Event{}
	}
	// The operator's file and the guest files, each in order, merged.
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out, found
}

func (s *eventStore) countsPath(name string) string {
	return filepath.Join(s.dir, operatorDir, name+countsFileExt)
}

// writeCountsLocked replaces a name's counts file. It runs on the writer.
func (s *eventStore) writeCountsLocked(name string, c storedCounts) {
	if !sessionNameValid(name) {
		return
	}
	b, err := json.Marshal(c)
	if err == nil {
		tmp := s.countsPath(name) + ".tmp"
		if err = os.WriteFile(tmp, b, 0o600); err == nil {
			err = os.Rename(tmp, s.countsPath(name))
		}
	}
	if err != nil && !s.failing[name+countsFileExt] {
		s.log.Error("persist event counts (they are kept in memory only)", "session", name, "err", err)
		s.failing[name+countsFileExt] = true
	} else if err == nil {
		delete(s.failing, name+countsFileExt)
	}
}

// prepareLocked opens (making it if need be) a name's operator file and
// keeps it open for the session's first record. It runs on the writer.
func (s *eventStore) prepareLocked(name string) {
	key := operatorKey(name)
	if !sessionNameValid(name) || s.files[key] != nil {
		return
	}
	ef, err := s.openFile(key)
	if err != nil {
		return // the first record tries again, and reports it
	}
	s.files[key] = ef
}

// abandonLocked undoes prepareLocked for a create that failed: the file is
// closed, and removed if nothing was written to it (a failed create of a
// name with no file leaves none, see wanted). It runs on the writer.
func (s *eventStore) abandonLocked(name string) {
	key := operatorKey(name)
	ef := s.files[key]
	if ef == nil {
		return
	}
	ef.f.Close()
	delete(s.files, key)
	if ef.size == 0 {
		if err := os.Remove(s.path(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("remove stored events", "file", s.path(key), "err", err)
		}
	}
}

// removeCountsLocked removes a name's counts file, if any (an earlier
// session's, when a new one of the name starts). It runs on the writer.
func (s *eventStore) removeCountsLocked(name string) {
	if !sessionNameValid(name) {
		return
	}
	if err := os.Remove(s.countsPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("remove stored event counts", "file", s.countsPath(name), "err", err)
	}
}

// readCountsLocked reads a name's counts file, and when it was written
// (zero without one). It runs on the writer.
func (s *eventStore) readCountsLocked(name string) (storedCounts, time.Time) {
	var c storedCounts
	if !sessionNameValid(name) {
		return c, time.Time{}
	}
	p := s.countsPath(name)
	b, err := os.ReadFile(p)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("read stored event counts", "file", p, "err", err)
		}
		return c, time.Time{}
	}
	if err := json.Unmarshal(b, &c); err != nil {
		s.log.Warn("read stored event counts", "file", p, "err", err)
		return storedCounts{}, time.Time{}
	}
	fi, err := os.Stat(p)
	if err != nil {
		return c, time.Time{}
	}
	return c, fi.ModTime()
}

// closeLocked syncs and closes a name's open file; with no retention its
// files go at once. It runs on the writer.
//
// The files leave s.files at once (a later append of the name opens them
// anew) and every write queued before is done; the sync and close run as
// an op of their own queued behind, so Close, which waits for this op,
// does not wait for the disk (a session delete paid the fsync, ~1-3 ms).
// Files removed at once (no retention) are closed unsynced.
func (s *eventStore) closeLocked(name string) {
	var open []*os.File
	for _, key := range []string{name, operatorKey(name)} {
		if ef := s.files[key]; ef != nil {
			open = append(open, ef.f)
			delete(s.files, key)
		}
	}
	if s.retention <= 0 && sessionNameValid(name) {
		for _, f := range open {
			f.Close()
		}
		s.removeLocked(name)
		return
	}
	if len(open) == 0 {
		return
	}
	syncClose := func() {
		for _, f := range open {
			_ = f.Sync()
			f.Close()
		}
	}
	if !s.enqueue(storeOp{fn: syncClose}) {
		syncClose() // (the store is shutting down: nothing runs after its last op)
	}
}

func (s *eventStore) removeLocked(name string) {
	for _, p := range []string{s.path(name), filepath.Join(s.dir, name+eventRotatedExt), s.path(operatorKey(name)), s.countsPath(name),
		filepath.Join(s.dir, operatorDir, name+ledger.FileExt)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("remove stored events", "file", p, "err", err)
		}
	}
}

func (s *eventStore) closeAllLocked() {
	for name, ef := range s.files {
		_ = ef.f.Sync()
		ef.f.Close()
		delete(s.files, name)
	}
}

// shutdown queues the last op (every file synced and closed), waits for
// the writer to run it and everything queued before, and refuses what
// comes after.
func (s *eventStore) shutdown() {
	done := make(chan struct{})
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		<-s.exited
		return
	}
	s.pending = append(s.pending, storeOp{fn: s.closeAllLocked, done: done})
	s.waiting++
	s.stopped = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	<-done
	<-s.exited
}

// pruneLocked removes the files of the names that are not live whose
// newest file was last written more than the retention ago. It runs on
// the writer.
func (s *eventStore) pruneLocked(live func(string) bool) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		s.log.Warn("prune stored events", "dir", s.dir, "err", err)
		return
	}
	ops, err := os.ReadDir(filepath.Join(s.dir, operatorDir))
	if err != nil {
		s.log.Warn("prune stored events", "dir", filepath.Join(s.dir, operatorDir), "err", err)
	}
	newest := map[string]time.Time{}
	for _, ent := range append(ents, ops...) {
		name, ok := strings.CutSuffix(ent.Name(), eventRotatedExt)
		if !ok {
			name, ok = strings.CutSuffix(ent.Name(), ledger.FileExt)
		}
		if !ok {
			name, ok = strings.CutSuffix(ent.Name(), countsFileExt)
		}
		if !ok {
			name, ok = strings.CutSuffix(ent.Name(), eventFileExt)
		}
		if !ok || !sessionNameValid(name) || live(name) || s.files[operatorKey(name)] != nil {
			continue // (an open operator file: a create in flight, see Log.Prepare)
		}
		fi, err := ent.Info()
		if err != nil {
			continue
		}
		if fi.ModTime().After(newest[name]) {
			newest[name] = fi.ModTime()
		}
	}
	cutoff := s.now().Add(-s.retention)
	for name, t := range newest {
		if t.Before(cutoff) {
			s.removeLocked(name)
			s.log.Info("pruned the stored events of a removed session", "session", name, "last_event", t.UTC().Format(time.RFC3339))
		}
	}
}

// sessionNameValid is nsmgr's rule for a session name, which is also what
// keeps a name a single file name under the events directory.
func sessionNameValid(name string) bool { return nsmgr.ValidateSessionName(name) == nil }
