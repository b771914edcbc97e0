package integration

// Evidence a guest cannot erase (issue 27, finding 1): a sandbox's own
// DNS flood (100,000 queries from inside its netns) leaves every operator
// record of the session (created, policy_updated, exec, each with its
// caller) in `session events`, and the counts of its DNS decisions exact,
// while the DNS lines are a bounded sample.

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/integration/world"
)

// floodResult is what a DNS flood's client was answered, by rcode.
type floodResult struct {
	sent     int
	answered map[int]int // rcode -> answers
	lost     int         // no answer within the timeout
	took     time.Duration
}

// dnsFlood sends n A queries from a UDP socket inside the netns at ns to
// server, at most window in flight, each waiting up to timeout for its
// answer; nameOf(i) names the i-th. It returns when every query was
// answered or timed out, or fails the test past limit.
func dnsFlood(t *testing.T, ns string, server netip.AddrPort, n, window int, timeout, limit time.Duration, nameOf func(int) string) floodResult {
	t.Helper()
	var conn net.PacketConn
	if err := world.DoPath(ns, func() (err error) {
		conn, err = net.ListenPacket("udp4", ":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if uc, ok := conn.(*net.UDPConn); ok {
		_ = uc.SetReadBuffer(4 << 20)
	}
	dst := net.UDPAddrFromAddrPort(server)
	res := floodResult{sent: n, answered: map[int]int{}}
	var (
		mu      sync.Mutex
		pending = map[uint16]time.Time{}
	)
	slots := make(chan struct{}, window)
	done := make(chan struct{})
	start := time.Now()
	go func() { // the reader: answers and expiries free slots
		defer close(done)
		buf := make([]byte, 4096)
		got := 0
		for got < n {
			_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			k, _, err := conn.ReadFrom(buf)
			mu.Lock()
			if err == nil {
				var m dns.Msg
				if m.Unpack(buf[:k]) == nil {
					if _, ok := pending[m.Id]; ok {
						delete(pending, m.Id)
						res.answered[m.Rcode]++
						got++
						<-slots
					}
				}
			}
			for id, at := range pending {
				if time.Since(at) > timeout {
					delete(pending, id)
					res.lost++
					got++
					<-slots
				}
			}
			mu.Unlock()
			if time.Since(start) > limit {
				return
			}
		}
	}()
	for i := 0; i < n; i++ {
		slots <- struct{}{}
		m := new(dns.Msg)
		m.SetQuestion(nameOf(i), dns.TypeA)
		m.Id = uint16(i)
		wire, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		pending[m.Id] = time.Now()
		mu.Unlock()
		if _, err := conn.WriteTo(wire, dst); err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if time.Since(start) > limit {
			t.Fatalf("the flood took more than %s: %d of %d queries sent", limit, i, n)
		}
	}
	<-done
	res.took = time.Since(start)
	if res.took > limit {
		t.Fatalf("the flood took more than %s", limit)
	}
	return res
}

func TestE2EEventsFlood(t *testing.T) {
	e := newE2E(t)
	e.create("flood", "--allow", "api.e2e.test")
	e.cli("session", "exec", "flood", "--", "true")
	e.update("flood", "--allow", "docs.e2e.test")
	ns := e.nsPath("flood")
	// One decision before the flood.
	if rcode, _ := e2eLookup(t, ns, "api.e2e.test"); rcode != dns.RcodeSuccess {
		t.Fatalf("api.e2e.test before the flood: %s", dns.RcodeToString[rcode])
	}

	// The flood: 100,000 queries from inside the session's netns, one in
	// a hundred of an allowed name (asked upstream and attested), the rest
	// of names off the policy (NXDOMAIN, never asked upstream).
	const n = 100000
	res := dnsFlood(t, ns, e2eAnycastDNS, n, 32, 10*time.Second, 4*time.Minute, func(i int) string {
		if i%100 == 0 {
			return "docs.e2e.test."
		}
		return fmt.Sprintf("q%d.flood.test.", i)
	})
	t.Logf("flood: %d queries in %s, answers by rcode %v, %d lost", res.sent, res.took, res.answered, res.lost)
	if res.lost != 0 || res.answered[dns.RcodeSuccess] != n/100 || res.answered[dns.RcodeNameError] != n-n/100 {
		t.Fatalf("flood answers %v, %d lost; want %d NOERROR and %d NXDOMAIN, none lost", res.answered, res.lost, n/100, n-n/100)
	}
	e.cli("session", "exec", "flood", "--", "true")

	evs := e2eAuditEvents(t, e.cli("session", "events", "flood"))
	all := e2eParseEvents(t, "flood", e.cli("session", "events", "flood"))
	// Every operator record, with its caller, in order.
	var ops []string
	for _, ev := range evs {
		if ev.Kind != "lifecycle" {
			continue
		}
		if ev.Caller == nil || ev.Caller.UID != 0 || ev.Detail["outcome"] != "ok" {
			t.Errorf("%s: caller %+v outcome %v, want root's and ok", ev.Action, ev.Caller, ev.Detail["outcome"])
		}
		ops = append(ops, ev.Action)
	}
	if fmt.Sprint(ops) != "[created exec policy_updated exec]" {
		t.Errorf("operator records after the flood: %v, want [created exec policy_updated exec]", ops)
	}
	// The counts are exact: the flood's decisions and the one before.
	sum := all[len(all)-1]
	if !sum.is("summary", "counts", "") {
		t.Fatalf("events do not end with the counts: %+v", sum)
	}
	wantAllowed, wantDenied := float64(1+n/100), float64(n-n/100)
	if sum.Detail["dns_allowed"] != wantAllowed || sum.Detail["dns_denied"] != wantDenied {
		t.Errorf("counts %v, want dns_allowed %v and dns_denied %v", sum.Detail, wantAllowed, wantDenied)
	}
	// The positive control: the flood did push lines out. The DNS lines
	// are a bounded sample (at most the ring's 1000), the rest counted as
	// unlogged, and reported by unlogged lines in the stream.
	dnsLines, unloggedLines := 0, 0
	for _, ev := range all {
		switch {
		case ev.Kind == "dns":
			dnsLines++
		case ev.is("summary", "unlogged", ""):
			unloggedLines++
		}
	}
	unlogged, _ := sum.Detail["unlogged"].(float64)
	if dnsLines == 0 || dnsLines > 1000 || unloggedLines == 0 || unlogged < n-1000-50*res.took.Seconds()-1 {
		t.Errorf("sample: %d dns lines, %d unlogged lines, %v unlogged; want at most 1000 lines and the rest (of %d) unlogged", dnsLines, unloggedLines, unlogged, n+1)
	}

	// Removed: the records and the counts stay readable.
	e.cli("session", "rm", "flood")
	all = e2eParseEvents(t, "flood", e.cli("session", "events", "flood"))
	sum = all[len(all)-1]
	if !sum.is("summary", "counts", "") || sum.Detail["dns_allowed"] != wantAllowed || sum.Detail["dns_denied"] != wantDenied {
		t.Errorf("the removed session's counts: %+v", sum)
	}
	ops = nil
	for _, ev := range all {
		if ev.Kind == "lifecycle" {
			ops = append(ops, ev.Action)
		}
	}
	if fmt.Sprint(ops) != "[created exec policy_updated exec deleted]" {
		t.Errorf("the removed session's operator records: %v", ops)
	}
}
