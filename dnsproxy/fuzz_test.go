package dnsproxy

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// The seed corpora live in testdata/fuzz/<FuzzName>/ and run with every
// plain `go test`; `go test -fuzz=FuzzName` explores from them.

// FuzzMatcher checks the trie against netpolicy's reference semantics
// (Entry.MatchesName, which compares wire labels) for any entry list and
// any query name as it comes off the wire, escaped and non-ASCII names
// included, and that the ports it returns are exactly those of the
// matching entries.
func FuzzMatcher(f *testing.F) {
	f.Add("example.com,*.one.example.org,**.many.example.net", "a.one.example.org.")
	f.Add("api.example.com:443,**.example.com:80/tcp", "API.Example.COM")
	f.Add("example.com", "evilexample.com.")
	f.Add("*.a.b,**.a.b", "x.y.a.b")
	f.Add("*.miek.nl,**.miek.nl", `www\.miek.nl.`)
	f.Add("kelvin.example", "\u212aelvin.example.")
	f.Add("*.miek.nl", `\119ww.miek.nl.`)
	f.Fuzz(func(t *testing.T, list, name string) {
		var es []netpolicy.Entry
		for _, s := range strings.Split(list, ",") {
			if e, err := netpolicy.ParseEntry(s, nil); err == nil {
				es = append(es, e)
			}
		}
		m, err := newMatcher(es)
		if err != nil {
			t.Fatalf("entries that parsed did not compile: %v", err)
		}
		m.match(name) // must not panic on anything
		// The proxy sees names as miekg/dns unpacks them from the wire:
		// escaped ('\.', '\DDD' for other bytes, so non-ASCII too). Put the
		// name through the wire and compare on what comes back; a name
		// that cannot be packed only has to not panic.
		var buf [256]byte
		off, err := dns.PackDomainName(dns.Fqdn(name), buf[:], 0, nil, false)
		if err != nil {
			return
		}
		if name, _, err = dns.UnpackDomainName(buf[:off], 0); err != nil {
			return
		}
		got, ports, _ := m.match(name)
		want := false
		var wantPorts []netpolicy.PortSpec
		anyPort := false
		for _, e := range es {
			if e.MatchesName(name) {
				want = true
				if e.Port == 0 {
					anyPort = true
				} else if !slices.Contains(wantPorts, e.PortSpec) {
					wantPorts = append(wantPorts, e.PortSpec)
				}
			}
		}
		if got != want {
			t.Fatalf("match(%q) over %v = %v, reference %v", name, es, got, want)
		}
		if !got {
			return
		}
		if anyPort {
			if ports != nil {
				t.Fatalf("ports %v, want any (nil)", ports)
			}
			return
		}
		if len(ports) != len(wantPorts) {
			t.Fatalf("ports %v, want %v", ports, wantPorts)
		}
		for _, p := range wantPorts {
			if !slices.Contains(ports, p) {
				t.Fatalf("ports %v, want %v", ports, wantPorts)
			}
		}
	})
}

// fuzzUpstream is an in-memory upstream reached through the Dial seam: it
// answers every query with answer (its id and question set to the query's).
type fuzzUpstream struct {
	mu     sync.Mutex
	answer *dns.Msg
}

func (u *fuzzUpstream) dial(_ context.Context, network, _ string) (net.Conn, error) {
	return &fuzzConn{u: u, tcp: network == "tcp", replies: make(chan []byte, 64), closed: make(chan struct{})}, nil
}

// fuzzConn is one upstream socket: Write takes a query, Read returns the
// answers in order and blocks while there is none, until Close.
type fuzzConn struct {
	net.Conn
	u       *fuzzUpstream
	tcp     bool
	replies chan []byte
	left    []byte // rest of the answer being read
	closed  chan struct{}
	once    sync.Once
}

func (c *fuzzConn) Write(b []byte) (int, error) {
	raw := b
	if c.tcp {
		raw = b[2:]
	}
	q := new(dns.Msg)
	if err := q.Unpack(raw); err != nil {
		return 0, err
	}
	c.u.mu.Lock()
	a := c.u.answer.Copy()
	c.u.mu.Unlock()
	a.Id, a.Response, a.Question = q.Id, true, q.Question
	out, err := a.Pack()
	if err != nil {
		return 0, err
	}
	if c.tcp {
		out = append([]byte{byte(len(out) >> 8), byte(len(out))}, out...)
	}
	select {
	case c.replies <- out:
		return len(b), nil
	case <-c.closed:
		return 0, net.ErrClosed
	}
}

func (c *fuzzConn) Read(b []byte) (int, error) {
	if len(c.left) == 0 {
		select {
		case c.left = <-c.replies:
		case <-c.closed:
			return 0, net.ErrClosed
		}
	}
	n := copy(b, c.left)
	c.left = c.left[n:]
	return n, nil
}

