package dnsproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// rawUpstream is a UDP server on 127.0.0.1 whose answers the test scripts:
// every query it reads is passed to the test's channel, and the test sends
// what it likes back with reply.
type rawUpstream struct {
	pc      net.PacketConn
	queries chan rawQuery
}

type rawQuery struct {
	msg  *dns.Msg
	from net.Addr
}

func startRawUpstream(t *testing.T) *rawUpstream {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{pc: pc, queries: make(chan rawQuery, 1024)}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			m := new(dns.Msg)
			if m.Unpack(buf[:n]) == nil {
				u.queries <- rawQuery{m, from}
			}
		}
	}()
	return u
}

func (u *rawUpstream) addr() string { return u.pc.LocalAddr().String() }

// next returns the next query the upstream received.
func (u *rawUpstream) next(t *testing.T) rawQuery {
	t.Helper()
	select {
	case q := <-u.queries:
		return q
	case <-time.After(5 * time.Second):
		t.Fatal("upstream got no query")
		return rawQuery{}
	}
}

// answer is q's reply carrying one A record whose address encodes the
// name (so the test can tell which query an answer belongs to).
func answerFor(q *dns.Msg, a string) *dns.Msg {
	r := new(dns.Msg)
	r.SetReply(q)
	r.Answer = []dns.RR{mustRR(q.Question[0].Name + " 60 IN A " + a)}
	return r
}

func (u *rawUpstream) reply(t *testing.T, to net.Addr, m *dns.Msg) {
	t.Helper()
	raw, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.pc.WriteTo(raw, to); err != nil {
		t.Fatal(err)
	}
}

// countingDial dials real UDP sockets and remembers them.
type countingDial struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (d *countingDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := defaultDial(ctx, network, addr)
	if err == nil {
		d.mu.Lock()
		d.conns = append(d.conns, c)
		d.mu.Unlock()
	}
	return c, err
}

func (d *countingDial) all() []net.Conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.conns)
}

// packQuery packs a query for name the way forward does.
func packQuery(t *testing.T, name string) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.SetEdns0(ednsSize, false)
	raw, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func testPool(t *testing.T, u *rawUpstream, size, maxQueries int) (*udpPool, *countingDial) {
	d := &countingDial{}
	p := newUDPPool(u.addr(), d.dial, size, maxQueries)
	t.Cleanup(p.close)
	return p, d
}

type exchangeResult struct {
	r   *dns.Msg
	err error
}

func goExchange(ctx context.Context, p *udpPool, query []byte) chan exchangeResult {
	ch := make(chan exchangeResult, 1)
	go func() {
		r, err := p.exchange(ctx, query)
		ch <- exchangeResult{r, err}
	}()
	return ch
}

func waitResult(t *testing.T, ch chan exchangeResult) exchangeResult {
	t.Helper()
	select {
	case res := <-ch:
		return res
	case <-time.After(5 * time.Second):
		t.Fatal("exchange did not return")
		return exchangeResult{}
	}
}

func TestUDPPoolConcurrentQueriesOneSocket(t *testing.T) {
	u := startRawUpstream(t)
	p, d := testPool(t, u, 1, 1<<20)
	const n = 200
	results := make([]chan exchangeResult, n)
	for i := range n {
		results[i] = goExchange(context.Background(), p, packQuery(t, fmt.Sprintf("q%d.test.", i)))
	}
	// Answer all of them, in an order unrelated to the sending order.
	var got []rawQuery
	for range n {
		got = append(got, u.next(t))
	}
	rand.Shuffle(len(got), func(i, j int) { got[i], got[j] = got[j], got[i] })
	ids := map[uint16]bool{}
	for _, q := range got {
		var i int
		fmt.Sscanf(q.msg.Question[0].Name, "q%d.test.", &i)
		ids[q.msg.Id] = true
		u.reply(t, q.from, answerFor(q.msg, fmt.Sprintf("198.18.%d.%d", i/256, i%256)))
	}
	for i, ch := range results {
		res := waitResult(t, ch)
		if res.err != nil {
			t.Fatalf("query %d: %v", i, res.err)
		}
		want := fmt.Sprintf("198.18.%d.%d", i/256, i%256)
		if a := addrsOf(res.r.Answer); len(a) != 1 || a[0] != netip.MustParseAddr(want) {
			t.Fatalf("query %d got %v, want %s", i, res.r.Answer, want)
		}
	}
	if len(ids) != n {
		t.Fatalf("%d distinct ids for %d queries in flight", len(ids), n)
	}
	if c := d.all(); len(c) != 1 {
		t.Fatalf("%d sockets dialled, want 1", len(c))
	}
}

