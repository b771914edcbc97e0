package netpolicy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
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
	nfnlConn

	pmu     sync.Mutex // guards pending, flushErr and the flusher's start
	pending map[netip.Addr]bool
	started bool
	wake    chan struct{} // capacity 1: "pending changed"
	stop    chan struct{}
	stopped chan struct{}
	// onError reports a failed background pass (it is retried); nil drops it.
	onError func(error)
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

// ctnetlink message and attribute numbers (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctMsgGet        = unix.NFNL_SUBSYS_CTNETLINK<<8 | 1 // IPCTNL_MSG_CT_GET
	ctMsgDelete     = unix.NFNL_SUBSYS_CTNETLINK<<8 | 2 // IPCTNL_MSG_CT_DELETE
	ctaTupleOrig    = 1
	ctaZone         = 18
	ctaTupleIP      = 1
	ctaTupleProto   = 2
	ctaProtoNum     = 1
	ctaProtoSrcPort = 2
	ctaProtoDstPort = 3
	ctaIPv4Src      = 1
	ctaIPv4Dst      = 2
	nfnetlinkV0     = 0
	nestedAttribute = unix.NLA_F_NESTED
)

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
	t.closeConn()
}

// prune deletes every IPv4 conntrack entry whose original source or
// destination is an address owned by drop, and returns how many. It dumps
// the whole table once (a start-up reconcile, where the owners are known
// only by address).
func (t *flowTable) prune(drop func(netip.Addr) bool) (int, error) {
	n := 0
	err := t.do(func(c *netlink.Conn) error {
		entries, err := dumpFlows(c, nil)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if !drop(e.src) && !drop(e.dst) {
				continue
			}
			if err := deleteFlow(c, e); err != nil {
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

// flowEntry is what deleting one entry needs: its original tuple exactly as
// the kernel sent it, and its zone if it has one; src and dst are the
// tuple's addresses.
type flowEntry struct {
	tuple    []byte
	zone     []byte
	src, dst netip.Addr
	proto    uint8  // the protocol number
	sport    uint16 // the source port of a port protocol, else 0
	dport    uint16 // the destination port of a port protocol (TCP, UDP, ...), else 0
}

func nfgenmsg() []byte { return []byte{unix.AF_INET, nfnetlinkV0, 0, 0} }

// dumpFlows lists the IPv4 entries matching attrs (nil: all of them).
func dumpFlows(c *netlink.Conn, attrs []byte) ([]flowEntry, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(ctMsgGet), Flags: netlink.Request | netlink.Dump},
		Data:   append(nfgenmsg(), attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("dump conntrack table: %w", err)
	}
	out := make([]flowEntry, 0, len(msgs))
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		e, err := parseFlow(m.Data[4:])
		if err != nil {
			return nil, err
		}
		if e.tuple != nil {
			out = append(out, e)
		}
	}
	return out, nil
}

func parseFlow(b []byte) (flowEntry, error) {
	var e flowEntry
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return e, fmt.Errorf("parse conntrack entry: %w", err)
	}
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleOrig:
			e.tuple = append([]byte(nil), ad.Bytes()...)
			e.src, e.dst, e.proto, e.sport, e.dport = parseTuple(e.tuple)
		case ctaZone:
			e.zone = append([]byte(nil), ad.Bytes()...)
		}
	}
	return e, ad.Err()
}

// parseTuple reads an encoded tuple once: its IPv4 source and destination,
// its protocol number and, for a port protocol, its ports.
func parseTuple(tuple []byte) (src, dst netip.Addr, proto uint8, sport, dport uint16) {
	ad, err := netlink.NewAttributeDecoder(tuple)
	if err != nil {
		return
	}
	for ad.Next() {
		inner, err := netlink.NewAttributeDecoder(ad.Bytes())
		if err != nil {
			return
		}
		switch ad.Type() {
		case ctaTupleIP:
			for inner.Next() {
				v := inner.Bytes()
				if len(v) != 4 {
					continue
				}
				switch inner.Type() {
				case ctaIPv4Src:
					src = netip.AddrFrom4([4]byte(v))
				case ctaIPv4Dst:
					dst = netip.AddrFrom4([4]byte(v))
				}
			}
		case ctaTupleProto:
			for inner.Next() {
				v := inner.Bytes()
				switch {
				case inner.Type() == ctaProtoNum && len(v) == 1:
					proto = v[0]
				case inner.Type() == ctaProtoSrcPort && len(v) == 2:
					sport = binary.BigEndian.Uint16(v)
				case inner.Type() == ctaProtoDstPort && len(v) == 2:
					dport = binary.BigEndian.Uint16(v)
				}
			}
		}
	}
	return
}

// deleteFlow deletes one entry by its original tuple; an entry that went
// away meanwhile (it expired) counts as deleted.
func deleteFlow(c *netlink.Conn, e flowEntry) error {
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(nestedAttribute|ctaTupleOrig, e.tuple)
	if e.zone != nil {
		ae.Bytes(ctaZone, e.zone)
	}
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	_, err = c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(ctMsgDelete), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(nfgenmsg(), attrs...),
	})
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("delete conntrack entry %s -> %s: %w", e.src, e.dst, err)
	}
	return nil
}
