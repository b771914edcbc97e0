package nft

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// gcRecorder is a fake flush: it records every batch, can hold the first
// batch until released, and fails every batch holding a "bad" request.
type gcRecorder struct {
	mu      sync.Mutex
	batches [][]string
	flushed map[string]bool
	hold    chan struct{} // when set, the first flush waits on it
	held    chan struct{} // closed when the first flush started
	once    sync.Once
}

func newGCRecorder(hold bool) *gcRecorder {
	r := &gcRecorder{flushed: map[string]bool{}, held: make(chan struct{})}
	if hold {
		r.hold = make(chan struct{})
	}
	return r
}

func (r *gcRecorder) flush(reqs []string) error {
	first := false
	r.once.Do(func() { first = true; close(r.held) })
	if first && r.hold != nil {
		<-r.hold
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, slices.Clone(reqs))
	if slices.Contains(reqs, "bad") {
		return errors.New("rejected")
	}
	for _, q := range reqs {
		r.flushed[q] = true
	}
	return nil
}

func (r *gcRecorder) isFlushed(q string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.flushed[q]
}

// waitPending waits until n requests are queued behind the batch in flight.
func waitPending[R any](t *testing.T, g *groupCommit[R], n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		g.mu.Lock()
		got := len(g.pending)
		g.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests pending, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// runHeld starts "first", which holds the first batch, queues others behind
// it, releases it and returns every caller's result.
func runHeld(t *testing.T, maxBatch int, others []string) (map[string]error, *gcRecorder) {
	t.Helper()
	rec := newGCRecorder(true)
	g := newGroupCommit(maxBatch, rec.flush)
	var mu sync.Mutex
	res := map[string]error{}
	var wg sync.WaitGroup
	submit := func(q string) {
		defer wg.Done()
		err := g.do(q)
		if err == nil && !rec.isFlushed(q) {
			err = fmt.Errorf("%s returned before its batch was flushed", q)
		}
		mu.Lock()
		res[q] = err
		mu.Unlock()
	}
	wg.Add(1)
	go submit("first")
	<-rec.held
	for i, q := range others {
		wg.Add(1)
		go submit(q)
		waitPending(t, g, i+1) // keeps the queue order deterministic
	}
	close(rec.hold)
	wg.Wait()
	return res, rec
}

func TestGroupCommitLoneCallerFlushesAtOnce(t *testing.T) {
	rec := newGCRecorder(false)
	g := newGroupCommit(8, rec.flush)
	for _, q := range []string{"a", "b"} {
		if err := g.do(q); err != nil {
			t.Fatalf("do %s: %v", q, err)
		}
	}
	if want := [][]string{{"a"}, {"b"}}; !slices.EqualFunc(rec.batches, want, slices.Equal) {
		t.Errorf("batches %v, want %v", rec.batches, want)
	}
	if g.busy || len(g.pending) != 0 {
		t.Errorf("after the calls: busy %t, %d pending", g.busy, len(g.pending))
	}
}

func TestGroupCommitCoalesces(t *testing.T) {
	tests := []struct {
		name     string
		maxBatch int
		others   []string
		batches  [][]string
		failed   []string
	}{
		{"followers share one batch", 8, []string{"b", "c", "d"},
			[][]string{{"first"}, {"b", "c", "d"}}, nil},
		{"batches are bounded", 2, []string{"b", "c", "d", "e", "f"},
			[][]string{{"first"}, {"b", "c"}, {"d", "e"}, {"f"}}, nil},
		{"a failed batch is retried request by request", 8, []string{"b", "bad", "d"},
			[][]string{{"first"}, {"b", "bad", "d"}, {"b"}, {"bad"}, {"d"}}, []string{"bad"}},
		{"a lone bad request fails once", 8, []string{"bad"},
			[][]string{{"first"}, {"bad"}}, []string{"bad"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, rec := runHeld(t, tt.maxBatch, tt.others)
			if !slices.EqualFunc(rec.batches, tt.batches, slices.Equal) {
				t.Errorf("batches %v, want %v", rec.batches, tt.batches)
			}
			for q, err := range res {
				bad := slices.Contains(tt.failed, q)
				switch {
				case bad && (err == nil || err.Error() != "rejected"):
					t.Errorf("%s: err %v, want rejected", q, err)
				case !bad && err != nil:
					t.Errorf("%s: %v", q, err)
				}
			}
		})
	}
}

// TestGroupCommitManyCallers: under contention every request is flushed
// exactly once (no failures here), and the batches are fewer than the calls.
func TestGroupCommitManyCallers(t *testing.T) {
	rec := newGCRecorder(false)
	var slow sync.Mutex
	g := newGroupCommit(16, func(reqs []string) error {
		if !slow.TryLock() {
			return errors.New("flush called concurrently")
		}
		defer slow.Unlock()
		time.Sleep(200 * time.Microsecond)
		return rec.flush(reqs)
	})
	const n = 400
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := fmt.Sprint("q", i)
			if err := g.do(q); err != nil {
				errs <- err
			} else if !rec.isFlushed(q) {
				errs <- fmt.Errorf("%s returned before its batch", q)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	seen := map[string]int{}
	for _, b := range rec.batches {
		if len(b) > 16 {
			t.Errorf("batch of %d requests exceeds the bound 16", len(b))
		}
		for _, q := range b {
			seen[q]++
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct requests flushed, want %d", len(seen), n)
	}
	for q, c := range seen {
		if c != 1 {
			t.Errorf("%s flushed %d times", q, c)
		}
	}
	if len(rec.batches) >= n {
		t.Errorf("%d batches for %d concurrent calls: nothing was coalesced", len(rec.batches), n)
	}
	t.Logf("%d calls in %d batches", n, len(rec.batches))
}
