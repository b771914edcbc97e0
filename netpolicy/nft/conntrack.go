package nft

import (
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/internal/nfnetlink"
)

// flowTable deletes conntrack entries of the daemon's netns over netlink
// (ctnetlink), so that no flow of a removed session survives it: the next
// session on the same address would inherit it (an outside peer keeps
// pushing into it, and it can answer outside its policy).
//
// Any walk of the conntrack table costs the kernel a pass over every hash
// bucket of the host (262144 on a large machine, ~13 ms), whatever the
// filter, so removals do not wait for it: RemoveSession queues the guest
// (schedule) and a background flusher deletes its entries, batching every
// guest queued meanwhile into one pass. Until its entries are gone the
// guest is pending, and the address is not handed out again (the daemon's
// allocator asks Flushed). A pass is one dump of the netns's IPv4 entries;
// it deletes those whose original source (the session's own flows,
// masqueraded or not) or original destination (flows a lab peer opened into
// it) is a queued guest.
type flowTable struct {
	nfnetlink.Conn

	pmu     sync.Mutex // guards pending, flushErr and the flusher's start
	pending map[netip.Addr]bool
	started bool
	wake    chan struct{} // capacity 1: "pending changed"
	stop    chan struct{}
	stopped chan struct{}
	// onError reports a failed background pass (it is retried); nil drops it.
	onError func(error)
	// afterFlush, when set, runs after a pass deleted the batch's entries and
	// before the guests stop being pending (a failure retries the pass).
	afterFlush func(guests []netip.Addr) error
	// owner6, when set (a dual-stack table), maps a guest's v6 address to
	// its v4 one, the key of pending: a pass then also deletes the IPv6
	// entries of the guests it flushes.
	owner6 func(netip.Addr) (netip.Addr, bool)
}

// flushRetry is how long the flusher waits after a failed pass, doubling
// up to flushRetryMax while passes keep failing (each failure is reported);
// flushGather how long it lets removals gather before a pass, so a burst of
// removals costs one walk of the table, not one each (a walk keeps a core
// busy for ~13 ms; the addresses stay quarantined meanwhile).
const (
	flushRetry    = time.Second
	flushRetryMax = time.Minute
	flushGather   = 100 * time.Millisecond
)

// schedule queues guest for the background flusher.
func (t *flowTable) schedule(guest netip.Addr) {
	t.pmu.Lock()
	if t.pending == nil {
		t.pending = map[netip.Addr]bool{}
	}
	t.pending[guest] = true
	if !t.started {
		t.started = true
		t.wake = make(chan struct{}, 1)
		t.stop = make(chan struct{})
		t.stopped = make(chan struct{})
		go t.flusher()
	}
	t.pmu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// flushed reports whether nothing of guest is queued (its entries are gone,
// or it was never queued).
func (t *flowTable) flushed(guest netip.Addr) bool {
	t.pmu.Lock()
	defer t.pmu.Unlock()
	return !t.pending[guest]
}

// idle reports whether no guest is queued.
func (t *flowTable) idle() bool {
	t.pmu.Lock()
	defer t.pmu.Unlock()
	return len(t.pending) == 0
}

// flusher runs passes until stopped: each takes every queued guest. It
// runs on a thread of its own at SCHED_IDLE: the kernel walks the table in
// the dumping thread's context, so the walk only ever takes idle CPU, never
// time from creates, deletes or answers.
func (t *flowTable) flusher() {
	defer close(t.stopped)
	runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
	_ = unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0)
	retry := flushRetry
	for {
		select {
		case <-t.stop:
			return
		case <-t.wake:
		}
		select {
		case <-t.stop:
			return
		case <-time.After(flushGather):
		}
		t.pmu.Lock()
		batch := make(map[netip.Addr]bool, len(t.pending))
		for g := range t.pending {
			batch[g] = true
		}
		t.pmu.Unlock()
		if len(batch) == 0 {
			continue
		}
		// One walk for the whole batch. (Two dumps the kernel filters by
		// address would move less data for one guest, but each is a walk.)
		_, err := t.prune(func(a netip.Addr) bool { return batch[a] })
		if err == nil && t.afterFlush != nil {
			// On a thread of normal priority: it takes the admin
			// connection's lock, which an idle thread could hold for
			// as long as the CPUs are busy.
			done := make(chan error, 1)
			go func() { done <- t.afterFlush(slices.Collect(maps.Keys(batch))) }()
			err = <-done
		}
		if err != nil {
			if t.onError != nil {
				t.onError(err)
			}
			time.AfterFunc(retry, func() {
				select {
				case t.wake <- struct{}{}:
				default:
				}
			})
			retry = min(2*retry, flushRetryMax)
			continue
		}
		retry = flushRetry
		t.pmu.Lock()
		for g := range batch {
			delete(t.pending, g)
		}
		t.pmu.Unlock()
	}
}

// close stops the flusher (what is still queued is pruned by the next
// start's reconcile) and closes the connection.
func (t *flowTable) close() {
	t.pmu.Lock()
	started := t.started
	t.started = false
	t.pmu.Unlock()
	if started {
		close(t.stop)
		<-t.stopped
	}
	t.Close()
}

// prune deletes every IPv4 conntrack entry whose original source or
// destination is an address owned by drop, and returns how many. It dumps
// the whole table once (a start-up reconcile, where the owners are known
// only by address).
func (t *flowTable) prune(drop func(netip.Addr) bool) (int, error) {
	n := 0
	err := t.Do(func(c *netlink.Conn) error {
		entries, err := nfnetlink.DumpFlows(c, nil)
		if err != nil {
			return err
		}
		if t.owner6 != nil {
			v6, err := nfnetlink.DumpFlowsOf(c, unix.AF_INET6, nil)
			if err != nil {
				return err
			}
			entries = append(entries, v6...)
			inner := drop
			drop = func(a netip.Addr) bool {
				if g, ok := t.owner6(a); ok {
					return inner(g)
				}
				return inner(a)
			}
		}
		for _, e := range entries {
			if !drop(e.Src) && !drop(e.Dst) {
				continue
			}
			if err := nfnetlink.DeleteFlow(c, e); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("prune conntrack entries: %w", err)
	}
	return n, nil
}
