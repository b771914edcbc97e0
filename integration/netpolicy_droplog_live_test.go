package integration

import (
	"net"
	"net/netip"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Live tests of the drop log: every drop reason of the table, triggered by
// the attack or mistake behind it, read back from NFLOG by the firewall's
// own reader (nft.DropLog), with a control that logs nothing; the
// per-reason counters, and the per-session log budget under a flood.

// dropWatch collects what a DropLog reads.
type dropWatch struct {
	ch chan nft.DroppedFlow
}

func watchDrops(t *testing.T, fw *nft.Firewall) *dropWatch {
	t.Helper()
	dl, err := fw.OpenDropLog()
	if err != nil {
		t.Fatalf("open drop log: %v", err)
	}
	w := &dropWatch{ch: make(chan nft.DroppedFlow, 4096)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			fls, err := dl.Read()
			if err != nil {
				return
			}
			for _, fl := range fls {
				select {
				case w.ch <- fl:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		dl.Close()
		<-done
	})
	return w
}

// expect waits up to 2 s for a line matching want (zero fields match
// anything) and fails the test without one.
func (w *dropWatch) expect(t *testing.T, what string, want nft.DroppedFlow) nft.DroppedFlow {
	t.Helper()
	deadline := time.After(2 * time.Second)
	var seen []nft.DroppedFlow
	for {
		select {
		case fl := <-w.ch:
			if dropMatches(fl, want) {
				return fl
			}
			seen = append(seen, fl)
		case <-deadline:
			t.Errorf("%s: no drop line like %+v within 2s; saw %+v", what, want, seen)
			return nft.DroppedFlow{}
		}
	}
}

// quiet fails the test if any line arrives within d.
func (w *dropWatch) quiet(t *testing.T, what string, d time.Duration) {
	t.Helper()
	select {
	case fl := <-w.ch:
		t.Errorf("%s: unexpected drop line %+v", what, fl)
	case <-time.After(d):
	}
}

func (w *dropWatch) drain() {
	for {
		select {
		case <-w.ch:
		case <-time.After(300 * time.Millisecond):
			return
		}
	}
}

func dropMatches(fl, want nft.DroppedFlow) bool {
	return fl.Reason == want.Reason &&
		(want.Proto == "" || fl.Proto == want.Proto) &&
		(!want.Src.IsValid() || fl.Src == want.Src) &&
		(!want.Dst.IsValid() || fl.Dst == want.Dst) &&
		(want.DstPort == 0 || fl.DstPort == want.DstPort) &&
		(!want.Guest.IsValid() || fl.Guest == want.Guest)
}

// TestNetpolicyDropLogReasons: one attack or mistake per reason, each
// logged once with its reason, destination and port, and counted by
// reason; allowed traffic (the control) logs nothing.
func TestNetpolicyDropLogReasons(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	web0, web1, web2 := w.Web[0], w.Web[1], w.Web[2]
	s, _ := e.session(t, "a", netpolicy.ModeAllowlist, []netpolicy.Target{
		staticHost(web0),
		{Prefix: netip.PrefixFrom(web1, 32), Port: 7, Proto: netpolicy.ProtoUDP},
	})
	other, _ := e.session(t, "b", netpolicy.ModePublic, nil)
	ns := s.NetnsPath
	drops := watchDrops(t, e.fw)

	// Control: allowed traffic, no line.
	expectReach(t, "allowed address", tcpProbe(ns, netip.AddrPortFrom(web0, 7)), udpProbe(ns, netip.AddrPortFrom(web1, 7)))
	drops.quiet(t, "allowed traffic", time.Second)

	expectBlocked(t, "not allowed", tcpProbe(ns, netip.AddrPortFrom(web2, 80)))
	drops.expect(t, "not allowed", nft.DroppedFlow{Reason: netpolicy.ReasonNotAllowed, Proto: "tcp", Src: s.Guest, Dst: web2, DstPort: 80, Guest: s.Guest})
	drops.drain() // the probe's retransmissions are not new flows, but its SYN retries may be logged once each

	expectBlocked(t, "another port", tcpProbe(ns, netip.AddrPortFrom(web1, 7)))
	drops.expect(t, "another port", nft.DroppedFlow{Reason: netpolicy.ReasonPort, Proto: "tcp", Dst: web1, DstPort: 7, Guest: s.Guest})
	// An attested port-constrained address on another port says "port" too.
	if _, err := e.fw.Attest(s.Guest, []netip.Addr{web2}, time.Minute, []netpolicy.PortSpec{{Port: 443, Proto: netpolicy.ProtoTCP}}); err != nil {
		t.Fatal(err)
	}
	expectBlocked(t, "attested on another port", udpProbe(ns, netip.AddrPortFrom(web2, 9)))
	drops.expect(t, "attested on another port", nft.DroppedFlow{Reason: netpolicy.ReasonPort, Proto: "udp", Dst: web2, DstPort: 9})
	drops.drain()

	expectBlocked(t, "metadata", tcpProbe(ns, netip.AddrPortFrom(w.Metadata, 80)))
	fl := drops.expect(t, "metadata", nft.DroppedFlow{Reason: netpolicy.ReasonSpecialPurpose, Proto: "tcp", Dst: w.Metadata, DstPort: 80})
	if r, ok := e.guard.BlockedBy(fl.Dst); !ok || r.Name != "link-local" {
		t.Errorf("the guard names %s's range %v %v, want link-local", fl.Dst, r, ok)
	}
	drops.drain()

	expectBlocked(t, "direct DNS", dnsProbe(ns, w.DNS.Addr(), false))
	drops.expect(t, "direct DNS", nft.DroppedFlow{Reason: netpolicy.ReasonResolver, Proto: "udp", Dst: w.DNS.Addr().Addr(), DstPort: 53})
	drops.drain()

	// Spoofed: a datagram with session b's address as its source, sent from
	// a's netns. The line names a's guest (its interface), not b.
	disableRPFilter(t, w, s.HostIface)
	run(t, "ip", "netns", "exec", nsmgr.NetnsName(e.prefix, "a"), "ip", "addr", "add", other.Guest.String()+"/32", "dev", "eth0")
	sendFrom(t, ns, other.Guest, netip.AddrPortFrom(web0, 9), "spoofed")
	drops.expect(t, "spoofed", nft.DroppedFlow{Reason: netpolicy.ReasonSpoofed, Proto: "udp", Src: other.Guest, Dst: web0, DstPort: 9, Guest: s.Guest})
	drops.drain()

	// Inbound: the world opens a connection towards the guest (given a
	// route to the pool through the simulated host).
	run(t, "ip", "netns", "exec", w.NetName, "ip", "route", "add", e.pool.String(), "via", w.Uplink.String())
	expectBlocked(t, "inbound", tcpProbe(w.NetPath, netip.AddrPortFrom(s.Guest, 22)))
	drops.expect(t, "inbound", nft.DroppedFlow{Reason: netpolicy.ReasonInbound, Proto: "tcp", Dst: s.Guest, DstPort: 22, Guest: s.Guest})
	drops.drain()

	c, err := e.fw.Counters(s.Guest)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{netpolicy.ReasonNotAllowed, netpolicy.ReasonPort, netpolicy.ReasonSpecialPurpose, netpolicy.ReasonResolver, netpolicy.ReasonSpoofed, netpolicy.ReasonInbound} {
		if c.ByReason[r] == 0 {
			t.Errorf("counter of reason %s did not move: %+v", r, c.ByReason)
		}
	}
	if oc, _ := e.fw.Counters(other.Guest); len(oc.ByReason) != 0 {
		t.Errorf("session b's reasons moved (a spoofed its address): %+v", oc.ByReason)
	}
	// Counters reads one guest's elements by key; AllCounters dumps the
	// sets: both must read the same kernel counters.
	all, err := e.fw.AllCounters()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []netip.Addr{s.Guest, other.Guest} {
		one, err := e.fw.Counters(g)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(one, all[g]) {
			t.Errorf("Counters(%s) = %+v, AllCounters has %+v", g, one, all[g])
		}
	}
	if c.AcceptedPackets == 0 || c.ReceivedPackets == 0 || c.DroppedPackets == 0 {
		t.Errorf("counters by key did not move: %+v", c)
	}
	if none, err := e.fw.Counters(netip.MustParseAddr("10.255.255.254")); err != nil || !reflect.DeepEqual(none, nft.Counters{}) {
		t.Errorf("Counters of an address no session has = %+v, %v; want zero and no error", none, err)
	}
}

// TestNetpolicyDropLogRateLimit: new flows over the flow rate are logged as
// rate-limit, and a flood of forbidden flows is logged within the session's
// budget (burst plus rate), every suppressed line counted in Unlogged and
// every drop counted exactly, while another session's lines still arrive.
func TestNetpolicyDropLogRateLimit(t *testing.T) {
	e := newNPEnv(t, time.Second)
	e.cfg.FlowRate = 5
	e.cfg.LogRate = 10
	e.reopenFirewall(t) // the same table, rules with the small budgets
	w := e.w
	s, _ := e.session(t, "a", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(w.Web[0])})
	quiet, _ := e.session(t, "b", netpolicy.ModeAllowlist, nil)
	drops := watchDrops(t, e.fw)

	// Rate limit: allowed flows faster than 5/s (burst 10).
	for i := 0; i < 40; i++ {
		sendFrom(t, s.NetnsPath, s.Guest, netip.AddrPortFrom(w.Web[0], uint16(20000+i)), "x")
	}
	drops.expect(t, "over the flow rate", nft.DroppedFlow{Reason: netpolicy.ReasonRateLimit, Proto: "udp", Dst: w.Web[0], Guest: s.Guest})
	time.Sleep(3 * time.Second) // the log budget refills
	drops.drain()

	// Flood: forbidden new flows as fast as one goroutine sends them for 2 s.
	before, err := e.fw.Counters(s.Guest)
	if err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int64
	start := time.Now()
	err = world.DoPath(s.NetnsPath, func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: s.Guest.AsSlice()})
		if err != nil {
			return err
		}
		defer c.Close()
		for i := 0; time.Since(start) < 2*time.Second; i++ {
			dst := netip.AddrPortFrom(w.Web[2], uint16(1024+i%60000))
			if _, err := c.WriteToUDPAddrPort([]byte("f"), dst); err == nil {
				sent.Add(1)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	// Another session's drop is logged meanwhile: the budget is per session.
	expectBlocked(t, "session b", udpProbe(quiet.NetnsPath, netip.AddrPortFrom(w.Web[1], 7)))
	lines, others := 0, 0
	deadline := time.After(time.Second)
collect:
	for {
		select {
		case fl := <-drops.ch:
			if fl.Guest == s.Guest {
				lines++
			} else if fl.Guest == quiet.Guest {
				others++
			}
		case <-deadline:
			break collect
		}
	}
	after, err := e.fw.Counters(s.Guest)
	if err != nil {
		t.Fatal(err)
	}
	dropped := after.ByReason[netpolicy.ReasonNotAllowed] - before.ByReason[netpolicy.ReasonNotAllowed]
	unlogged := after.Unlogged - before.Unlogged
	budget := 2*10 + int(elapsed.Seconds()*10) + 10
	t.Logf("flood: %d sent in %s, %d dropped as not-allowed, %d lines, %d unlogged (budget %d)", sent.Load(), elapsed.Round(time.Millisecond), dropped, lines, unlogged, budget)
	if sent.Load() < 1000 {
		t.Fatalf("the flood sent only %d datagrams", sent.Load())
	}
	if lines > budget {
		t.Errorf("%d lines logged for the flood, want at most %d (burst + rate)", lines, budget)
	}
	if lines == 0 {
		t.Errorf("no line logged for the flood")
	}
	if others == 0 {
		t.Errorf("session b's drop was not logged during a's flood")
	}
	// Every new flow is either logged or counted as unlogged (the reader
	// may have missed none: the budget is small).
	if got := uint64(lines) + unlogged; got != dropped {
		t.Errorf("lines %d + unlogged %d = %d, want the %d drops", lines, unlogged, got, dropped)
	}
	// A datagram the guest's stack or the veth's backlog lost never met
	// the table; nearly all of them did.
	if dropped > uint64(sent.Load()) || dropped < uint64(sent.Load())*9/10 {
		t.Errorf("%d drops counted for %d datagrams sent", dropped, sent.Load())
	}
}
