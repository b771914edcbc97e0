package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Live attacks on the DNS proxy: each test
// performs the attack the way a sandbox, a local user or an off-path
// packet would, watches what got through, and has a positive control in
// the same run.

// dpSlowDNS is a DNS server in the simulated internet, on the world DNS
// server's address but another port, that waits before it answers: the
// upstream wait during which a test removes a session or breaks a socket.
type dpSlowDNS struct {
	addr  netip.AddrPort
	delay time.Duration

	mu      sync.Mutex
	records map[string][]dns.RR // key: lower-case fqdn; A records only
	froms   []netip.AddrPort    // source of every query received, in order
	arrived chan netip.AddrPort // the same, for a test waiting on one
}

// dpSlowPort is where dpSlowDNS listens; each test has its own world.
const dpSlowPort = 5353

func startSlowDNS(t *testing.T, w *world.World, delay time.Duration) *dpSlowDNS {
	t.Helper()
	d := &dpSlowDNS{
		addr:    netip.AddrPortFrom(w.DNS.Addr().Addr(), dpSlowPort),
		delay:   delay,
		records: map[string][]dns.RR{},
		arrived: make(chan netip.AddrPort, 64),
	}
	pc, err := world.ListenUDP(w.NetPath, d.addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: d}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("slow dns server did not start")
	}
	t.Cleanup(func() { srv.Shutdown() })
	return d
}

func (d *dpSlowDNS) addA(name string, a netip.Addr) {
	rr, err := dns.NewRR(fmt.Sprintf("%s 60 IN A %s", dns.Fqdn(name), a))
	if err != nil {
		panic(err)
	}
	d.mu.Lock()
	d.records[strings.ToLower(dns.Fqdn(name))] = append(d.records[strings.ToLower(dns.Fqdn(name))], rr)
	d.mu.Unlock()
}

// queries returns the number of queries received so far.
func (d *dpSlowDNS) queries() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.froms)
}

// next waits for the next query to arrive and returns its source.
func (d *dpSlowDNS) next(t *testing.T) netip.AddrPort {
	t.Helper()
	select {
	case from := <-d.arrived:
		return from
	case <-time.After(world.ReachTimeout):
		t.Fatal("the slow upstream got no query")
		return netip.AddrPort{}
	}
}

func (d *dpSlowDNS) ServeDNS(rw dns.ResponseWriter, req *dns.Msg) {
	from, _ := netip.ParseAddrPort(rw.RemoteAddr().String())
	d.mu.Lock()
	d.froms = append(d.froms, from)
	var answer []dns.RR
	if len(req.Question) == 1 {
		answer = copyRRs(d.records[strings.ToLower(req.Question[0].Name)])
	}
	d.mu.Unlock()
	select {
	case d.arrived <- from:
	default:
	}
	time.Sleep(d.delay)
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Answer = answer
	rw.WriteMsg(resp)
}

func copyRRs(rrs []dns.RR) []dns.RR {
	out := make([]dns.RR, len(rrs))
	for i, rr := range rrs {
		out[i] = dns.Copy(rr)
	}
	return out
}

// attestedIPs returns the addresses attested for guest (failing the test
// when the sets cannot be read).
func (e *dpEnv) attestedIPs(t *testing.T, guest netip.Addr) []netip.Addr {
	t.Helper()
	got, err := e.fw.Attested(guest)
	if err != nil {
		t.Fatalf("read attested set: %v", err)
	}
	var out []netip.Addr
	for _, a := range got {
		out = append(out, a.IP)
	}
	return out
}

// dpLookupAsync starts a lookup and returns where its result arrives.
type dpLookupResult struct {
	m   *dns.Msg
	err error
}

func (e *dpEnv) lookupAsync(nsPath, name string) <-chan dpLookupResult {
	ch := make(chan dpLookupResult, 1)
	go func() {
		m, err := world.Lookup(nsPath, e.anycast, name, dns.TypeA, false, 2*world.ReachTimeout)
		ch <- dpLookupResult{m, err}
	}()
	return ch
}