func TestUDPPoolLateReplyDropped(t *testing.T) {
	u := startRawUpstream(t)
	p, _ := testPool(t, u, 1, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	first := goExchange(ctx, p, packQuery(t, "same.test."))
	q1 := u.next(t)
	if res := waitResult(t, first); !errors.Is(res.err, context.DeadlineExceeded) {
		t.Fatalf("timed-out query: %v", res.err)
	}
	s := p.slots[0].cur
	s.mu.Lock()
	left := len(s.pending)
	s.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d waiters left after the timeout", left)
	}
	// The late answer (the same question) arrives while a second query is
	// in flight: only the second query's own answer may reach it.
	second := goExchange(context.Background(), p, packQuery(t, "same.test."))
	q2 := u.next(t)
	want := mustAddrs("198.18.0.2")
	if q2.msg.Id == q1.msg.Id {
		// 1 in 65536: the same id and question, so the late answer is a
		// genuine answer to the second query too.
		want = mustAddrs("198.18.0.1")
	}
	u.reply(t, q1.from, answerFor(q1.msg, "198.18.0.1"))
	time.Sleep(20 * time.Millisecond)
	u.reply(t, q2.from, answerFor(q2.msg, "198.18.0.2"))
	res := waitResult(t, second)
	if res.err != nil || !slices.Equal(addrsOf(res.r.Answer), want) {
		t.Fatalf("second query got %v, %v", res.r, res.err)
	}
}

func TestUDPPoolIgnoresMismatchedQuestion(t *testing.T) {
	u := startRawUpstream(t)
	p, _ := testPool(t, u, 1, 1<<20)
	ch := goExchange(context.Background(), p, packQuery(t, "a.test."))
	q := u.next(t)
	// The right id but another name, type or class: ignored.
	evil := answerFor(q.msg, "198.18.6.6")
	evil.Question[0].Name = "evil.test."
	u.reply(t, q.from, evil)
	otherType := answerFor(q.msg, "198.18.6.7")
	otherType.Question[0].Qtype = dns.TypeTXT
	u.reply(t, q.from, otherType)
	otherClass := answerFor(q.msg, "198.18.6.8")
	otherClass.Question[0].Qclass = dns.ClassCHAOS
	u.reply(t, q.from, otherClass)
	// The same question with the name in other case is the answer.
	good := answerFor(q.msg, "198.18.0.1")
	good.Question[0].Name = "A.Test."
	u.reply(t, q.from, good)
	res := waitResult(t, ch)
	if res.err != nil || !slices.Equal(addrsOf(res.r.Answer), mustAddrs("198.18.0.1")) {
		t.Fatalf("got %v, %v", res.r, res.err)
	}

	// Only a mismatched answer: the query times out.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	ch = goExchange(ctx, p, packQuery(t, "b.test."))
	q = u.next(t)
	evil = answerFor(q.msg, "198.18.6.6")
	evil.Question[0].Name = "evil.test."
	u.reply(t, q.from, evil)
	if res := waitResult(t, ch); !errors.Is(res.err, context.DeadlineExceeded) {
		t.Fatalf("query answered only for another question: %v, %v", res.r, res.err)
	}
}

