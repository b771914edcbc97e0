package dnsproxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/netpolicy"
)

var (
	guest1 = netip.MustParseAddr("10.20.0.2")
	guest2 = netip.MustParseAddr("10.20.0.6")
)

// testGuard treats 198.18.0.0/15 as public, like the test world.
func testGuard(t testing.TB) *netpolicy.Guard {
	t.Helper()
	g, err := netpolicy.NewGuard(netip.MustParsePrefix("10.20.0.0/16"), []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// attestCall is one recorded Attest call.
type attestCall struct {
	guest netip.Addr
	ips   []netip.Addr
	ttl   time.Duration
	ports []netpolicy.PortSpec
}

// fakeAttester records calls and clamps ttl up to floor, like the firewall.
type fakeAttester struct {
	floor time.Duration
	err   error
	delay time.Duration

	mu    sync.Mutex
	calls []attestCall
}

func (f *fakeAttester) Attest(guest netip.Addr, ips []netip.Addr, ttl time.Duration, ports []netpolicy.PortSpec) (time.Duration, error) {
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, attestCall{guest, slices.Clone(ips), ttl, slices.Clone(ports)})
	if f.err != nil {
		return 0, f.err
	}
	return max(ttl, f.floor), nil
}

func (f *fakeAttester) Calls() []attestCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// eventLog is an EventSink that keeps everything.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (l *eventLog) Record(e Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) All() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

func (l *eventLog) Last(t *testing.T) Event {
	t.Helper()
	all := l.All()
	if len(all) == 0 {
		t.Fatal("no event recorded")
	}
	return all[len(all)-1]
}

// upstream is a miekg/dns server on 127.0.0.1 (UDP and TCP on the same
// port) that answers with handler and logs every query it receives.
type upstream struct {
	addr netip.AddrPort

	mu      sync.Mutex
	queries []string // "name TYPE net"
}

// handlerFunc builds the upstream's reply (nil: no reply).
type handlerFunc func(w dns.ResponseWriter, req *dns.Msg, tcp bool) *dns.Msg

func startUpstream(t testing.TB, h handlerFunc) *upstream {
	t.Helper()
	pc, ln := listenPair(t)
	port := pc.LocalAddr().(*net.UDPAddr).Port
	u := &upstream{addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))}
	serve := func(tcp bool) dns.HandlerFunc {
		return func(w dns.ResponseWriter, req *dns.Msg) {
			network := "udp"
			if tcp {
				network = "tcp"
			}
			u.mu.Lock()
			if len(req.Question) > 0 {
				u.queries = append(u.queries, req.Question[0].Name+" "+dns.TypeToString[req.Question[0].Qtype]+" "+network)
			}
			u.mu.Unlock()
			if resp := h(w, req, tcp); resp != nil {
				w.WriteMsg(resp)
			}
		}
	}
	us := &dns.Server{PacketConn: pc, Handler: serve(false)}
	ts := &dns.Server{Listener: ln, Handler: serve(true)}
	started := make(chan struct{}, 2)
	us.NotifyStartedFunc = func() { started <- struct{}{} }
	ts.NotifyStartedFunc = func() { started <- struct{}{} }
	go us.ActivateAndServe()
	go ts.ActivateAndServe()
	<-started
	<-started
	t.Cleanup(func() {
		us.Shutdown()
		ts.Shutdown()
	})
	return u
}

// listenPair opens UDP and TCP on the same free port of 127.0.0.1. The
// UDP port is the kernel's choice; its TCP twin may be taken (other tests
// on the machine use loopback ports too), so it tries a few ports.
func listenPair(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	var err error
	for range 20 {
		var pc net.PacketConn
		pc, err = net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		var ln net.Listener
		ln, err = net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			return pc, ln
		}
		pc.Close()
	}
	t.Fatalf("no free udp and tcp port pair: %v", err)
	return nil, nil
}

func (u *upstream) Queries() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.queries)
}

// zoneHandler answers every query with the records given for its name
// (presentation format, any type: the test decides what comes back), or
// NXDOMAIN when there are none. Over UDP it truncates to the size the
// query advertises, like a real server.
func zoneHandler(records map[string][]string) handlerFunc {
	return func(_ dns.ResponseWriter, req *dns.Msg, tcp bool) *dns.Msg {
		resp := new(dns.Msg)
		resp.SetReply(req)
		rrs, ok := records[dns.CanonicalName(req.Question[0].Name)]
		if !ok {
			resp.Rcode = dns.RcodeNameError
			return resp
		}
		for _, s := range rrs {
			rr, err := dns.NewRR(s)
			if err != nil {
				panic(err)
			}
			resp.Answer = append(resp.Answer, rr)
		}
		if !tcp {
			size := dns.MinMsgSize
			if opt := req.IsEdns0(); opt != nil {
				size = int(opt.UDPSize())
			}
			resp.Truncate(size)
		}
		return resp
	}
}