// TestDNSProxyAttackAnswerOutlivesSession: a session asks
// for an allowed name whose upstream takes 1.5 s; the session is removed
// (Unregister, then the firewall's RemoveSession, the daemon's order) while
// the answer is on its way. Nothing may be attested for the removed guest
// afterwards (else the next session on that address inherits it), and the
// guest gets no address. Positive control: the same slow query from a
// session that stays is answered and attested.
func TestDNSProxyAttackAnswerOutlivesSession(t *testing.T) {
	const delay = 1500 * time.Millisecond
	var slow *dpSlowDNS
	e := newDPEnv(t, func(w *world.World, c *dnsproxy.Config) {
		slow = startSlowDNS(t, w, delay)
		c.Upstreams = []netip.AddrPort{slow.addr}
		c.Timeout = 2 * delay
	})
	name := "slow." + e.w.ID + ".test"
	slow.addA(name, e.w.Web[0])
	stays := e.session(t, e.w.UniqueName("sta"), netpolicy.ModeAllowlist, name)
	goes, goesRules := e.sessionWith(t, e.w.UniqueName("sgo"), netpolicy.ModeAllowlist, nil, name)

	// Both queries wait at the upstream at once.
	control := e.lookupAsync(stays.NetnsPath, name)
	slow.next(t)
	attack := e.lookupAsync(goes.NetnsPath, name)
	slow.next(t)
	start := time.Now()
	e.proxy.Unregister(goes.Guest)
	if err := e.fw.RemoveSession(goesRules); err != nil {
		t.Fatalf("remove session: %v", err)
	}
	if d := time.Since(start); d > delay/2 {
		t.Errorf("removal took %v: it waited for the upstream", d)
	}

	res := <-control
	if res.err != nil || !slices.Equal(world.AddrsOf(res.m), []netip.Addr{e.w.Web[0]}) {
		t.Fatalf("control lookup: %v, %v", res.m, res.err)
	}
	if got := e.attestedIPs(t, stays.Guest); !slices.Equal(got, []netip.Addr{e.w.Web[0]}) {
		t.Fatalf("control: attested %v, want %v", got, e.w.Web[0])
	}
	res = <-attack
	if res.err == nil && len(world.AddrsOf(res.m)) > 0 {
		t.Errorf("the removed session got an answer with addresses: %v", res.m)
	}
	// Well past the moment the upstream answered.
	time.Sleep(300 * time.Millisecond)
	if got := e.attestedIPs(t, goes.Guest); len(got) != 0 {
		t.Fatalf("attested for the removed guest %s after removal: %v", goes.Guest, got)
	}
	if res.err == nil && res.m.Rcode != dns.RcodeServerFailure {
		t.Errorf("the removed session's query: rcode %s, want SERVFAIL or no answer", dns.RcodeToString[res.m.Rcode])
	}
	if !e.events.findErr(name, dnsproxy.VerdictServfail, "session") {
		t.Errorf("no servfail event naming the removed session: %+v", e.events.snapshot())
	}
}

// TestDNSProxyAttackPinnedKeepsPort: with --pin and an
// entry for port 80 only, resolving the pinned name through the proxy must
// not open the address's other ports. Positive control: port 80 works
// before and after the lookup.
func TestDNSProxyAttackPinnedKeepsPort(t *testing.T) {
	e := newDPEnv(t, nil)
	name := "pinned." + e.w.ID + ".test"
	pinned := map[string][]netip.Addr{name: {e.w.Web[0]}}
	s, _ := e.sessionWith(t, e.w.UniqueName("pin"), netpolicy.ModeAllowlist, pinned, name+":80")
	echo, web := netip.AddrPortFrom(e.w.Web[0], 7), e.w.Web[0]

	dpExpectReach(t, "pinned port 80 before resolving", dpHTTPReach(s.NetnsPath, web))
	dpExpectBlocked(t, "pinned port 7 before resolving", world.TCPEcho(s.NetnsPath, echo, world.BlockTimeout))

	resp := e.lookup(t, s, name, dns.TypeA, false)
	if got := world.AddrsOf(resp); !slices.Equal(got, []netip.Addr{web}) {
		t.Fatalf("pinned answer %v", resp)
	}
	dpExpectReach(t, "pinned port 80 after resolving", dpHTTPReach(s.NetnsPath, web))
	dpExpectBlocked(t, "pinned port 7 after resolving", world.TCPEcho(s.NetnsPath, echo, world.BlockTimeout))
	dpExpectBlocked(t, "pinned udp 7 after resolving", world.UDPEcho(s.NetnsPath, echo, world.BlockTimeout))
	if got, err := e.fw.Attested(s.Guest); err != nil || len(got) != 0 {
		t.Errorf("attested for a pinned name: %v, %v (the static sets already hold it with its port)", got, err)
	}
}

