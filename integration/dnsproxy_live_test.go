package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Live tests of the DNS proxy: the proxy serves the DNS anycast address in
// a test world's simulated host (its sockets and its upstream sockets are
// created there), attests into a real netpolicy Firewall, and sessions built
// by nsmgr query it from their own namespaces. Every "blocked" check must
// time out (a silent drop) and sits next to a positive control.

const (
	dpFloor = 2 * time.Second // attest floor: low so expiry is observable
)

// dpEnv is one world with nsmgr, a Firewall and a running proxy on its
// simulated host.
type dpEnv struct {
	w       *world.World
	mgr     *nsmgr.Manager
	fw      *nft.Firewall
	proxy   *dnsproxy.Proxy
	anycast netip.AddrPort
	events  *dpEvents
}

// dpEvents keeps every proxy decision.
type dpEvents struct {
	mu  sync.Mutex
	all []dnsproxy.Event
}

func (e *dpEvents) Record(ev dnsproxy.Event) {
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
}

func (e *dpEvents) find(name, verdict string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.all {
		if ev.Name == dns.Fqdn(name) && ev.Verdict == verdict {
			return true
		}
	}
	return false
}

// findErr reports an event for name with verdict whose Err contains sub.
func (e *dpEvents) findErr(name, verdict, sub string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.all {
		if ev.Name == dns.Fqdn(name) && ev.Verdict == verdict && strings.Contains(ev.Err, sub) {
			return true
		}
	}
	return false
}

// findCapped reports an event for name that names the per-answer cap.
func (e *dpEvents) findCapped(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.all {
		if ev.Name == dns.Fqdn(name) && ev.Capped > 0 {
			return true
		}
	}
	return false
}

func (e *dpEvents) snapshot() []dnsproxy.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.all)
}

func (e *dpEvents) count(name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.all {
		if ev.Name == dns.Fqdn(name) {
			n++
		}
	}
	return n
}

// newDPEnv builds the world and the proxy; mod, if not nil, adjusts the
// proxy's config once the world exists (a test may start servers of its own
// in it first).
func newDPEnv(t *testing.T, mod func(*world.World, *dnsproxy.Config)) *dpEnv {
	t.Helper()
	return newDPEnvFirewall(t, nil, mod)
}

// newDPEnvFirewall is newDPEnv with fwMod, if not nil, adjusting the
// firewall's config.
func newDPEnvFirewall(t *testing.T, fwMod func(*nft.FirewallConfig), mod func(*world.World, *dnsproxy.Config)) *dpEnv {
	t.Helper()
	w := world.New(t)
	e := &dpEnv{w: w, events: &dpEvents{}}
	prefix := "d" + w.ID[:5] // nsmgr allows 6 characters
	pool := nsmgr.DefaultPool
	mgr, err := nsmgr.New(nsmgr.Config{Prefix: prefix, Pool: pool, HostNS: w.Host, EtcNetnsDir: t.TempDir()})
	if err != nil {
		t.Fatalf("nsmgr: %v", err)
	}
	e.mgr = mgr
	t.Cleanup(func() { mgr.Close() })
	if err := nsmgr.EnableForwarding(w.Host); err != nil {
		t.Fatalf("enable forwarding: %v", err)
	}
	dnsAddr, err := mgr.EnsureDNSInterface()
	if err != nil {
		t.Fatalf("dns interface: %v", err)
	}
	t.Cleanup(func() {
		if err := mgr.RemoveDNSInterface(); err != nil {
			t.Errorf("remove dns interface: %v", err)
		}
	})
	e.anycast = netip.AddrPortFrom(dnsAddr, 53)
	guard, err := netpolicy.NewGuard(pool, []netip.Prefix{w.PublicOverride})
	if err != nil {
		t.Fatalf("guard: %v", err)
	}
	fwCfg := nft.FirewallConfig{
		NetNS: w.Host, Prefix: prefix, Pool: pool, DNSAddr: dnsAddr, Guard: guard, AttestFloor: dpFloor,
	}
	if fwMod != nil {
		fwMod(&fwCfg)
	}
	fw, err := nft.OpenFirewall(fwCfg)
	if err != nil {
		t.Fatalf("open firewall: %v", err)
	}
	e.fw = fw
	t.Cleanup(func() {
		if err := fw.DeleteTable(); err != nil {
			t.Errorf("delete table: %v", err)
		}
		fw.Close()
	})
	if err := fw.Ensure(); err != nil {
		t.Fatalf("ensure firewall: %v", err)
	}

	cfg := dnsproxy.Config{
		Upstreams:    []netip.AddrPort{w.DNS.Addr()},
		Timeout:      time.Second,
		Guard:        guard,
		Attester:     fw,
		Events:       e.events,
		SessionShare: 4,
		MaxInFlight:  32,
		// Upstream sockets are made in the simulated host, as the daemon
		// makes them in its own netns.
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := nsmgr.Do(w.Host, func() (err error) {
				var d net.Dialer
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}
	if mod != nil {
		mod(w, &cfg)
	}
	p, err := dnsproxy.New(cfg)
	if err != nil {
		t.Fatalf("new proxy: %v", err)
	}
	e.proxy = p
	pc, err := world.ListenUDP(w.HostPath, e.anycast)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := world.ListenTCP(w.HostPath, e.anycast)
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- p.Serve(pc, ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			t.Errorf("shutdown proxy: %v", err)
		}
		if err := <-served; !errors.Is(err, dnsproxy.ErrClosed) {
			t.Errorf("serve returned %v", err)
		}
	})
	return e
}