func TestUDPPoolRedialsAfterSocketError(t *testing.T) {
	u := startRawUpstream(t)
	p, d := testPool(t, u, 1, 1<<20)
	ch := goExchange(context.Background(), p, packQuery(t, "a.test."))
	first := u.next(t)
	// The socket fails under a waiting query: the query is asked again at
	// once on a fresh socket, not failed and not left to its timeout.
	d.all()[0].Close()
	q := u.next(t)
	if q.from.String() == first.from.String() || q.msg.Question[0].Name != "a.test." {
		t.Fatalf("retry from %s for %v, first try from %s", q.from, q.msg.Question, first.from)
	}
	u.reply(t, q.from, answerFor(q.msg, "198.18.0.2"))
	if res := waitResult(t, ch); res.err != nil || !slices.Equal(addrsOf(res.r.Answer), mustAddrs("198.18.0.2")) {
		t.Fatalf("after re-dial: %v, %v", res.r, res.err)
	}
	// The next query uses the fresh socket.
	ch = goExchange(context.Background(), p, packQuery(t, "b.test."))
	q = u.next(t)
	u.reply(t, q.from, answerFor(q.msg, "198.18.0.3"))
	if res := waitResult(t, ch); res.err != nil || !slices.Equal(addrsOf(res.r.Answer), mustAddrs("198.18.0.3")) {
		t.Fatalf("next query: %v, %v", res.r, res.err)
	}
	if n := len(d.all()); n != 2 {
		t.Fatalf("%d sockets dialled, want 2", n)
	}
}

// refusingDial dials real sockets; the first one it makes returns
// ECONNREFUSED from Read once a query was written on it, as a connected
// UDP socket does after an ICMP port unreachable (which an off-path sender
// can forge) arrives for it.
type refusingDial struct {
	mu     sync.Mutex
	dialed int
}

func (d *refusingDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := defaultDial(ctx, network, addr)
	if err != nil || network != "udp" {
		return c, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dialed++
	if d.dialed > 1 {
		return c, nil
	}
	return &refusingConn{Conn: c, written: make(chan struct{})}, nil
}

func (d *refusingDial) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dialed
}

type refusingConn struct {
	net.Conn
	once    sync.Once
	written chan struct{}
}

func (c *refusingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.once.Do(func() { close(c.written) })
	return n, err
}

func (c *refusingConn) Read(b []byte) (int, error) {
	<-c.written
	return 0, &net.OpError{Op: "read", Net: "udp", Err: os.NewSyscallError("recvfrom", syscall.ECONNREFUSED)}
}

func TestUDPPoolRetriesAfterRefused(t *testing.T) {
	u := startRawUpstream(t)
	d := &refusingDial{}
	p := newUDPPool(u.addr(), d.dial, 2, 1<<20)
	t.Cleanup(p.close)
	ch := goExchange(context.Background(), p, packQuery(t, "a.test."))
	u.next(t) // the try on the socket that gets refused
	q := u.next(t)
	u.reply(t, q.from, answerFor(q.msg, "198.18.0.2"))
	if res := waitResult(t, ch); res.err != nil || !slices.Equal(addrsOf(res.r.Answer), mustAddrs("198.18.0.2")) {
		t.Fatalf("query whose socket was refused: %v, %v", res.r, res.err)
	}
	if n := d.count(); n != 2 {
		t.Fatalf("%d sockets dialled, want 2 (the refused one replaced)", n)
	}
}

// TestForwardSurvivesRefusedSocket: with a single upstream, a query whose
// socket gets ECONNREFUSED is answered (and attested), not SERVFAIL.
func TestForwardSurvivesRefusedSocket(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	d := &refusingDial{}
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.Dial = d.dial })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	resp := tp.ask(t, guest1, query("a.test.", dns.TypeA), false)
	if resp.Rcode != dns.RcodeSuccess || !slices.Equal(addrsOf(resp.Answer), mustAddrs("198.18.1.10")) {
		t.Fatalf("reply %v (event %+v)", resp, tp.events.Last(t))
	}
	if d.count() != 2 || len(tp.att.Calls()) != 1 {
		t.Fatalf("%d sockets dialled, %d attests", d.count(), len(tp.att.Calls()))
	}
}