func dpHTTPReach(nsPath string, a netip.Addr) error {
	_, err := world.HTTPGet(nsPath, "http://"+a.String()+"/", world.ReachTimeout)
	return err
}

// TestDNSProxyAttackBoundedAttest: a name answering 201 A
// records (TTL 86400, so only TCP carries them all) queried by a public and
// an allowlist session. The public session attests nothing (its traffic is
// accepted by the public set: positive control, it reaches the first
// address); the allowlist session gets and attests at most the per-answer
// cap, every released address attested, and reaches the first address
// (positive control).
func TestDNSProxyAttackBoundedAttest(t *testing.T) {
	const perAnswer = 32
	e := newDPEnv(t, func(_ *world.World, c *dnsproxy.Config) { c.MaxAnswerAddrs = perAnswer })
	name := "many." + e.w.ID + ".test"
	e.w.DNS.AddRR(name + ". 86400 IN A " + e.w.Web[0].String())
	for i := range 200 {
		e.w.DNS.AddRR(fmt.Sprintf("%s. 86400 IN A 198.18.%d.%d", name, 4+i/250, 1+i%250))
	}
	pub := e.session(t, e.w.UniqueName("pub"), netpolicy.ModePublic)
	alw := e.session(t, e.w.UniqueName("alw"), netpolicy.ModeAllowlist, name)
	echo := netip.AddrPortFrom(e.w.Web[0], 7)

	for range 3 { // repeated, as the attack did: nothing accumulates
		resp := e.lookup(t, pub, name, dns.TypeA, true)
		if got := world.AddrsOf(resp); len(got) == 0 || len(got) > perAnswer || got[0] != e.w.Web[0] {
			t.Fatalf("public answer: %d addresses, first %v", len(got), got)
		}
	}
	if got := e.attestedIPs(t, pub.Guest); len(got) != 0 {
		t.Errorf("public session attested %d addresses, want none", len(got))
	}
	dpExpectReach(t, "public session to the first address", world.TCPEcho(pub.NetnsPath, echo, world.ReachTimeout))

	var released []netip.Addr
	for range 3 {
		resp := e.lookup(t, alw, name, dns.TypeA, true)
		released = world.AddrsOf(resp)
		if len(released) == 0 || len(released) > perAnswer || released[0] != e.w.Web[0] {
			t.Fatalf("allowlist answer: %d addresses (cap %d), first %v", len(released), perAnswer, released)
		}
	}
	got := e.attestedIPs(t, alw.Guest)
	if len(got) > perAnswer {
		t.Errorf("allowlist session attested %d addresses, want at most %d", len(got), perAnswer)
	}
	for _, a := range released {
		if !slices.Contains(got, a) {
			t.Errorf("released %v without attesting it", a)
		}
	}
	dpExpectReach(t, "allowlist session to the first address", world.TCPEcho(alw.NetnsPath, echo, world.ReachTimeout))
	if !e.events.findCapped(name) {
		t.Errorf("no event names the per-answer cap")
	}
	if st := e.proxy.Stats(); st.AnswerCap == 0 {
		t.Errorf("stats count no per-answer cap hit: %+v", st)
	}
}

// TestDNSProxyAttackAttestCap: with the firewall's
// per-session cap at 40 elements, a session that resolved one name of 32
// addresses gets SERVFAIL for a second such name (never an answer with
// unattested addresses), the event names the cap and the stats count it.
// Positive controls: the first name resolves again (a refresh adds
// nothing), and another session resolves the second name (the cap is per
// session).
func TestDNSProxyAttackAttestCap(t *testing.T) {
	e := newDPEnvFirewall(t, func(c *nft.FirewallConfig) { c.MaxAttested = 40 }, nil)
	id := e.w.ID
	first, second := "one."+id+".test", "two."+id+".test"
	for i := range 32 {
		e.w.DNS.AddRR(fmt.Sprintf("%s. 60 IN A 198.18.5.%d", first, i+1))
		e.w.DNS.AddRR(fmt.Sprintf("%s. 60 IN A 198.18.6.%d", second, i+1))
	}
	s := e.session(t, e.w.UniqueName("cap"), netpolicy.ModeAllowlist, first, second)
	other := e.session(t, e.w.UniqueName("cao"), netpolicy.ModeAllowlist, second)

	if got := world.AddrsOf(e.lookup(t, s, first, dns.TypeA, true)); len(got) != 32 {
		t.Fatalf("first name: %d addresses, want 32", len(got))
	}
	resp := e.lookup(t, s, second, dns.TypeA, true)
	if resp.Rcode != dns.RcodeServerFailure || len(world.AddrsOf(resp)) != 0 {
		t.Fatalf("second name over the session's cap: %v", resp)
	}
	if got := e.attestedIPs(t, s.Guest); len(got) != 32 {
		t.Errorf("attested %d addresses after the refused answer, want the first 32", len(got))
	}
	if !e.events.findErr(second, dnsproxy.VerdictServfail, netpolicy.ErrAttestCap.Error()) {
		t.Errorf("no servfail event naming the cap: %+v", e.events.snapshot())
	}
	if st := e.proxy.Stats(); st.AttestCap != 1 {
		t.Errorf("stats: attest cap %d, want 1", st.AttestCap)
	}
	if got := world.AddrsOf(e.lookup(t, s, first, dns.TypeA, true)); len(got) != 32 {
		t.Errorf("first name again: %d addresses, want 32", len(got))
	}
	if got := world.AddrsOf(e.lookup(t, other, second, dns.TypeA, true)); len(got) != 32 {
		t.Errorf("another session, second name: %d addresses, want 32", len(got))
	}
}