// session creates a session network, its firewall rules and its proxy
// registration, removed in reverse in cleanup.
func (e *dpEnv) session(t *testing.T, name string, mode netpolicy.Mode, allow ...string) nsmgr.Session {
	t.Helper()
	s, _ := e.sessionWith(t, name, mode, nil, allow...)
	return s
}

// sessionWith is session with pinned names (their addresses become static
// targets, as the daemon makes them with --pin); it also returns the
// session's firewall rules, for a test that removes the session itself.
func (e *dpEnv) sessionWith(t *testing.T, name string, mode netpolicy.Mode, pinned map[string][]netip.Addr, allow ...string) (nsmgr.Session, nft.SessionRules) {
	t.Helper()
	s, err := e.mgr.Create(name, true)
	if err != nil {
		t.Fatalf("create session %s: %v", name, err)
	}
	var entries []netpolicy.Entry
	for _, a := range allow {
		en, err := netpolicy.ParseEntry(a, nil)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, en)
	}
	r := nft.SessionRules{Name: name, HostIface: s.HostIface, Guest: s.Guest, Egress: mode,
		Static: netpolicy.StaticTargets(netpolicy.Policy{Egress: mode, Allow: entries}, pinned)}
	t.Cleanup(func() {
		e.proxy.Unregister(s.Guest)
		if err := e.fw.RemoveSession(r); err != nil {
			t.Errorf("remove session %s: %v", name, err)
		}
		if err := e.mgr.Delete(name, s.Slot); err != nil {
			t.Errorf("delete session %s: %v", name, err)
		}
	})
	if err := e.fw.AddSession(r); err != nil {
		t.Fatalf("add session %s: %v", name, err)
	}
	if err := e.proxy.Register(dnsproxy.SessionPolicy{Name: name, Guest: s.Guest, Mode: mode, Allow: entries, Pinned: pinned}); err != nil {
		t.Fatalf("register %s: %v", name, err)
	}
	return s, r
}

// lookup resolves name through the anycast address from the session.
func (e *dpEnv) lookup(t *testing.T, s nsmgr.Session, name string, qtype uint16, tcp bool) *dns.Msg {
	t.Helper()
	m, err := world.Lookup(s.NetnsPath, e.anycast, name, qtype, tcp, world.ReachTimeout)
	if err != nil {
		t.Fatalf("lookup %s via %s (tcp %v): %v", name, e.anycast, tcp, err)
	}
	return m
}

// dpExpectBlocked requires err to be a timeout: a silent drop.
func dpExpectBlocked(t *testing.T, what string, err error) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s: reached, want blocked", what)
	case !world.IsTimeout(err):
		t.Errorf("%s: failed without a timeout (proves no drop): %v", what, err)
	}
}

func dpExpectReach(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: want reachable: %v", what, err)
	}
}

