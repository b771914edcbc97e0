package nft

import "sync"

// groupCommit coalesces concurrent requests into batches, one in flight at a
// time (group commit). A caller that finds no batch in flight becomes the
// leader and flushes at once with whatever is pending (its own request at
// least): no timer, so a lone caller pays nothing. Callers arriving while a
// batch is in flight queue up; when that batch ends, the leader hands the
// lead to the oldest queued caller, which flushes everything queued by then
// as the next batch. Every caller returns only after the batch holding its
// request has been flushed, with that request's own result.
//
// If a batch of several requests fails, each of its requests is flushed
// again alone, so one bad request cannot fail the others. The flush
// function decides what a batch is; it is never called concurrently.
//
// mu protects pending and busy; busy is true from the moment a leader takes
// the lead until it finds nothing pending after its batch.
type groupCommit[R any] struct {
	flush    func(reqs []R) error
	maxBatch int // requests per batch (>= 1); the rest wait for the next one

	mu      sync.Mutex
	busy    bool
	pending []*gcWaiter[R]
}

// gcWaiter is one queued request. done receives exactly one message: the
// request's result, or lead (its caller must now flush the next batch).
type gcWaiter[R any] struct {
	req  R
	done chan gcResult
}

type gcResult struct {
	lead bool
	err  error
}

func newGroupCommit[R any](maxBatch int, flush func(reqs []R) error) *groupCommit[R] {
	return &groupCommit[R]{flush: flush, maxBatch: max(maxBatch, 1)}
}

// do submits req and waits for the result of the batch holding it.
func (g *groupCommit[R]) do(req R) error {
	w := &gcWaiter[R]{req: req, done: make(chan gcResult, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, w)
	if g.busy {
		g.mu.Unlock()
		if r := <-w.done; !r.lead {
			return r.err
		}
	} else {
		g.busy = true
		g.mu.Unlock()
	}
	return g.lead(w)
}

// lead flushes one batch as the leader: the oldest pending requests (self
// is among them: nothing leaves pending but through a leader), then passes
// the lead on or clears busy, then delivers the results.
func (g *groupCommit[R]) lead(self *gcWaiter[R]) error {
	g.mu.Lock()
	n := min(len(g.pending), g.maxBatch)
	batch := make([]*gcWaiter[R], n)
	copy(batch, g.pending)
	g.pending = append(g.pending[:0], g.pending[n:]...)
	g.mu.Unlock()

	errs := g.flushBatch(batch)

	g.mu.Lock()
	if len(g.pending) > 0 {
		g.pending[0].done <- gcResult{lead: true}
	} else {
		g.busy = false
	}
	g.mu.Unlock()

	var own error
	for i, w := range batch {
		if w == self {
			own = errs[i]
			continue
		}
		w.done <- gcResult{err: errs[i]}
	}
	return own
}

// flushBatch flushes the batch, and each request alone if it fails.
func (g *groupCommit[R]) flushBatch(batch []*gcWaiter[R]) []error {
	errs := make([]error, len(batch))
	reqs := make([]R, len(batch))
	for i, w := range batch {
		reqs[i] = w.req
	}
	err := g.flush(reqs)
	if err == nil || len(batch) == 1 {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for i := range reqs {
		errs[i] = g.flush(reqs[i : i+1])
	}
	return errs
}