func TestUDPPoolRefusedFailsPromptly(t *testing.T) {
	// A port with no listener: the kernel's ICMP error fails the query.
	p := newUDPPool("127.0.0.1:1", defaultDial, 1, 1<<20)
	defer p.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := p.exchange(ctx, packQuery(t, "a.test."))
	if err == nil || errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Fatalf("got %v after %v, want connection refused at once", err, time.Since(start))
	}
}

func TestUDPPoolReplacesUsedSockets(t *testing.T) {
	u := startRawUpstream(t)
	p, d := testPool(t, u, 1, 3)
	var ports []string
	for i := range 7 {
		ch := goExchange(context.Background(), p, packQuery(t, fmt.Sprintf("q%d.test.", i)))
		q := u.next(t)
		ports = append(ports, q.from.String())
		u.reply(t, q.from, answerFor(q.msg, "198.18.0.1"))
		if res := waitResult(t, ch); res.err != nil {
			t.Fatal(res.err)
		}
	}
	if n := len(d.all()); n != 3 {
		t.Fatalf("%d sockets for 7 queries at 3 per socket, want 3", n)
	}
	if ports[0] != ports[2] || ports[2] == ports[3] || ports[3] != ports[5] || ports[5] == ports[6] {
		t.Fatalf("source ports %v", ports)
	}
	// The replaced sockets were closed once their queries were answered.
	for _, c := range d.all()[:2] {
		if _, err := c.Write([]byte{0}); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("replaced socket still open: %v", err)
		}
	}
}

func TestUDPPoolClose(t *testing.T) {
	u := startRawUpstream(t)
	p, _ := testPool(t, u, 2, 1<<20)
	ch := goExchange(context.Background(), p, packQuery(t, "a.test."))
	u.next(t)
	p.close()
	if res := waitResult(t, ch); !errors.Is(res.err, ErrClosed) {
		t.Fatalf("waiting query after close: %v", res.err)
	}
	if _, err := p.exchange(context.Background(), packQuery(t, "b.test.")); !errors.Is(err, ErrClosed) {
		t.Fatalf("query after close: %v", err)
	}
}

func TestUDPPoolDropsGarbage(t *testing.T) {
	u := startRawUpstream(t)
	p, _ := testPool(t, u, 1, 1<<20)
	ch := goExchange(context.Background(), p, packQuery(t, "a.test."))
	q := u.next(t)
	for _, junk := range [][]byte{{}, {1, 2, 3}, make([]byte, 12), make([]byte, 9000)} {
		if _, err := u.pc.WriteTo(junk, q.from); err != nil {
			t.Fatal(err)
		}
	}
	// A query (QR clear) with the right id and question is not an answer.
	echo, _ := q.msg.Pack()
	u.pc.WriteTo(echo, q.from)
	u.reply(t, q.from, answerFor(q.msg, "198.18.0.1"))
	if res := waitResult(t, ch); res.err != nil || !slices.Equal(addrsOf(res.r.Answer), mustAddrs("198.18.0.1")) {
		t.Fatalf("got %v, %v", res.r, res.err)
	}
}