// TestDNSProxyAttackTCPSlots: a local user on the host
// holds 1100 idle TCP connections to the anycast address from 127.0.0.0/8
// source addresses, and a session holds 64 more; another session still
// resolves over TCP (positive control before the attack, the check during
// it). The unknown sources are closed at once, the session keeps at most
// its share, and its idle connections time out.
func TestDNSProxyAttackTCPSlots(t *testing.T) {
	e := newDPEnv(t, nil)
	name := "tcp." + e.w.ID + ".test"
	e.w.DNS.AddRR(name + ". 60 IN A " + e.w.Web[0].String())
	victim := e.session(t, e.w.UniqueName("vic"), netpolicy.ModeAllowlist, name)
	hog := e.session(t, e.w.UniqueName("hog"), netpolicy.ModeAllowlist, name)

	e.lookup(t, victim, name, dns.TypeA, true) // positive control

	local := dpHoldLocalConns(t, e, 1100)
	var hogs []net.Conn
	t.Cleanup(func() {
		for _, c := range hogs {
			c.Close()
		}
	})
	for i := range 64 {
		c, err := world.DialTCP(hog.NetnsPath, e.anycast, world.ReachTimeout)
		if err != nil {
			t.Fatalf("session connection %d: %v", i, err)
		}
		hogs = append(hogs, c)
	}
	time.Sleep(200 * time.Millisecond) // let the proxy accept them all

	for i := range 3 {
		resp, err := world.Lookup(victim.NetnsPath, e.anycast, name, dns.TypeA, true, world.ReachTimeout)
		if err != nil {
			t.Fatalf("victim lookup %d over tcp during the attack: %v", i, err)
		}
		if got := world.AddrsOf(resp); !slices.Equal(got, []netip.Addr{e.w.Web[0]}) {
			t.Fatalf("victim lookup %d: %v", i, resp)
		}
	}

	if len(local) > 0 {
		if open := dpStillOpen(local[:50], 500*time.Millisecond); open > 0 {
			t.Errorf("%d of 50 connections from unknown sources still open after 500ms, want closed at once", open)
		}
	}
	open := dpStillOpen(hogs, 500*time.Millisecond)
	if open == 0 || open > 16 {
		t.Errorf("the hogging session holds %d idle connections, want 1 to 16", open)
	}
	if open := dpStillOpen(hogs, 6*time.Second); open > 0 {
		t.Errorf("%d idle session connections still open after 6 s", open)
	}
}