// TestDNSProxyLiveAttestation: an allowed name's address is unreachable
// before it is resolved, reachable (TCP, UDP, ICMP) after, and dropped for
// new connections once the attest floor has passed; an established
// connection survives the expiry; resolving again re-attests.
func TestDNSProxyLiveAttestation(t *testing.T) {
	e := newDPEnv(t, nil)
	name := "web." + e.w.ID + ".test"
	e.w.DNS.AddRR(name + ". 1 IN A " + e.w.Web[0].String())
	s := e.session(t, e.w.UniqueName("att"), netpolicy.ModeAllowlist, name)
	web := netip.AddrPortFrom(e.w.Web[0], 7)

	dpExpectBlocked(t, "before resolving", world.TCPEcho(s.NetnsPath, web, world.BlockTimeout))

	start := time.Now()
	resp := e.lookup(t, s, name, dns.TypeA, false)
	if got := world.AddrsOf(resp); !slices.Equal(got, []netip.Addr{e.w.Web[0]}) {
		t.Fatalf("answer %v", resp)
	}
	if ttl := resp.Answer[0].Header().Ttl; ttl > uint32(dpFloor/time.Second) {
		t.Fatalf("answer ttl %d outlives the attestation (%v)", ttl, dpFloor)
	}
	dpExpectReach(t, "tcp after resolving", world.TCPEcho(s.NetnsPath, web, world.ReachTimeout))
	dpExpectReach(t, "udp after resolving", world.UDPEcho(s.NetnsPath, web, world.ReachTimeout))
	dpExpectReach(t, "icmp after resolving", world.Ping(s.NetnsPath, e.w.Web[0], world.ReachTimeout))
	dpExpectBlocked(t, "an address the proxy did not answer", world.TCPEcho(s.NetnsPath, netip.AddrPortFrom(e.w.Web[1], 7), world.BlockTimeout))

	conn, err := world.DialTCP(s.NetnsPath, web, world.ReachTimeout)
	if err != nil {
		t.Fatalf("open a connection before expiry: %v", err)
	}
	defer conn.Close()
	if elapsed := time.Since(start); elapsed > dpFloor-300*time.Millisecond {
		t.Fatalf("checks took %v, longer than the floor %v: the expiry checks below prove nothing", elapsed, dpFloor)
	}

	// Wait out the floor, then new connections are dropped.
	time.Sleep(time.Until(start.Add(dpFloor + 500*time.Millisecond)))
	dpExpectBlocked(t, "new connection after the floor", world.TCPEcho(s.NetnsPath, web, world.BlockTimeout))
	if err := dpEchoOn(conn); err != nil {
		t.Errorf("established connection after expiry: %v", err)
	}

	e.lookup(t, s, name, dns.TypeA, false)
	dpExpectReach(t, "tcp after resolving again", world.TCPEcho(s.NetnsPath, web, world.ReachTimeout))
	if !e.events.find(name, dnsproxy.VerdictAllowed) {
		t.Errorf("no allowed event for %s", name)
	}
}

func dpEchoOn(c net.Conn) error {
	c.SetDeadline(time.Now().Add(world.ReachTimeout))
	msg := []byte("still here")
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if string(got) != string(msg) {
		return fmt.Errorf("echo %q", got)
	}
	return nil
}

// TestDNSProxyLiveDeniedAndRebinding: an off-policy name gets NXDOMAIN and
// never reaches the simulated internet's DNS server; allowed names that
// resolve to the metadata or a private address give no usable address and
// those stay unreachable.
func TestDNSProxyLiveDeniedAndRebinding(t *testing.T) {
	e := newDPEnv(t, nil)
	id := e.w.ID
	ok, denied := "ok."+id+".test", "secret."+id+".evil"
	meta, priv, mixed := "meta."+id+".test", "priv."+id+".test", "mixed."+id+".test"
	e.w.DNS.AddRR(ok + ". 60 IN A " + e.w.Web[0].String())
	e.w.DNS.AddRR(denied + ". 60 IN A " + e.w.Web[1].String())
	e.w.DNS.AddRR(meta + ". 60 IN A " + e.w.Metadata.String())
	e.w.DNS.AddRR(priv + ". 60 IN A " + e.w.Private.String())
	e.w.DNS.AddRR(mixed + ". 60 IN A " + e.w.Private.String())
	e.w.DNS.AddRR(mixed + ". 60 IN A " + e.w.Web[2].String())
	s := e.session(t, e.w.UniqueName("den"), netpolicy.ModeAllowlist, "*."+id+".test")

	resp := e.lookup(t, s, denied, dns.TypeA, false)
	if resp.Rcode != dns.RcodeNameError || len(resp.Answer) != 0 {
		t.Fatalf("denied name: %v", resp)
	}
	if e.w.DNS.QueriedName(denied) {
		t.Fatalf("the upstream saw a query for the denied name: %v", e.w.DNS.Queries())
	}
	if !e.events.find(denied, dnsproxy.VerdictDenied) {
		t.Errorf("no denied event for %s", denied)
	}
	dpExpectBlocked(t, "denied name's address", world.TCPEcho(s.NetnsPath, netip.AddrPortFrom(e.w.Web[1], 7), world.BlockTimeout))

	for _, n := range []string{meta, priv} {
		resp := e.lookup(t, s, n, dns.TypeA, false)
		if resp.Rcode != dns.RcodeSuccess || len(world.AddrsOf(resp)) != 0 {
			t.Fatalf("%s: %v", n, resp)
		}
	}
	resp = e.lookup(t, s, mixed, dns.TypeA, false)
	if got := world.AddrsOf(resp); !slices.Equal(got, []netip.Addr{e.w.Web[2]}) {
		t.Fatalf("mixed: %v", resp)
	}
	dpExpectBlocked(t, "metadata", world.TCPEcho(s.NetnsPath, netip.AddrPortFrom(e.w.Metadata, 7), world.BlockTimeout))
	dpExpectBlocked(t, "private", world.TCPEcho(s.NetnsPath, netip.AddrPortFrom(e.w.Private, 7), world.BlockTimeout))
	dpExpectBlocked(t, "metadata http", dpHTTP(s.NetnsPath, e.w.Metadata))

	// Positive control in the same world.
	e.lookup(t, s, ok, dns.TypeA, false)
	dpExpectReach(t, "allowed public name", world.TCPEcho(s.NetnsPath, netip.AddrPortFrom(e.w.Web[0], 7), world.ReachTimeout))
	dpExpectReach(t, "public half of mixed", world.TCPEcho(s.NetnsPath, netip.AddrPortFrom(e.w.Web[2], 7), world.ReachTimeout))
}