func TestSameQuestion(t *testing.T) {
	q, _ := wireQuestion(packQuery(t, "www.Example.test."))
	pack := func(mod func(*dns.Msg)) []byte {
		m := new(dns.Msg)
		m.SetQuestion("www.Example.test.", dns.TypeA)
		m.Response = true
		if mod != nil {
			mod(m)
		}
		raw, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	for _, tc := range []struct {
		name string
		pkt  []byte
		want bool
	}{
		{"same", pack(nil), true},
		{"other case", pack(func(m *dns.Msg) { m.Question[0].Name = "WWW.EXAMPLE.TEST." }), true},
		{"other name", pack(func(m *dns.Msg) { m.Question[0].Name = "www.example.tesu." }), false},
		{"longer name", pack(func(m *dns.Msg) { m.Question[0].Name = "www.example.test.x." }), false},
		{"other type", pack(func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAAAA }), false},
		{"other class", pack(func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }), false},
		{"two questions", pack(func(m *dns.Msg) { m.Question = append(m.Question, m.Question[0]) }), false},
		{"no question", pack(func(m *dns.Msg) { m.Question = nil }), false},
		{"cut short", pack(nil)[:20], false},
		{"pointer", append(pack(func(m *dns.Msg) { m.Question = nil })[:12:12], 0xc0, 12, 0, 1, 0, 1), false},
	} {
		if len(tc.pkt) >= 6 && tc.name == "pointer" {
			tc.pkt[5] = 1 // qdcount
		}
		if got := sameQuestion(tc.pkt, q); got != tc.want {
			t.Errorf("%s: sameQuestion = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// BenchmarkUDPPoolExchange measures one query and answer through a pool
// against a local echo upstream.
func BenchmarkUDPPoolExchange(b *testing.B) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			buf[2] |= 0x80 // QR: the query itself is its answer
			pc.WriteTo(buf[:n], from)
		}
	}()
	p := newUDPPool(pc.LocalAddr().String(), defaultDial, udpSockets, udpSocketQueries)
	defer p.close()
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	m.SetEdns0(ednsSize, false)
	var fails atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		query, _ := m.Pack()
		for pb.Next() {
			if _, err := p.exchange(context.Background(), query); err != nil {
				fails.Add(1)
			}
		}
	})
	if n := fails.Load(); n > 0 {
		b.Fatalf("%d failed exchanges", n)
	}
}

// BenchmarkHandleAllowed measures the whole answer path of an allowed
// query (parse, match, forward over the pool, filter, attest with a fake,
// pack) against a local upstream that answers from a template.
func BenchmarkHandleAllowed(b *testing.B) {
	up := templateUpstream(b)
	tp := newTestProxy(b, []netip.AddrPort{up}, func(c *Config) { c.Events = nil })
	tp.register(b, guest1, netpolicy.ModeAllowlist, "a.test")
	q := query("a.test.", dns.TypeA)
	q.SetEdns0(1232, false)
	raw, _ := q.Pack()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if out := tp.handle(context.Background(), guest1, raw, false); out == nil {
				b.Error("no reply")
			}
		}
	})
}

