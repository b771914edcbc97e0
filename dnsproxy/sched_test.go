package dnsproxy

import (
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gate is a job that blocks until released.
type gate struct {
	started chan string
	release chan struct{}
}

func newGate() *gate { return &gate{started: make(chan string, 100), release: make(chan struct{})} }

func (g *gate) job(name string) func() {
	return func() {
		g.started <- name
		<-g.release
	}
}

func (g *gate) next(t *testing.T) string {
	t.Helper()
	select {
	case n := <-g.started:
		return n
	case <-time.After(2 * time.Second):
		t.Fatal("no job started")
		return ""
	}
}

func (g *gate) none(t *testing.T) {
	t.Helper()
	select {
	case n := <-g.started:
		t.Fatalf("job %s started", n)
	case <-time.After(30 * time.Millisecond):
	}
}

var (
	flowA = netip.MustParseAddr("10.20.0.2")
	flowB = netip.MustParseAddr("10.20.0.6")
)

func TestSchedulerLoneSessionUsesEverySlot(t *testing.T) {
	var shed atomic.Int64
	s := newScheduler(4, 1, time.Minute, func() { shed.Add(1) })
	g := newGate()
	for range 4 {
		s.submit(flowA, g.job("a"), nil)
	}
	for range 4 {
		g.next(t)
	}
	if running, _ := s.load(); running != 4 {
		t.Fatalf("running %d, want 4", running)
	}
	close(g.release)
	s.drain()
}

func TestSchedulerSharesUnderContention(t *testing.T) {
	var shed atomic.Int64
	s := newScheduler(4, 1, time.Minute, func() { shed.Add(1) })
	g := newGate()
	for range 4 {
		s.submit(flowA, g.job("a"), nil) // A alone: takes every slot
	}
	for range 4 {
		g.next(t)
	}
	for range 3 {
		s.submit(flowA, g.job("a"), nil) // queued
	}
	s.submit(flowB, g.job("b"), nil) // queued behind nobody of its own
	g.none(t)
	if _, queued := s.load(); queued != 4 {
		t.Fatalf("queued %d, want 4", queued)
	}
	g.release <- struct{}{} // one A job ends: the slot goes to B, not to A's queue
	if n := g.next(t); n != "b" {
		t.Fatalf("freed slot went to %s, want b", n)
	}
	// A runs 3 and B 1: A is over its share while B is active, so A's
	// queued jobs wait until more than share slots are free.
	g.release <- struct{}{} // A 2, B 1: one slot free, kept as headroom
	g.none(t)
	g.release <- struct{}{} // two free now (A 1 or 2, B 0 or 1): A may take one
	if n := g.next(t); n != "a" {
		t.Fatalf("got %s", n)
	}
	close(g.release)
	s.drain() // sheds what still waits
	if shed.Load() > 2 {
		t.Fatalf("shed %d, want at most the 2 still queued", shed.Load())
	}
}

func TestSchedulerHeadroomForNewSession(t *testing.T) {
	s := newScheduler(8, 2, time.Minute, func() {})
	g := newGate()
	s.submit(flowB, g.job("b"), nil) // B is active with one job
	g.next(t)
	for range 10 {
		s.submit(flowA, g.job("a"), nil)
	}
	// A may grow while more than share (2) slots stay free: 8-1-2 = 5 jobs.
	for range 5 {
		if n := g.next(t); n != "a" {
			t.Fatalf("got %s", n)
		}
	}
	g.none(t)
	s.submit(flowB, g.job("b"), nil) // B below its share starts at once
	if n := g.next(t); n != "b" {
		t.Fatalf("got %s", n)
	}
	close(g.release)
	s.drain()
}

func TestSchedulerShedsFullQueueAndStaleJobs(t *testing.T) {
	var shed atomic.Int64
	s := newScheduler(2, 1, 50*time.Millisecond, func() { shed.Add(1) })
	g := newGate()
	s.submit(flowA, g.job("a"), nil)
	s.submit(flowA, g.job("a"), nil)
	g.next(t)
	g.next(t)
	var shedCB atomic.Int64
	var mu sync.Mutex
	var shedIdx []int
	for i := range 20 { // queue cap is max(2*share, 8) = 8
		s.submit(flowA, g.job("queued"), func() {
			shedCB.Add(1)
			mu.Lock()
			shedIdx = append(shedIdx, i)
			mu.Unlock()
		})
	}
	if shed.Load() != 12 || shedCB.Load() != 12 {
		t.Fatalf("shed %d (callbacks %d), want 12", shed.Load(), shedCB.Load())
	}
	mu.Lock()
	if want := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}; !slices.Equal(shedIdx, want) {
		t.Fatalf("shed %v, want the oldest %v", shedIdx, want)
	}
	mu.Unlock()
	time.Sleep(80 * time.Millisecond) // the queued jobs go stale
	g.release <- struct{}{}
	g.none(t)
	if shed.Load() != 20 || shedCB.Load() != 20 {
		t.Fatalf("shed %d (callbacks %d), want 20", shed.Load(), shedCB.Load())
	}
	close(g.release)
	s.drain()
	if running, queued := s.load(); running != 0 || queued != 0 || len(s.flows) != 0 {
		t.Fatalf("after drain: running %d queued %d flows %d", running, queued, len(s.flows))
	}
}