func dpHTTP(nsPath string, a netip.Addr) error {
	_, err := world.HTTPGet(nsPath, "http://"+a.String()+"/", world.BlockTimeout)
	return err
}

// TestDNSProxyLiveOnlyAnycastDNS: DNS to the simulated internet's server
// addressed directly is dropped (UDP and TCP); the same query through the
// anycast works over UDP and TCP, with large answers truncated over UDP and
// complete over TCP.
func TestDNSProxyLiveOnlyAnycastDNS(t *testing.T) {
	// 60 records in one answer: above the default per-answer cap.
	e := newDPEnv(t, func(_ *world.World, c *dnsproxy.Config) { c.MaxAnswerAddrs = 64 })
	name := "direct." + e.w.ID + ".test"
	big := "big." + e.w.ID + ".test"
	e.w.DNS.AddRR(name + ". 60 IN A " + e.w.Web[0].String())
	for i := range 60 {
		e.w.DNS.AddRR(fmt.Sprintf("%s. 60 IN A 198.18.3.%d", big, i+1))
	}
	s := e.session(t, e.w.UniqueName("dir"), netpolicy.ModeAllowlist, name, big)

	for _, tcp := range []bool{false, true} {
		_, err := world.Lookup(s.NetnsPath, e.w.DNS.Addr(), name, dns.TypeA, tcp, world.BlockTimeout)
		dpExpectBlocked(t, fmt.Sprintf("direct dns (tcp %v)", tcp), err)
	}
	if e.w.DNS.QueriedName(name) {
		t.Fatalf("direct query reached the server: %v", e.w.DNS.Queries())
	}
	for _, tcp := range []bool{false, true} {
		resp := e.lookup(t, s, name, dns.TypeA, tcp)
		if got := world.AddrsOf(resp); !slices.Equal(got, []netip.Addr{e.w.Web[0]}) {
			t.Fatalf("anycast (tcp %v): %v", tcp, resp)
		}
	}
	// Attested through a lookup, the server's address is still not a resolver.
	_, err := world.Lookup(s.NetnsPath, e.w.DNS.Addr(), name, dns.TypeA, false, world.BlockTimeout)
	dpExpectBlocked(t, "direct dns after resolving", err)

	udp := e.lookup(t, s, big, dns.TypeA, false)
	if !udp.Truncated {
		t.Fatalf("60 records over 512-byte UDP not truncated: %d records", len(udp.Answer))
	}
	tcp := e.lookup(t, s, big, dns.TypeA, true)
	if tcp.Truncated || len(world.AddrsOf(tcp)) != 60 {
		t.Fatalf("tcp: truncated %v, %d records", tcp.Truncated, len(tcp.Answer))
	}
}