// BenchmarkServeUDP measures queries answered per second through Serve's
// real UDP path (reader, scheduler, upstream pool, filter, attest with a
// fake, reply) from one client on 127.0.0.1 (one registered session) with
// up to 64 queries outstanding, against a local upstream that answers from
// a template.
func BenchmarkServeUDP(b *testing.B) {
	up := templateUpstream(b)
	tp := newTestProxy(b, []netip.AddrPort{up}, func(c *Config) { c.Events = nil })
	lo := netip.MustParseAddr("127.0.0.1")
	tp.register(b, lo, netpolicy.ModeAllowlist, "a.test")
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go tp.Serve(pc, nil)
	q := query("a.test.", dns.TypeA)
	q.SetEdns0(1232, false)
	raw, _ := q.Pack()
	c, err := net.Dial("udp4", pc.LocalAddr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	// Like dnsperf: one sender keeping up to window queries outstanding,
	// one receiver; a query lost for a second frees its place.
	const window = 64
	outstanding := make(chan struct{}, window)
	lost := 0
	cpu0 := processCPU(b)
	b.ResetTimer()
	go func() {
		for range b.N {
			outstanding <- struct{}{}
			c.Write(raw)
		}
	}()
	buf := make([]byte, 4096)
	for got := 0; got+lost < b.N; {
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(buf); err != nil {
			for len(outstanding) > 0 {
				<-outstanding
				lost++
			}
			continue
		}
		<-outstanding
		got++
	}
	b.StopTimer()
	// CPU of the whole process (clients and upstream included, the same
	// for every version of the proxy) per query: less sensitive than ns/op
	// to other load on the machine.
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
	if lost > 0 {
		b.Logf("%d queries lost", lost)
	}
}

// BenchmarkServeUDPPingPong is BenchmarkServeUDP with one query
// outstanding at a time: the round trip of a lone query through Serve
// (the low-rate path: every goroutine on it wakes from the poller), as
// the figure's p99 at a fixed low rate sees it.
func BenchmarkServeUDPPingPong(b *testing.B) {
	up := templateUpstream(b)
	tp := newTestProxy(b, []netip.AddrPort{up}, func(c *Config) { c.Events = nil })
	tp.register(b, netip.MustParseAddr("127.0.0.1"), netpolicy.ModeAllowlist, "a.test")
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go tp.Serve(pc, nil)
	q := query("a.test.", dns.TypeA)
	q.SetEdns0(1232, false)
	raw, _ := q.Pack()
	c, err := net.Dial("udp4", pc.LocalAddr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 4096)
	lats := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		c.Write(raw)
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(buf); err != nil {
			continue // lost: its place is taken by the next
		}
		lats = append(lats, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lats)
	if len(lats) > 0 {
		b.ReportMetric(float64(lats[len(lats)/2].Microseconds()), "p50-us")
		b.ReportMetric(float64(lats[len(lats)*99/100].Microseconds()), "p99-us")
	}
}

// processCPU returns the user and system CPU time the process used so far.
func processCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestPackUpstreamQueryWire checks that the hand-packed upstream query is
// byte for byte what dns.Msg packs for the same question and flags (id 0,
// RD, CD as asked, one OPT record advertising ednsSize, DO as asked), for
// names with escapes, the root and the longest name, in a buffer too small
// too.
func TestPackUpstreamQueryWire(t *testing.T) {
	long := strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("b", 61) + "."
	for _, name := range []string{"a.test.", "Mixed.Case.Example.ORG.", `esc\.aped.example.`, `d\065y.example.`, ".", long} {
		for _, fl := range []queryFlags{{}, {cd: true}, {do: true}, {cd: true, do: true}} {
			for _, size := range []int{asyncQueryBufSize, 16} {
				q := dns.Question{Name: name, Qtype: dns.TypeHTTPS, Qclass: dns.ClassINET}
				m := dns.Msg{Question: []dns.Question{q}}
				m.RecursionDesired = true
				m.CheckingDisabled = fl.cd
				m.SetEdns0(ednsSize, fl.do)
				want, err := m.Pack()
				if err != nil {
					t.Fatal(err)
				}
				frame, err := packUpstreamQuery(q, fl, make([]byte, size))
				if err != nil {
					t.Fatalf("%q %+v: %v", name, fl, err)
				}
				if !bytes.Equal(frame[2:], want) {
					t.Errorf("%q %+v buf %d:\n got %x\nwant %x", name, fl, size, frame[2:], want)
				}
			}
		}
	}
	if _, err := packUpstreamQuery(dns.Question{Name: "a..b.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, queryFlags{}, make([]byte, 64)); err == nil {
		t.Error("a name with an empty label packed, want an error")
	}
}

// templateUpstream is a local upstream for the benchmarks that answers
// every query with one A record of a.test, under the query's ID; it is
// closed when the benchmark ends.
func templateUpstream(b *testing.B) netip.AddrPort {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pc.Close() })
	tmpl := new(dns.Msg)
	tmpl.SetQuestion("a.test.", dns.TypeA)
	tmpl.Response = true
	tmpl.Answer = []dns.RR{mustRR("a.test. 60 IN A 198.18.1.10")}
	answer, _ := tmpl.Pack()
	go func() {
		buf := make([]byte, 4096)
		out := slices.Clone(answer)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			copy(out, buf[:2])
			pc.WriteTo(out, from)
		}
	}()
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}
