package dnsproxy

import (
	"net/netip"
	"sync"
	"time"
)

// scheduler bounds the work in flight and shares it fairly between
// sessions.
//
// At most max jobs run at once. A session running fewer than share jobs
// takes any free slot. A session already running share jobs or more takes a
// free slot only while it is the only active session (so a lone busy
// session may use the whole proxy) or while more than share slots stay
// free (the headroom that lets a newly active session start at once). A job
// that may not start waits in its session's queue (bounded: a full queue
// sheds its oldest job, whose client has most likely given up). When a slot frees it goes to a waiting session that may
// start, chosen round-robin, those below their share first. So under
// contention no session grows beyond share while another waits, and a
// flooding session cannot starve the others.
//
// A job holds its slot until it releases its ticket, which it may do after
// it returns, from another goroutine: a UDP query's job sends the query
// upstream and returns; the upstream socket's reader finishes the answer
// and releases the slot (see Proxy.serveQuery). So the slots count queries
// in flight, not goroutines.
//
// A job that may start at once runs on the submitter's goroutine when the
// submitter asks for it (submitTicket with inline: the UDP reader, whose
// jobs never wait for an upstream); other jobs run on reusable worker
// goroutines: a worker that finishes a job waits up to workerIdle for the
// next one before it exits, so a busy proxy does not pay for a new
// goroutine, and for growing its stack, per query.
//
// mu protects every field below it; it is held only to count and to pick
// the next job, never while a job runs.
type scheduler struct {
	max, share, queueCap, totalQueueCap int
	maxWait                             time.Duration
	onShed                              func()
	work                                chan work     // hands a job to an idle worker (unbuffered)
	quit                                chan struct{} // closed by drain: idle workers exit
	quitOnce                            sync.Once

	mu      sync.Mutex
	idle    sync.Cond // signalled when running drops to zero
	closed  bool      // set by drain: new jobs are shed
	running int
	queued  int
	flows   map[netip.Addr]*flow // sessions with running or queued jobs
	waiting []*flow              // sessions with queued jobs, in round-robin order
	next    int                  // round-robin cursor into waiting
}

// flow is one session's share of the scheduler.
type flow struct {
	key     netip.Addr
	running int
	queue   []queuedJob
}

type queuedJob struct {
	run  func(ticket)
	shed func()
	at   time.Time
}

// work is a started job and the flow whose slot it holds.
type work struct {
	f   *flow
	run func(ticket)
}

// ticket is a started job's slot: release it exactly once, when the job's
// work is done (its answer sent).
type ticket struct {
	s *scheduler
	f *flow
}

func (t ticket) release() { t.s.done(t.f) }

// workerIdle is how long an idle worker waits for a job before it exits.
const workerIdle = 10 * time.Second

func newScheduler(limit, share int, maxWait time.Duration, onShed func()) *scheduler {
	s := &scheduler{
		max:           limit,
		share:         min(share, limit-1),
		queueCap:      max(2*share, 8),
		totalQueueCap: 4 * limit,
		maxWait:       maxWait,
		onShed:        onShed,
		flows:         map[netip.Addr]*flow{},
		work:          make(chan work),
		quit:          make(chan struct{}),
	}
	s.idle.L = &s.mu
	return s
}

// submit runs job for session key now, or later, or never: then it calls
// shed instead (and onShed). It never blocks. The job's slot is released
// when job returns.
func (s *scheduler) submit(key netip.Addr, job, shed func()) {
	s.submitTicket(key, func(t ticket) {
		job()
		t.release()
	}, shed, false)
}

// submitTicket is submit for a job that releases its slot itself (through
// the ticket it is given, possibly after it returns). With inline, a job
// that may start at once runs on the caller's goroutine before
// submitTicket returns; such a job must not block for long.
func (s *scheduler) submitTicket(key netip.Addr, job func(ticket), shed func(), inline bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.shed(shed)
		return
	}
	f := s.flows[key]
	if f == nil {
		f = &flow{key: key}
		s.flows[key] = f
	}
	if len(f.queue) == 0 && s.mayStartLocked(f) {
		if inline {
			s.running++
			f.running++
			s.mu.Unlock()
			job(ticket{s, f})
			return
		}
		s.startLocked(f, job)
		s.mu.Unlock()
		return
	}
	if len(f.queue) >= s.queueCap || (s.queued >= s.totalQueueCap && len(f.queue) > 0) {
		// Drop the session's oldest waiting query, not the new one: its
		// client is the likeliest to have given up already.
		old := f.queue[0]
		f.queue[0] = queuedJob{}
		f.queue = append(f.queue[1:], queuedJob{run: job, shed: shed, at: time.Now()})
		s.mu.Unlock()
		s.shed(old.shed)
		return
	}
	if s.queued >= s.totalQueueCap {
		s.dropIfIdleLocked(f)
		s.mu.Unlock()
		s.shed(shed)
		return
	}
	if len(f.queue) == 0 {
		s.waiting = append(s.waiting, f)
	}
	f.queue = append(f.queue, queuedJob{run: job, shed: shed, at: time.Now()})
	s.queued++
	s.mu.Unlock()
}