func (c *fuzzConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *fuzzConn) SetDeadline(time.Time) error      { return nil }
func (c *fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fuzzConn) SetWriteDeadline(time.Time) error { return nil }
func (c *fuzzConn) LocalAddr() net.Addr              { return &net.UDPAddr{} }
func (c *fuzzConn) RemoteAddr() net.Addr             { return &net.UDPAddr{} }

// fuzzProxy is a proxy whose upstream is in memory and answers with a rich
// record mix for every name; guest1 allows **.ex.test, guest2 is public.
func fuzzProxy(t testing.TB) (*testProxy, *fuzzUpstream) {
	u := &fuzzUpstream{answer: new(dns.Msg)}
	for _, s := range []string{
		"a.ex.test. 60 IN CNAME b.ex.test.",
		"b.ex.test. 30 IN A 198.18.1.10",
		"b.ex.test. 30 IN A 10.99.0.10",
		"b.ex.test. 30 IN AAAA 2001:db8::1",
		`a.ex.test. 30 IN HTTPS 1 . ipv4hint="198.18.1.11,169.254.169.254" ipv6hint="2001:db8::1"`,
	} {
		u.answer.Answer = append(u.answer.Answer, mustRR(s))
	}
	tp := newTestProxy(t, []netip.AddrPort{netip.MustParseAddrPort("198.18.0.53:53")}, func(c *Config) { c.Dial = u.dial })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "**.ex.test", "a.ex.test")
	tp.register(t, guest2, netpolicy.ModePublic)
	return tp, u
}

// checkReply asserts the invariants of any reply: it parses, answers the
// query's id, and every address it carries (A records, ipv4hint) is public
// and was attested for the querying guest before the reply was built
// (unless the guest is in public mode: the public set accepts its traffic,
// so it attests nothing); it carries no IPv6 address and at most
// MaxAnswerAddrs addresses.
func checkReply(t *testing.T, tp *testProxy, src netip.Addr, req, out []byte) {
	t.Helper()
	if out == nil {
		return
	}
	resp := new(dns.Msg)
	if err := resp.Unpack(out); err != nil {
		t.Fatalf("reply does not parse: %v", err)
	}
	if len(req) >= 2 && resp.Id != uint16(req[0])<<8|uint16(req[1]) {
		t.Fatalf("reply id %d for query %x", resp.Id, req[:2])
	}
	if len(out) > dns.MaxMsgSize {
		t.Fatalf("reply of %d bytes", len(out))
	}
	attested := map[netip.Addr]bool{}
	for _, c := range tp.att.Calls() {
		if c.guest != src {
			continue
		}
		for _, ip := range c.ips {
			attested[ip] = true
		}
	}
	public := false
	if s := tp.session(src); s != nil && s.mode == netpolicy.ModePublic {
		public = true
		if len(attested) > 0 {
			t.Fatalf("public-mode guest %s attested %v", src, attested)
		}
	}
	guard := testGuard(t)
	released := map[netip.Addr]bool{}
	for _, rr := range slices.Concat(resp.Answer, resp.Ns, resp.Extra) {
		var addrs []net.IP
		switch r := rr.(type) {
		case *dns.A:
			addrs = append(addrs, r.A)
		case *dns.AAAA:
			t.Fatalf("AAAA in reply: %s", r)
		case *dns.SVCB:
			addrs = append(addrs, hints(t, r.Value)...)
		case *dns.HTTPS:
			addrs = append(addrs, hints(t, r.Value)...)
		}
		for _, ip := range addrs {
			a, _ := netip.AddrFromSlice(ip.To4())
			if !guard.IsPublicUnicast(a) || !attested[a] && !public {
				t.Fatalf("reply carries %s (public %v, attested %v): %s", a, guard.IsPublicUnicast(a), attested[a], rr)
			}
			released[a] = true
		}
	}
	if len(released) > tp.cfg.MaxAnswerAddrs {
		t.Fatalf("reply carries %d addresses, more than the cap %d", len(released), tp.cfg.MaxAnswerAddrs)
	}
}

func hints(t *testing.T, kvs []dns.SVCBKeyValue) []net.IP {
	var out []net.IP
	for _, kv := range kvs {
		switch h := kv.(type) {
		case *dns.SVCBIPv6Hint:
			t.Fatalf("ipv6hint in reply: %s", h)
		case *dns.SVCBIPv4Hint:
			out = append(out, h.Hint...)
		}
	}
	return out
}