// TestDNSProxyLiveFlood: one session floods the anycast with queries; a
// second session still resolves, and the listener answers afterwards.
func TestDNSProxyLiveFlood(t *testing.T) {
	e := newDPEnv(t, nil)
	id := e.w.ID
	calm := "calm." + id + ".test"
	e.w.DNS.AddRR(calm + ". 60 IN A " + e.w.Web[0].String())
	e.w.DNS.AddRR("x.flood." + id + ".test. 60 IN A " + e.w.Web[1].String())
	flooder := e.session(t, e.w.UniqueName("fla"), netpolicy.ModeAllowlist, "**.flood."+id+".test")
	victim := e.session(t, e.w.UniqueName("flb"), netpolicy.ModeAllowlist, calm)

	// Positive control first: the flooder resolves (this also settles its
	// neighbour entries, so the flood starts at full speed).
	e.lookup(t, flooder, "x.flood."+id+".test", dns.TypeA, false)

	var sock net.Conn
	err := world.DoPath(flooder.NetnsPath, func() (err error) {
		sock, err = net.Dial("udp4", e.anycast.String())
		return err
	})
	if err != nil {
		t.Fatalf("flood socket: %v", err)
	}
	defer sock.Close()
	sock.SetWriteDeadline(time.Now().Add(30 * time.Second)) // a stuck send fails the count, not the test run
	var sent atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				m := new(dns.Msg)
				m.SetQuestion(fmt.Sprintf("q%d-%d.flood.%s.test.", g, i, id), dns.TypeA)
				if i%3 == 0 {
					m.SetQuestion("x.flood."+id+".test.", dns.TypeA)
				}
				raw, _ := m.Pack()
				if i%5 == 0 {
					raw = raw[:7] // garbage too
				}
				if _, err := sock.Write(raw); err == nil {
					sent.Add(1)
				}
			}
		})
	}
	// Drain the answers so the flooder's socket never blocks.
	go func() {
		buf := make([]byte, 4096)
		for {
			sock.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := sock.Read(buf); err != nil {
				return
			}
		}
	}()

	time.Sleep(300 * time.Millisecond)
	sentBefore := sent.Load()
	floodStart := time.Now()
	for i := 0; i < 10 || time.Since(floodStart) < 1500*time.Millisecond; i++ {
		start := time.Now()
		resp, err := world.Lookup(victim.NetnsPath, e.anycast, calm, dns.TypeA, i%2 == 1, world.ReachTimeout)
		if err != nil {
			st := e.proxy.Stats()
			t.Fatalf("victim lookup %d during the flood: %v (victim events %d; in flight %d, queued %d, shed %d; host udp: %s)",
				i, err, e.events.count(calm), st.InFlight, st.Queued, st.Shed, dpUDPStats(t, e.w))
		}
		if got := world.AddrsOf(resp); !slices.Equal(got, []netip.Addr{e.w.Web[0]}) {
			t.Fatalf("victim lookup %d: %v", i, resp)
		}
		if d := time.Since(start); d > 1500*time.Millisecond {
			t.Errorf("victim lookup %d took %v during the flood", i, d)
		}
	}
	during := sent.Load() - sentBefore
	close(stop)
	wg.Wait()
	st := e.proxy.Stats()
	t.Logf("flood: %d packets sent, %d during the victim's lookups; proxy: verdicts %v malformed %d shed %d; host udp: %s",
		sent.Load(), during, st.Verdicts, st.Malformed, st.Shed, dpUDPStats(t, e.w))
	if during < 1000 {
		t.Fatalf("the flood sent only %d packets while the victim resolved: no flood, no proof", during)
	}
	// The listener survived: the flooder itself still gets answers, once
	// the backlog its flood left in the socket buffer is drained (a real
	// resolver retries the same way; on a loaded machine that takes a
	// moment).
	var resp *dns.Msg
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err = world.Lookup(flooder.NetnsPath, e.anycast, "x.flood."+id+".test", dns.TypeA, false, world.ReachTimeout)
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		st := e.proxy.Stats()
		t.Fatalf("flooder after the flood: %v (in flight %d, queued %d, shed %d; host udp: %s)", err, st.InFlight, st.Queued, st.Shed, dpUDPStats(t, e.w))
	}
	if got := world.AddrsOf(resp); !slices.Equal(got, []netip.Addr{e.w.Web[1]}) {
		t.Fatalf("flooder after the flood: %v", resp)
	}
	dpExpectReach(t, "victim's name", world.TCPEcho(victim.NetnsPath, netip.AddrPortFrom(e.w.Web[0], 7), world.ReachTimeout))
}

// dpUDPStats returns the simulated host's UDP counters (receive buffer
// errors show packets the kernel dropped before the proxy read them).
func dpUDPStats(t *testing.T, w *world.World) string {
	var out string
	nsmgr.Do(w.Host, func() error {
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			if strings.HasPrefix(l, "Udp:") && i+1 < len(lines) {
				out = l + " / " + lines[i+1]
				break
			}
		}
		return nil
	})
	return out
}