type testProxy struct {
	*Proxy
	att    *fakeAttester
	events *eventLog
}

// newTestProxy builds a proxy for upstreams with a fake attester, after
// mod adjusts the config.
func newTestProxy(t testing.TB, upstreams []netip.AddrPort, mod func(*Config)) *testProxy {
	t.Helper()
	tp := &testProxy{att: &fakeAttester{}, events: &eventLog{}}
	cfg := Config{
		Upstreams: upstreams,
		Timeout:   500 * time.Millisecond,
		Guard:     testGuard(t),
		Attester:  tp.att,
		Events:    tp.events,
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tp.Proxy = p
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Shutdown(ctx)
	})
	return tp
}

// entries parses allow entries that are test constants.
func entries(ss ...string) []netpolicy.Entry {
	var out []netpolicy.Entry
	for _, s := range ss {
		e, err := netpolicy.ParseEntry(s, nil)
		if err != nil {
			panic(err)
		}
		out = append(out, e)
	}
	return out
}

func (tp *testProxy) register(t testing.TB, guest netip.Addr, mode netpolicy.Mode, allow ...string) {
	t.Helper()
	if err := tp.Register(SessionPolicy{Name: "s-" + guest.String(), Guest: guest, Mode: mode, Allow: entries(allow...)}); err != nil {
		t.Fatal(err)
	}
}

// ask sends one query through the handler as if from src over UDP (tcp
// false: through handleAsync, the path Serve's UDP readers take) or TCP
// (handle) and returns the parsed reply (nil when dropped).
func (tp *testProxy) ask(t testing.TB, src netip.Addr, q *dns.Msg, tcp bool) *dns.Msg {
	t.Helper()
	raw, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	if tcp {
		out = tp.handle(context.Background(), src, raw, true)
	} else {
		out = tp.handleUDP(src, raw)
	}
	if out == nil {
		return nil
	}
	resp := new(dns.Msg)
	if err := resp.Unpack(out); err != nil {
		t.Fatalf("reply does not parse: %v", err)
	}
	if resp.Id != q.Id {
		t.Fatalf("reply id %d, want %d", resp.Id, q.Id)
	}
	return resp
}

// handleUDP answers raw from src as Serve's UDP readers do (handleAsync)
// and returns the reply once it is sent (nil: dropped).
func (tp *testProxy) handleUDP(src netip.Addr, raw []byte) []byte {
	r := &chanReplier{out: make(chan []byte, 1)}
	tp.handleAsync(src, raw, r)
	return <-r.out
}

// chanReplier hands the reply over a channel once the decision is
// recorded (done).
type chanReplier struct {
	out  chan []byte
	sent []byte
}

func (r *chanReplier) send(out []byte) { r.sent = out }
func (r *chanReplier) done()           { r.out <- r.sent }

func query(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

func addrsOf(rrs []dns.RR) []netip.Addr {
	var out []netip.Addr
	for _, rr := range rrs {
		if a, ok := rr.(*dns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A.To4())
			out = append(out, ip)
		}
	}
	return out
}

func mustAddrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

var errInjected = errors.New("injected failure")

// fakePacketConn is a net.PacketConn fed by the test: packets in appear
// to come from the address the test chooses; replies are collected.
type fakePacketConn struct {
	in     chan fakePacket
	out    chan fakePacket
	closed chan struct{}
	once   sync.Once

	mu       sync.Mutex
	deadline time.Time
}

type fakePacket struct {
	data []byte
	addr net.Addr
}

func newFakePacketConn() *fakePacketConn {
	return &fakePacketConn{in: make(chan fakePacket, 4096), out: make(chan fakePacket, 4096), closed: make(chan struct{})}
}

func (c *fakePacketConn) send(src netip.Addr, m *dns.Msg) {
	raw, err := m.Pack()
	if err != nil {
		panic(err)
	}
	c.in <- fakePacket{raw, net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 40000))}
}

func (c *fakePacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		c.mu.Lock()
		d := c.deadline
		c.mu.Unlock()
		if !d.IsZero() && !time.Now().Before(d) {
			return 0, nil, timeoutErr{}
		}
		select {
		case p := <-c.in:
			return copy(b, p.data), p.addr, nil
		case <-c.closed:
			return 0, nil, net.ErrClosed
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (c *fakePacketConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	case c.out <- fakePacket{append([]byte(nil), b...), addr}:
		return len(b), nil
	}
}

func (c *fakePacketConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *fakePacketConn) LocalAddr() net.Addr {
	return net.UDPAddrFromAddrPort(netip.MustParseAddrPort("10.20.255.254:53"))
}

func (c *fakePacketConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }
func (c *fakePacketConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return nil
}
func (c *fakePacketConn) SetWriteDeadline(time.Time) error { return nil }

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