// dpHoldLocalConns opens n TCP connections to the anycast address from the
// simulated host itself (a local user), each from its own 127.0.0.0/8
// source address, and keeps them idle. When the firewall already drops
// them (only session veths reach the anycast address) the first one times
// out and it returns none: the proxy's own refusal of unknown sources is
// then proven by dnsproxy's TestServeTCPClosesUnknownSources.
func dpHoldLocalConns(t *testing.T, e *dpEnv, n int) []net.Conn {
	t.Helper()
	var local []net.Conn
	t.Cleanup(func() {
		for _, c := range local {
			c.Close()
		}
	})
	dropped := false
	err := nsmgr.Do(e.w.Host, func() error {
		for i := range n {
			src := netip.AddrFrom4([4]byte{127, 0, byte(1 + i/250), byte(1 + i%250)})
			d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: world.ReachTimeout}
			if i == 0 {
				d.Timeout = world.BlockTimeout
			}
			c, err := d.Dial("tcp4", e.anycast.String())
			if i == 0 && world.IsTimeout(err) {
				dropped = true
				return nil
			}
			if err != nil {
				return fmt.Errorf("local connection %d from %s: %w", i, src, err)
			}
			local = append(local, c)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if dropped {
		t.Logf("the firewall drops local connections to %s: only the session part of the attack reaches the proxy", e.anycast)
	}
	return local
}

// dpStillOpen reads from every connection for up to wait (in parallel) and
// returns how many neither returned EOF nor any other error but a timeout.
func dpStillOpen(conns []net.Conn, wait time.Duration) int {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		open int
	)
	deadline := time.Now().Add(wait)
	for _, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(deadline)
			_, err := c.Read(make([]byte, 1))
			if world.IsTimeout(err) {
				mu.Lock()
				open++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return open
}

// TestDNSProxyAttackUpstreamPortUnreachable: an
// off-path ICMP port unreachable quoting the proxy's upstream socket, sent
// while a query waits on it, must not turn that query into SERVFAIL: it is
// asked again on another socket. Positive control: the same lookup without
// the injected error.
func TestDNSProxyAttackUpstreamPortUnreachable(t *testing.T) {
	const delay = 300 * time.Millisecond
	var slow *dpSlowDNS
	e := newDPEnv(t, func(w *world.World, c *dnsproxy.Config) {
		slow = startSlowDNS(t, w, delay)
		c.Upstreams = []netip.AddrPort{slow.addr}
		c.Timeout = 2 * time.Second
	})
	name := "icmp." + e.w.ID + ".test"
	slow.addA(name, e.w.Web[0])
	s := e.session(t, e.w.UniqueName("icm"), netpolicy.ModeAllowlist, name)

	res := <-e.lookupAsync(s.NetnsPath, name) // positive control
	if res.err != nil || !slices.Equal(world.AddrsOf(res.m), []netip.Addr{e.w.Web[0]}) {
		t.Fatalf("control lookup: %v, %v", res.m, res.err)
	}
	slow.next(t)

	before := slow.queries()
	ch := e.lookupAsync(s.NetnsPath, name)
	from := slow.next(t)
	if err := dpSendPortUnreachable(e.w, from, slow.addr); err != nil {
		t.Fatal(err)
	}
	res = <-ch
	if res.err != nil || res.m.Rcode != dns.RcodeSuccess || !slices.Equal(world.AddrsOf(res.m), []netip.Addr{e.w.Web[0]}) {
		t.Fatalf("lookup whose upstream socket got a port unreachable: %v, %v (stats %+v)", res.m, res.err, e.proxy.Stats())
	}
	if n := slow.queries() - before; n < 2 {
		t.Fatalf("the upstream saw %d queries for the attacked lookup: the injected error did not reach the socket, the test proves nothing", n)
	}
}

// dpSendPortUnreachable sends, from the simulated internet, an ICMP port
// unreachable to the simulated host quoting a UDP datagram from sock to
// server, as an off-path attacker (or a router) would.
func dpSendPortUnreachable(w *world.World, sock, server netip.AddrPort) error {
	inner := make([]byte, 28)
	inner[0] = 0x45
	binary.BigEndian.PutUint16(inner[2:], 28+40)
	inner[8], inner[9] = 64, 17 // ttl, udp
	copy(inner[12:16], sock.Addr().AsSlice())
	copy(inner[16:20], server.Addr().AsSlice())
	binary.BigEndian.PutUint16(inner[10:], ipChecksum(inner[:20]))
	binary.BigEndian.PutUint16(inner[20:], sock.Port())
	binary.BigEndian.PutUint16(inner[22:], server.Port())
	binary.BigEndian.PutUint16(inner[24:], 8+40)
	msg := icmp.Message{Type: ipv4.ICMPTypeDestinationUnreachable, Code: 3, Body: &icmp.DstUnreach{Data: inner}}
	raw, err := msg.Marshal(nil)
	if err != nil {
		return err
	}
	return world.DoPath(w.NetPath, func() error {
		c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return fmt.Errorf("icmp socket: %w", err)
		}
		defer c.Close()
		_, err = c.WriteTo(raw, &net.IPAddr{IP: sock.Addr().AsSlice()})
		return err
	})
}

func ipChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
