package dnsproxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// serveFake runs Serve on a fake packet conn and returns it with a
// channel that yields Serve's result.
func serveFake(t *testing.T, tp *testProxy) (*fakePacketConn, <-chan error) {
	t.Helper()
	c := newFakePacketConn()
	done := make(chan error, 1)
	go func() { done <- tp.Serve(c, nil) }()
	return c, done
}

func (c *fakePacketConn) reply(t *testing.T, timeout time.Duration) (*dns.Msg, net.Addr) {
	t.Helper()
	select {
	case p := <-c.out:
		m := new(dns.Msg)
		if err := m.Unpack(p.data); err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
		return m, p.addr
	case <-time.After(timeout):
		t.Fatalf("no reply within %v", timeout)
		return nil, nil
	}
}

func TestServeRefusesUnknownSource(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	c, done := serveFake(t, tp)

	stranger := netip.MustParseAddr("10.20.0.10")
	c.send(stranger, query("a.test.", dns.TypeA))
	resp, to := c.reply(t, 2*time.Second)
	if resp.Rcode != dns.RcodeRefused || len(resp.Answer) != 0 {
		t.Fatalf("stranger got %v", resp)
	}
	if to.String() != "10.20.0.10:40000" {
		t.Fatalf("reply sent to %s", to)
	}
	c.send(guest1, query("a.test.", dns.TypeA))
	if resp, _ := c.reply(t, 2*time.Second); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("session got %v", resp)
	}
	tp.Unregister(guest1)
	tp.Unregister(guest1) // idempotent
	c.send(guest1, query("a.test.", dns.TypeA))
	if resp, _ := c.reply(t, 2*time.Second); resp.Rcode != dns.RcodeRefused {
		t.Fatalf("unregistered session got %v", resp)
	}
	if q := up.Queries(); len(q) != 1 {
		t.Fatalf("upstream saw %v", q)
	}
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve returned %v", err)
	}
}

func TestServeSurvivesGarbage(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	c, _ := serveFake(t, tp)
	src := net.UDPAddrFromAddrPort(netip.AddrPortFrom(guest1, 5353))
	for i := range 1000 {
		c.in <- fakePacket{[]byte(strings.Repeat("x", i%700)), src}
	}
	q := query("a.test.", dns.TypeA)
	c.send(guest1, q)
	for {
		// Some garbage parses as a query with an odd opcode and gets a
		// 12-byte NOTIMP or FORMERR; skip those.
		resp, _ := c.reply(t, 5*time.Second)
		if resp.Id != q.Id {
			if len(resp.Answer)+len(resp.Ns)+len(resp.Extra) != 0 || resp.Rcode == dns.RcodeSuccess {
				t.Fatalf("garbage answered with %v", resp)
			}
			continue
		}
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Fatalf("after garbage: %v", resp)
		}
		break
	}
	// Every garbage packet is accounted for: dropped as malformed, shed by
	// the fairness limits, or answered with an error.
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := tp.Stats()
		total := st.Malformed + st.Shed
		for _, n := range st.Verdicts {
			total += n
		}
		if total == 1001 && st.Malformed > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("accounted %d of 1001 packets: %+v", total, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFairness: one session floods with queries its upstream answers
// slowly; another session still resolves promptly. A lone session may use
// every slot.
func TestFairness(t *testing.T) {
	var inflight, peak atomic.Int64
	zone := zoneHandler(map[string][]string{"fast.test.": {"fast.test. 60 IN A 198.18.1.10"}})
	up := startUpstream(t, func(w dns.ResponseWriter, req *dns.Msg, tcp bool) *dns.Msg {
		if strings.HasSuffix(req.Question[0].Name, ".flood.test.") {
			n := inflight.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			time.Sleep(300 * time.Millisecond)
			inflight.Add(-1)
			resp := new(dns.Msg)
			resp.SetRcode(req, dns.RcodeNameError)
			return resp
		}
		return zone(w, req, tcp)
	})
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) {
		c.MaxInFlight = 4
		c.SessionShare = 1
		c.Timeout = 2 * time.Second
	})
	tp.register(t, guest1, netpolicy.ModeAllowlist, "**.flood.test")
	tp.register(t, guest2, netpolicy.ModeAllowlist, "fast.test")
	c, _ := serveFake(t, tp)

	for i := range 200 {
		c.send(guest1, query("q"+strconv.Itoa(i)+".flood.test.", dns.TypeA))
	}
	deadline := time.Now().Add(2 * time.Second)
	for peak.Load() < 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if p := peak.Load(); p != 4 {
		t.Fatalf("lone flooding session reached %d upstream queries in flight, want all 4 slots", p)
	}
	start := time.Now()
	c.send(guest2, query("fast.test.", dns.TypeA))
	for {
		resp, to := c.reply(t, 3*time.Second)
		if to.String() != netip.AddrPortFrom(guest2, 40000).String() {
			continue // a flood answer
		}
		if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
			t.Fatalf("fast.test: %v", resp)
		}
		break
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("second session waited %v behind the flood", d)
	}
	if st := tp.Stats(); st.Shed == 0 {
		t.Fatalf("flood of 200 into 4 slots shed nothing: %+v", st)
	}
}

// TestServeLoopback runs the real socket path over UDP and TCP on
// 127.0.0.1, with 127.0.0.1 registered as a session's guest address.
func TestServeLoopback(t *testing.T) {
	up := startUpstream(t, zoneHandler(bigZone()))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.MaxAnswerAddrs = 100 })
	lo := netip.MustParseAddr("127.0.0.1")
	tp.register(t, lo, netpolicy.ModeAllowlist, "big.test")
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- tp.Serve(pc, ln) }()
	addr := pc.LocalAddr().String()

	udp := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
	r, _, err := udp.Exchange(query("big.test.", dns.TypeA), addr)
	if err != nil || !r.Truncated {
		t.Fatalf("udp: %v %v", r, err)
	}
	tcp := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	conn, err := tcp.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // several queries on one connection
		r, _, err = tcp.ExchangeWithConn(query("big.test.", dns.TypeA), conn)
		if err != nil || r.Truncated || len(r.Answer) != 60 {
			t.Fatalf("tcp: %v %v", r, err)
		}
	}
	r, _, err = tcp.ExchangeWithConn(query("denied.test.", dns.TypeA), conn)
	if err != nil || r.Rcode != dns.RcodeNameError {
		t.Fatalf("tcp denied: %v %v", r, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve returned %v", err)
	}
	if _, _, err := tcp.ExchangeWithConn(query("big.test.", dns.TypeA), conn); err == nil {
		t.Fatal("tcp connection still answered after Shutdown")
	}
	if _, _, err := (&dns.Client{Net: "udp", Timeout: 200 * time.Millisecond}).Exchange(query("big.test.", dns.TypeA), addr); err == nil {
		t.Fatal("udp still answered after Shutdown")
	}
	if err := tp.Serve(newFakePacketConn(), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve after Shutdown: %v", err)
	}
}

func TestShutdownAbortsSlowUpstream(t *testing.T) {
	up := startUpstream(t, func(dns.ResponseWriter, *dns.Msg, bool) *dns.Msg { return nil })
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.Timeout = 10 * time.Second })
	tp.register(t, guest1, netpolicy.ModePublic)
	c, done := serveFake(t, tp)
	c.send(guest1, query("a.test.", dns.TypeA))
	for len(up.Queries()) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := tp.Shutdown(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("Shutdown: %v after %v", err, time.Since(start))
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve returned %v", err)
	}
}