// tryStart takes a slot for a job of session key when one may start at
// once (as submitTicket would run it inline), and reports false, taking
// nothing, otherwise: then the job goes through submitTicket. The caller
// runs the job itself and releases the ticket when its work is done.
func (s *scheduler) tryStart(key netip.Addr) (ticket, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ticket{}, false
	}
	f := s.flows[key]
	if f == nil {
		f = &flow{key: key}
		s.flows[key] = f
	}
	if len(f.queue) != 0 || !s.mayStartLocked(f) {
		s.dropIfIdleLocked(f)
		return ticket{}, false
	}
	s.running++
	f.running++
	return ticket{s, f}, true
}

// startLocked starts job for f on an idle worker, or on a new one when
// none is idle (so every started job runs at once: at most max workers are
// busy).
func (s *scheduler) startLocked(f *flow, job func(ticket)) {
	s.running++
	f.running++
	select {
	case s.work <- work{f, job}:
	default:
		go s.worker(work{f, job})
	}
}

// worker runs w, then the jobs handed to it, until it has been idle for
// workerIdle or the scheduler is drained.
func (s *scheduler) worker(w work) {
	timer := time.NewTimer(workerIdle)
	defer timer.Stop()
	for {
		w.run(ticket{s, w.f})
		timer.Reset(workerIdle)
		select {
		case w = <-s.work:
		case <-timer.C:
			return
		case <-s.quit:
			return
		}
	}
}

// done releases f's slot and hands free slots to waiting sessions (see
// ticket.release).
func (s *scheduler) done(f *flow) {
	var shed []func()
	s.mu.Lock()
	s.running--
	f.running--
	s.dropIfIdleLocked(f)
	now := time.Now()
	for len(s.waiting) > 0 {
		w := s.pickLocked()
		if w == nil {
			break
		}
		j := w.queue[0]
		w.queue[0] = queuedJob{}
		w.queue = w.queue[1:]
		s.queued--
		if len(w.queue) == 0 {
			s.removeWaitingLocked(w)
		}
		if now.Sub(j.at) > s.maxWait {
			shed = append(shed, j.shed) // the client has given up on it
			s.dropIfIdleLocked(w)
			continue
		}
		s.startLocked(w, j.run)
	}
	if s.running == 0 {
		s.idle.Broadcast()
	}
	s.mu.Unlock()
	for _, fn := range shed {
		s.shed(fn)
	}
}

func (s *scheduler) shed(fn func()) {
	s.onShed()
	if fn != nil {
		fn()
	}
}

// drain sheds every queued job and every later submission, and waits until
// no job runs.
func (s *scheduler) drain() {
	var shed []func()
	s.mu.Lock()
	s.closed = true
	for _, w := range s.waiting {
		for _, j := range w.queue {
			shed = append(shed, j.shed)
		}
		w.queue = nil
		s.dropIfIdleLocked(w)
	}
	s.waiting, s.next, s.queued = nil, 0, 0
	s.mu.Unlock()
	for _, fn := range shed {
		s.shed(fn)
	}
	s.mu.Lock()
	for s.running > 0 {
		s.idle.Wait()
	}
	s.mu.Unlock()
	s.quitOnce.Do(func() { close(s.quit) })
}

// mayStartLocked reports whether a job of f may take a slot now.
func (s *scheduler) mayStartLocked(f *flow) bool {
	free := s.max - s.running
	return free > 0 && (f.running < s.share || len(s.flows) == 1 || free > s.share)
}

// pickLocked chooses the next waiting session that may start, round-robin
// from the cursor, preferring one below its share; nil if none may.
func (s *scheduler) pickLocked() *flow {
	if s.running >= s.max {
		return nil
	}
	n := len(s.waiting)
	for i := range n {
		w := s.waiting[(s.next+i)%n]
		if w.running < s.share {
			s.next = (s.next + i + 1) % n
			return w
		}
	}
	for i := range n {
		w := s.waiting[(s.next+i)%n]
		if s.mayStartLocked(w) {
			s.next = (s.next + i + 1) % n
			return w
		}
	}
	return nil
}

func (s *scheduler) removeWaitingLocked(w *flow) {
	for i, x := range s.waiting {
		if x == w {
			s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
			if s.next > i {
				s.next--
			}
			if len(s.waiting) == 0 || s.next >= len(s.waiting) {
				s.next = 0
			}
			return
		}
	}
}

func (s *scheduler) dropIfIdleLocked(f *flow) {
	if f.running == 0 && len(f.queue) == 0 {
		delete(s.flows, f.key)
	}
}

// load reports the jobs running and waiting.
func (s *scheduler) load() (running, queued int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, s.queued
}