// FuzzHandleRequest feeds raw bytes to the request handler, as if they had
// arrived over UDP (handleAsync) or TCP (handle) from a registered session
// or a stranger.
func FuzzHandleRequest(f *testing.F) {
	for _, m := range seedQueries() {
		raw, _ := m.Pack()
		f.Add(raw, uint8(0))
	}
	f.Add([]byte{}, uint8(1))
	f.Fuzz(func(t *testing.T, raw []byte, who uint8) {
		tp, _ := fuzzProxy(t)
		src := []netip.Addr{guest1, guest2, netip.MustParseAddr("10.20.0.10")}[int(who)%3]
		tcp := who&4 != 0
		var out []byte
		if tcp {
			out = tp.handle(context.Background(), src, raw, true)
		} else {
			out = tp.handleUDP(src, raw)
		}
		checkReply(t, tp, src, raw, out)
		if out != nil && !tcp && len(out) > maxUDPResponse {
			t.Fatalf("udp reply of %d bytes", len(out))
		}
	})
}

// FuzzUpstreamAnswer feeds arbitrary upstream answers (anything that
// parses) through the filter for an allowed query (asked over UDP: the
// upstream socket's reader finishes it).
func FuzzUpstreamAnswer(f *testing.F) {
	for _, m := range seedAnswers() {
		raw, _ := m.Pack()
		f.Add(raw, "a.ex.test.")
	}
	f.Fuzz(func(t *testing.T, answer []byte, qname string) {
		a := new(dns.Msg)
		if a.Unpack(answer) != nil {
			return
		}
		if _, ok := dns.IsDomainName(qname); !ok {
			return
		}
		tp, u := fuzzProxy(t)
		u.answer = a
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(qname), dns.TypeA)
		q.SetEdns0(4096, false)
		req, err := q.Pack()
		if err != nil {
			return
		}
		out := tp.handleUDP(guest2, req)
		if out == nil {
			t.Fatal("a valid query got no reply")
		}
		checkReply(t, tp, guest2, req, out)
	})
}

func seedQueries() []*dns.Msg {
	var out []*dns.Msg
	for _, q := range []struct {
		name string
		t    uint16
	}{{"a.ex.test.", dns.TypeA}, {"A.EX.TEST", dns.TypeAAAA}, {"a.ex.test.", dns.TypeHTTPS}, {"x.y.ex.test.", dns.TypeTXT}, {"denied.example.", dns.TypeA}} {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(q.name), q.t)
		out = append(out, m)
	}
	e := new(dns.Msg)
	e.SetQuestion("a.ex.test.", dns.TypeA)
	e.SetEdns0(1232, true)
	two := new(dns.Msg)
	two.SetQuestion("a.ex.test.", dns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	return append(out, e, two)
}

func seedAnswers() []*dns.Msg {
	mk := func(rrs ...string) *dns.Msg {
		m := new(dns.Msg)
		m.Response = true
		for _, s := range rrs {
			m.Answer = append(m.Answer, mustRR(s))
		}
		return m
	}
	big := make([]string, 0, 80)
	for i := range 80 {
		big = append(big, "a.ex.test. 1 IN A 198.18.4."+strconv.Itoa(i))
	}
	return []*dns.Msg{
		mk("a.ex.test. 60 IN A 198.18.1.10", "a.ex.test. 60 IN A 127.0.0.1"),
		mk("a.ex.test. 60 IN CNAME c.ex.test.", "c.ex.test. 5 IN CNAME a.ex.test.", "c.ex.test. 5 IN A 198.18.1.10"),
		mk(`a.ex.test. 60 IN SVCB 1 . ipv4hint="10.0.0.1" ipv6hint="::1"`),
		mk("a.ex.test. 60 IN A 169.254.169.254", "other.test. 60 IN A 198.18.1.11"),
		mk(big...),
	}
}

// TestFuzzProxyAnswers makes sure the fuzz targets exercise the allowed
// path (a CNAME chain, a dropped private address, hints, an attestation)
// and not only error paths.
func TestFuzzProxyAnswers(t *testing.T) {
	tp, _ := fuzzProxy(t)
	resp := tp.ask(t, guest1, query("a.ex.test.", dns.TypeA), false)
	if got := addrsOf(resp.Answer); !slices.Equal(got, mustAddrs("198.18.1.10")) {
		t.Fatalf("reply %v", resp)
	}
	calls := tp.att.Calls()
	if len(calls) != 1 || !slices.Equal(calls[0].ips, mustAddrs("198.18.1.10", "198.18.1.11")) || calls[0].ttl != 30*time.Second {
		t.Fatalf("attest calls %+v", calls)
	}
	resp = tp.ask(t, guest1, query("a.ex.test.", dns.TypeA), true)
	if len(addrsOf(resp.Answer)) != 1 {
		t.Fatalf("tcp reply %v", resp)
	}
}