func TestSchedulerDrain(t *testing.T) {
	var shed atomic.Int64
	s := newScheduler(2, 1, time.Minute, func() { shed.Add(1) })
	g := newGate()
	s.submit(flowA, g.job("a"), nil)
	s.submit(flowB, g.job("b"), nil)
	g.next(t)
	g.next(t)
	s.submit(flowA, g.job("late"), nil)
	drained := make(chan struct{})
	go func() {
		s.drain()
		close(drained)
	}()
	select {
	case <-drained:
		t.Fatal("drain returned with jobs running")
	case <-time.After(30 * time.Millisecond):
	}
	s.submit(flowB, g.job("after"), nil)
	close(g.release)
	<-drained
	g.none(t)
	if shed.Load() != 2 {
		t.Fatalf("shed %d, want 2 (the queued job and the one after drain)", shed.Load())
	}
}

func TestSchedulerReusesIdleWorkers(t *testing.T) {
	s := newScheduler(8, 8, time.Minute, func() {})
	done := make(chan struct{}, 1)
	before := runtime.NumGoroutine()
	for range 50 {
		s.submit(flowA, func() { done <- struct{}{} }, nil)
		<-done
	}
	// Sequential jobs reuse idle workers (a new one starts only when a job
	// comes while the last worker is between its job and its wait).
	if n := runtime.NumGoroutine() - before; n > 4 {
		t.Fatalf("%d goroutines for 50 sequential jobs", n)
	}
	s.drain()
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left after drain, had %d", runtime.NumGoroutine(), before)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSchedulerTicketHeldUntilReleased: a job started inline runs on the
// submitter's goroutine and holds its slot after it returns, until its
// ticket is released (as a UDP query's does until its answer is sent); a
// job that may not start meanwhile is queued, not run inline, and starts
// (on a worker) when a slot is released. Control: with every slot held,
// nothing else starts.
func TestSchedulerTicketHeldUntilReleased(t *testing.T) {
	s := newScheduler(2, 1, time.Minute, func() {})
	var held []ticket
	for range 2 {
		ran := false
		s.submitTicket(flowA, func(tk ticket) { ran = true; held = append(held, tk) }, nil, true)
		if !ran {
			t.Fatal("a job that may start did not run inline")
		}
	}
	if running, queued := s.load(); running != 2 || queued != 0 {
		t.Fatalf("running %d queued %d after two unreleased jobs, want 2 and 0", running, queued)
	}
	started := make(chan struct{}, 1)
	s.submitTicket(flowB, func(tk ticket) { started <- struct{}{}; tk.release() }, nil, true)
	select {
	case <-started:
		t.Fatal("a job started with every slot held")
	case <-time.After(30 * time.Millisecond):
	}
	if _, queued := s.load(); queued != 1 {
		t.Fatalf("queued %d, want 1", queued)
	}
	held[0].release()
	select {
	case <-started:
	case <-time.After(2 * time.Second):
		t.Fatal("the queued job did not start after a release")
	}
	held[1].release()
	deadline := time.Now().Add(2 * time.Second)
	for r, q := s.load(); r != 0 || q != 0; r, q = s.load() {
		if time.Now().After(deadline) {
			t.Fatalf("running %d queued %d after every release, want 0 and 0", r, q)
		}
		time.Sleep(time.Millisecond)
	}
	s.drain()
}

// TestSchedulerTryStart: tryStart takes a slot when a job of the session
// may start at once and holds it until the ticket is released; with every
// slot held it takes nothing and leaves no flow behind (the job is then
// queued through submitTicket, and it starts when a slot is released);
// a session with queued jobs gets no slot ahead of them; after drain
// nothing starts.
func TestSchedulerTryStart(t *testing.T) {
	s := newScheduler(2, 1, time.Minute, func() {})
	t1, ok1 := s.tryStart(flowA)
	t2, ok2 := s.tryStart(flowA) // a lone session may use the whole proxy
	if !ok1 || !ok2 {
		t.Fatalf("tryStart with free slots: %v %v, want true true", ok1, ok2)
	}
	if _, ok := s.tryStart(flowB); ok {
		t.Fatal("tryStart took a slot with every slot held")
	}
	s.mu.Lock()
	_, left := s.flows[flowB]
	s.mu.Unlock()
	if left {
		t.Error("a refused tryStart left its session's flow behind")
	}
	started := make(chan struct{}, 1)
	s.submitTicket(flowB, func(tk ticket) { started <- struct{}{}; tk.release() }, nil, false)
	if _, ok := s.tryStart(flowB); ok {
		t.Error("tryStart took a slot ahead of the session's queued job")
	}
	t1.release()
	select {
	case <-started:
	case <-time.After(2 * time.Second):
		t.Fatal("the queued job did not start after a release")
	}
	t2.release()
	deadline := time.Now().Add(2 * time.Second)
	for r, q := s.load(); r != 0 || q != 0; r, q = s.load() {
		if time.Now().After(deadline) {
			t.Fatalf("running %d queued %d after every release, want 0 and 0", r, q)
		}
		time.Sleep(time.Millisecond)
	}
	s.drain()
	if _, ok := s.tryStart(flowA); ok {
		t.Error("tryStart took a slot after drain")
	}
}
