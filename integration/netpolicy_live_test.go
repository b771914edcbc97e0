package integration

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Live tests of the netpolicy firewall: sessions built by nsmgr in a test
// world's simulated host, the table installed there through a netns fd, and
// traffic probed from inside the session namespaces. Every "blocked" check
// requires a timeout (a silent drop), never just any error, and sits next to
// a positive control in the same test.

// npEnv is one world with an nsmgr Manager and a Firewall on its simulated host.
type npEnv struct {
	w      *world.World
	prefix string
	mgr    *nsmgr.Manager
	fw     *nft.Firewall
	guard  *netpolicy.Guard
	pool   netip.Prefix
	dns    netip.Addr
	cfg    nft.FirewallConfig
}

func newNPEnv(t *testing.T, floor time.Duration) *npEnv {
	t.Helper()
	world.RequireTool(t, "ip")
	w := world.New(t)
	e := &npEnv{w: w, prefix: "t" + w.ID[:4], pool: nsmgr.DefaultPool}
	mgr, err := nsmgr.New(nsmgr.Config{Prefix: e.prefix, Pool: e.pool, HostNS: w.Host, EtcNetnsDir: t.TempDir()})
	if err != nil {
		t.Fatalf("nsmgr: %v", err)
	}
	e.mgr = mgr
	t.Cleanup(func() { mgr.Close() })
	if err := nsmgr.EnableForwarding(w.Host); err != nil {
		t.Fatalf("enable forwarding: %v", err)
	}
	if e.dns, err = mgr.EnsureDNSInterface(); err != nil {
		t.Fatalf("dns interface: %v", err)
	}
	t.Cleanup(func() {
		if err := mgr.RemoveDNSInterface(); err != nil {
			t.Errorf("remove dns interface: %v", err)
		}
	})
	if e.guard, err = netpolicy.NewGuard(e.pool, []netip.Prefix{w.PublicOverride}); err != nil {
		t.Fatalf("guard: %v", err)
	}
	e.cfg = nft.FirewallConfig{NetNS: w.Host, Prefix: e.prefix, Pool: e.pool, DNSAddr: e.dns, Guard: e.guard, AttestFloor: floor,
		AttestMaxLifetime: time.Hour} // the daemon's default
	e.fw = e.ensureFirewall(t)
	// The current e.fw is closed after every session's cleanup (registered
	// later, so run earlier) has used it; reopenFirewall closes the ones it
	// replaces.
	t.Cleanup(func() { e.fw.Close() })
	t.Cleanup(func() {
		// A handle of its own: e.fw's Close may have been tested.
		fw, err := nft.OpenFirewall(e.cfg)
		if err != nil {
			t.Errorf("delete table: open firewall: %v", err)
			return
		}
		defer fw.Close()
		for i := 0; i < 2; i++ { // deleting twice is fine
			if err := fw.DeleteTable(); err != nil {
				t.Errorf("delete table (call %d): %v", i+1, err)
			}
		}
	})
	return e
}

// openFirewall opens a second Firewall on the simulated host's table (a
// restarted daemon beside e.fw), closed when the test ends, and ensures it.
func (e *npEnv) openFirewall(t *testing.T) *nft.Firewall {
	t.Helper()
	fw := e.ensureFirewall(t)
	t.Cleanup(func() { fw.Close() })
	return fw
}

// reopenFirewall closes e.fw (if the test has not) and replaces it with a
// Firewall opened with e.cfg: a restarted daemon, or new budgets.
func (e *npEnv) reopenFirewall(t *testing.T) {
	t.Helper()
	if err := e.fw.Close(); err != nil {
		t.Fatalf("close firewall: %v", err)
	}
	e.fw = e.ensureFirewall(t)
}

// ensureFirewall opens a Firewall with e.cfg and ensures the table; the
// caller owns its Close.
func (e *npEnv) ensureFirewall(t *testing.T) *nft.Firewall {
	t.Helper()
	fw, err := nft.OpenFirewall(e.cfg)
	if err != nil {
		t.Fatalf("open firewall: %v", err)
	}
	if err := fw.Ensure(); err != nil {
		fw.Close()
		t.Fatalf("ensure: %v", err)
	}
	return fw
}

// session creates a session network and registers its rules.
func (e *npEnv) session(t *testing.T, name string, mode netpolicy.Mode, static []netpolicy.Target, peers ...netip.Addr) (nsmgr.Session, nft.SessionRules) {
	t.Helper()
	s, err := e.mgr.Create(name, mode != netpolicy.ModeNone)
	if err != nil {
		t.Fatalf("create session %s: %v", name, err)
	}
	r := nft.SessionRules{Name: name, HostIface: s.HostIface, Guest: s.Guest, Egress: mode, Static: static, Peers: peers}
	t.Cleanup(func() {
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
	return s, r
}

// run runs a command (ip, nft) and fails the test on error.
func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// probe is one reachability check from a namespace.
type probe struct {
	name string
	fn   func(timeout time.Duration) error
}

func tcpProbe(ns string, dst netip.AddrPort) probe {
	return probe{"tcp " + dst.String(), func(to time.Duration) error { return world.TCPEcho(ns, dst, to) }}
}

func udpProbe(ns string, dst netip.AddrPort) probe {
	return probe{"udp " + dst.String(), func(to time.Duration) error { return world.UDPEcho(ns, dst, to) }}
}

func pingProbe(ns string, dst netip.Addr) probe {
	return probe{"icmp " + dst.String(), func(to time.Duration) error { return world.Ping(ns, dst, to) }}
}

func httpProbe(ns string, dst netip.Addr) probe {
	return probe{"http " + dst.String(), func(to time.Duration) error {
		body, err := world.HTTPGet(ns, "http://"+dst.String()+"/", to)
		if err == nil && !strings.Contains(body, dst.String()) {
			return errors.New("unexpected body " + body)
		}
		return err
	}}
}

// allThree probes TCP echo, UDP echo and ICMP to dst.
func allThree(ns string, dst netip.Addr) []probe {
	return []probe{tcpProbe(ns, netip.AddrPortFrom(dst, 7)), udpProbe(ns, netip.AddrPortFrom(dst, 7)), pingProbe(ns, dst)}
}

// expectReach requires every probe to succeed.
func expectReach(t *testing.T, what string, ps ...probe) {
	t.Helper()
	for i, err := range runProbes(ps, world.ReachTimeout) {
		if err != nil {
			t.Errorf("%s: %s should be reachable: %v", what, ps[i].name, err)
		}
	}
}

// expectBlocked requires every probe to time out: a silent drop. Any other
// error (refused, unreachable, a crash) proves nothing and fails the test.
func expectBlocked(t *testing.T, what string, ps ...probe) {
	t.Helper()
	for i, err := range runProbes(ps, world.BlockTimeout) {
		switch {
		case err == nil:
			t.Errorf("%s: %s should be blocked but was reached", what, ps[i].name)
		case !world.IsTimeout(err):
			t.Errorf("%s: %s failed without a timeout (not a proof of a drop): %v", what, ps[i].name, err)
		}
	}
}

func runProbes(ps []probe, timeout time.Duration) []error {
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.fn(timeout)
		}()
	}
	wg.Wait()
	return errs
}

func staticHost(a netip.Addr) netpolicy.Target {
	return netpolicy.Target{Prefix: netip.PrefixFrom(a, 32)}
}

// TestNetpolicyAllowlistStatic: static CIDR and port-constrained targets, the
// SSRF guard, the simulated host's own services, and counters.
func TestNetpolicyAllowlistStatic(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	web0, web1, web2 := w.Web[0], w.Web[1], w.Web[2]
	static := []netpolicy.Target{
		staticHost(web0),
		{Prefix: netip.PrefixFrom(web1, 32), Port: 7, Proto: netpolicy.ProtoUDP},
		// Even a static target cannot open the guard: these stay dropped.
		staticHost(w.Metadata), staticHost(w.Private),
	}
	s, _ := e.session(t, "a", netpolicy.ModeAllowlist, static)
	ns := s.NetnsPath

	expectReach(t, "allowed address", append(allThree(ns, web0), httpProbe(ns, web0))...)
	expectReach(t, "allowed port", udpProbe(ns, netip.AddrPortFrom(web1, 7)))
	expectBlocked(t, "outside the port constraint",
		tcpProbe(ns, netip.AddrPortFrom(web1, 7)), httpProbe(ns, web1), pingProbe(ns, web1))
	expectBlocked(t, "outside the policy", allThree(ns, web2)...)
	expectBlocked(t, "special-purpose destinations", append(allThree(ns, w.Metadata), allThree(ns, w.Private)...)...)

	c, err := e.fw.Counters(s.Guest)
	if err != nil {
		t.Fatalf("counters: %v", err)
	}
	if c.AcceptedPackets == 0 || c.AcceptedBytes == 0 || c.DroppedPackets == 0 || c.DroppedBytes == 0 {
		t.Errorf("counters did not move: %+v", c)
	}
}

// echoListeners serves TCP and UDP echo on addr inside nsPath until the test ends.
func echoListeners(t *testing.T, nsPath string, addr netip.AddrPort) {
	t.Helper()
	tl, err := world.ListenTCP(nsPath, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tl.Close() })
	go world.ServeTCPEcho(tl)
	ul, err := world.ListenUDP(nsPath, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ul.Close() })
	go world.ServeUDPEcho(ul)
}

// TestNetpolicySimulatedHostServices: from a session only UDP and TCP port 53
// on the DNS anycast address reach the simulated host; its other services,
// on the anycast address, the uplink address and the session's gateway, are
// dropped.
func TestNetpolicySimulatedHostServices(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	dns53 := netip.AddrPortFrom(e.dns, 53)
	echoListeners(t, w.HostPath, dns53)
	echoListeners(t, w.HostPath, netip.AddrPortFrom(netip.IPv4Unspecified(), 8053))
	s, _ := e.session(t, "a", netpolicy.ModePublic, nil)
	ns := s.NetnsPath

	expectReach(t, "dns anycast port 53", tcpProbe(ns, dns53), udpProbe(ns, dns53))
	// Positive control: the 8053 listener answers inside the simulated host.
	expectReach(t, "host listener from the host itself", tcpProbe(w.HostPath, netip.AddrPortFrom(w.Uplink, 8053)))
	var blocked []probe
	for _, a := range []netip.Addr{e.dns, w.Uplink, s.Gateway} {
		ap := netip.AddrPortFrom(a, 8053)
		blocked = append(blocked, tcpProbe(ns, ap), udpProbe(ns, ap), pingProbe(ns, a))
	}
	expectBlocked(t, "simulated host services", blocked...)
}

// TestNetpolicyPublicMode: public mode reaches every public destination and
// still drops the special-purpose ones, attested or not.
func TestNetpolicyPublicMode(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	s, _ := e.session(t, "p", netpolicy.ModePublic, []netpolicy.Target{staticHost(w.Metadata)})
	ns := s.NetnsPath
	var reach []probe
	for _, a := range w.Web {
		reach = append(reach, httpProbe(ns, a))
	}
	expectReach(t, "public web servers", append(reach, allThree(ns, w.Web[2])...)...)
	if _, err := e.fw.Attest(s.Guest, []netip.Addr{w.Metadata, w.Private}, time.Minute, nil); err != nil {
		t.Fatalf("attest: %v", err)
	}
	expectBlocked(t, "special-purpose destinations in public mode",
		append(append(allThree(ns, w.Metadata), allThree(ns, w.Private)...), httpProbe(ns, w.Metadata))...)
	// Resolvers other than the anycast proxy stay out of reach in public
	// mode: the world's DNS server answers the simulated host (control) but
	// not the session, over UDP or TCP.
	if _, err := world.Lookup(w.HostPath, w.DNS.Addr(), "example.test", dns.TypeA, false, world.ReachTimeout); err != nil {
		t.Fatalf("control: the world's DNS server does not answer the simulated host: %v", err)
	}
	expectBlocked(t, "direct DNS from a public session",
		dnsProbe(ns, w.DNS.Addr(), false), dnsProbe(ns, w.DNS.Addr(), true))
}

// TestNetpolicyCloudHostEndpointBlocked: 168.63.129.16,
// Azure's platform endpoint, is public unicast in the IANA registry but
// serves the host: it is blocked in every mode like the metadata address,
// even when attested or allowed statically, and an override opens it.
func TestNetpolicyCloudHostEndpointBlocked(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	pub, _ := e.session(t, "p", netpolicy.ModePublic, nil)
	allow, _ := e.session(t, "a", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(w.CloudHost), staticHost(w.Web[0])})
	if err := world.TCPEcho(w.HostPath, netip.AddrPortFrom(w.CloudHost, 7), world.ReachTimeout); err != nil {
		t.Fatalf("control: the simulated host cannot reach %s: %v", w.CloudHost, err)
	}
	expectReach(t, "public and allowed web servers", httpProbe(pub.NetnsPath, w.Web[1]), httpProbe(allow.NetnsPath, w.Web[0]))
	if _, err := e.fw.Attest(pub.Guest, []netip.Addr{w.CloudHost}, time.Minute, nil); err != nil {
		t.Fatalf("attest: %v", err)
	}
	expectBlocked(t, "the cloud host endpoint",
		append(allThree(pub.NetnsPath, w.CloudHost), allThree(allow.NetnsPath, w.CloudHost)...)...)
	if netpolicy.IsPublicUnicast(w.CloudHost) {
		t.Errorf("IsPublicUnicast(%s) = true: DNS answers would keep it", w.CloudHost)
	}
	g, err := netpolicy.NewGuard(e.pool, []netip.Prefix{w.PublicOverride, netip.PrefixFrom(w.CloudHost, 32)})
	if err != nil {
		t.Fatalf("guard with the endpoint overridden: %v", err)
	}
	if !g.IsPublicUnicast(w.CloudHost) {
		t.Errorf("override: %s still blocked", w.CloudHost)
	}
}

func dnsProbe(ns string, server netip.AddrPort, tcp bool) probe {
	name := "dns/udp " + server.String()
	if tcp {
		name = "dns/tcp " + server.String()
	}
	return probe{name, func(to time.Duration) error {
		_, err := world.Lookup(ns, server, "example.test", dns.TypeA, tcp, to)
		return err
	}}
}

// TestNetpolicySessionsIsolated: sessions reach neither each other nor each
// other's gateways, in every mode; a lab peer is reachable only by new
// connections from the session that names it.
func TestNetpolicySessionsIsolated(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	target, _ := e.session(t, "lab", netpolicy.ModeAllowlist, nil)
	echoListeners(t, target.NetnsPath, netip.AddrPortFrom(target.Guest, 7))
	pub, _ := e.session(t, "pub", netpolicy.ModePublic, nil)
	echoListeners(t, pub.NetnsPath, netip.AddrPortFrom(pub.Guest, 7))
	attacker, _ := e.session(t, "att", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(w.Web[0])})
	peer, _ := e.session(t, "peer", netpolicy.ModeAllowlist, nil, target.Guest)
	echoListeners(t, peer.NetnsPath, netip.AddrPortFrom(peer.Guest, 7))

	expectReach(t, "lab peer from the session naming it", allThree(peer.NetnsPath, target.Guest)...)
	expectReach(t, "attacker's own allowed destination", tcpProbe(attacker.NetnsPath, netip.AddrPortFrom(w.Web[0], 7)))
	expectReach(t, "public session's web", httpProbe(pub.NetnsPath, w.Web[1]))

	var blocked []probe
	for _, from := range []nsmgr.Session{attacker, pub} {
		for _, to := range []nsmgr.Session{target, peer, pub, attacker} {
			if from.Name == to.Name {
				continue
			}
			blocked = append(blocked, allThree(from.NetnsPath, to.Guest)...)
			blocked = append(blocked, pingProbe(from.NetnsPath, to.Gateway))
		}
	}
	// The peer relation is one way and grants no gateway.
	blocked = append(blocked, allThree(target.NetnsPath, peer.Guest)...)
	blocked = append(blocked, pingProbe(peer.NetnsPath, target.Gateway), tcpProbe(peer.NetnsPath, netip.AddrPortFrom(target.Gateway, 7)))
	expectBlocked(t, "other sessions and gateways", blocked...)
}

// udpSink records the payloads that reach a UDP socket.
type udpSink struct {
	mu   sync.Mutex
	seen map[string]netip.Addr // payload -> source as received
}

func newUDPSink(t *testing.T, nsPath string, addr netip.AddrPort) *udpSink {
	t.Helper()
	c, err := world.ListenUDP(nsPath, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	k := &udpSink{seen: map[string]netip.Addr{}}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			src, _ := netip.AddrFromSlice(from.(*net.UDPAddr).IP.To4())
			k.mu.Lock()
			k.seen[string(buf[:n])] = src
			k.mu.Unlock()
		}
	}()
	return k
}

// arrived waits up to timeout for payload (0: looks once).
func (k *udpSink) arrived(payload string, timeout time.Duration) bool {
	end := time.Now().Add(timeout)
	for {
		k.mu.Lock()
		_, ok := k.seen[payload]
		k.mu.Unlock()
		if ok || time.Now().After(end) {
			return ok
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sendFrom sends payload from src (which must be an address in nsPath) to dst.
func sendFrom(t *testing.T, nsPath string, src netip.Addr, dst netip.AddrPort, payload string) {
	t.Helper()
	err := world.DoPath(nsPath, func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: src.AsSlice()}, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
	if err != nil {
		t.Fatalf("send from %s to %s: %v", src, dst, err)
	}
}

// TestNetpolicyAntiSpoofing: a packet whose source is not the session's
// guest address is dropped, whether the address is free, another session's
// (which is itself allowed everywhere public), or public, and whether it
// goes to the internet or to the DNS anycast address. Sinks record what
// actually arrives, so a lost reply cannot pass for a drop.
func TestNetpolicyAntiSpoofing(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	s, _ := e.session(t, "a", netpolicy.ModePublic, nil)
	other, _ := e.session(t, "b", netpolicy.ModePublic, nil)
	// Reverse-path filtering would drop some spoofed packets before
	// nftables sees them; turn it off so the drops below are ours.
	disableRPFilter(t, w, s.HostIface, other.HostIface)
	spoofed := []netip.Addr{netip.MustParseAddr("10.20.200.9"), other.Guest, netip.MustParseAddr("198.18.7.7")}
	for _, a := range spoofed {
		run(t, "ip", "netns", "exec", nsmgr.NetnsName(e.prefix, "a"), "ip", "addr", "add", a.String()+"/32", "dev", "eth0")
	}
	webSink := netip.AddrPortFrom(w.Web[2], 9999)
	dnsSink := netip.AddrPortFrom(e.dns, 53)
	sinks := map[netip.AddrPort]*udpSink{
		webSink: newUDPSink(t, w.NetPath, webSink),
		dnsSink: newUDPSink(t, w.HostPath, dnsSink),
	}
	for dst, k := range sinks {
		own := "own-" + dst.String()
		sendFrom(t, s.NetnsPath, s.Guest, dst, own)
		if !k.arrived(own, world.ReachTimeout) {
			t.Errorf("positive control: datagram from the guest address to %s did not arrive", dst)
		}
		for _, src := range spoofed {
			sendFrom(t, s.NetnsPath, src, dst, "spoof-"+src.String()+"-"+dst.String())
		}
	}
	time.Sleep(world.BlockTimeout)
	for dst, k := range sinks {
		for _, src := range spoofed {
			if k.arrived("spoof-"+src.String()+"-"+dst.String(), 0) {
				t.Errorf("datagram with spoofed source %s reached %s", src, dst)
			}
		}
	}
	// The other session itself still reaches both (its address is valid on its own interface).
	for dst, k := range sinks {
		p := "other-" + dst.String()
		sendFrom(t, other.NetnsPath, other.Guest, dst, p)
		if !k.arrived(p, world.ReachTimeout) {
			t.Errorf("positive control: datagram from session b to %s did not arrive", dst)
		}
	}
}

// disableRPFilter turns reverse-path filtering off in the simulated host for
// "all" and the given interfaces (effective value = max of the two).
func disableRPFilter(t *testing.T, w *world.World, ifaces ...string) {
	t.Helper()
	err := nsmgr.Do(w.Host, func() error {
		for _, i := range append([]string{"all"}, ifaces...) {
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+i+"/rp_filter", []byte("0"), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("disable rp_filter: %v", err)
	}
}

// TestNetpolicyEscalatedGuest: a guest with CAP_NET_ADMIN in its own netns
// (the test, through ip netns exec) flushes its nftables, takes other
// addresses and rewrites its routes; the host's table still lets nothing
// through beyond its policy, and its real address keeps working.
func TestNetpolicyEscalatedGuest(t *testing.T) {
	world.RequireTool(t, "nft")
	e := newNPEnv(t, time.Second)
	w := e.w
	s, _ := e.session(t, "esc", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(w.Web[0])})
	other, _ := e.session(t, "b", netpolicy.ModePublic, nil)
	disableRPFilter(t, w, s.HostIface, other.HostIface)
	allowed := netip.AddrPortFrom(w.Web[0], 9998)
	outside := netip.AddrPortFrom(w.Web[2], 9999)
	meta := netip.AddrPortFrom(w.Metadata, 9997)
	sinks := map[netip.AddrPort]*udpSink{}
	for _, a := range []netip.AddrPort{allowed, outside, meta} {
		sinks[a] = newUDPSink(t, w.NetPath, a)
	}
	nsName := nsmgr.NetnsName(e.prefix, "esc")
	inNS := func(args ...string) { run(t, append([]string{"ip", "netns", "exec", nsName}, args...)...) }

	sendFrom(t, s.NetnsPath, s.Guest, allowed, "before")
	if !sinks[allowed].arrived("before", world.ReachTimeout) {
		t.Fatalf("positive control: allowed destination not reached before escalation")
	}

	stolen := []netip.Addr{netip.MustParseAddr("10.20.200.9"), other.Guest, netip.MustParseAddr("198.18.9.9")}
	inNS("nft", "flush", "ruleset")
	for _, a := range stolen {
		inNS("ip", "addr", "add", a.String()+"/32", "dev", "eth0")
	}
	inNS("ip", "route", "replace", "default", "via", s.Gateway.String(), "dev", "eth0", "onlink", "src", stolen[0].String())
	inNS("ip", "route", "add", w.Metadata.String()+"/32", "via", s.Gateway.String(), "dev", "eth0", "onlink")
	inNS("ip", "route", "add", "10.99.0.0/16", "via", s.Gateway.String(), "dev", "eth0", "onlink")

	for _, src := range stolen {
		for dst := range sinks {
			sendFrom(t, s.NetnsPath, src, dst, "esc-"+src.String()+"-"+dst.String())
		}
	}
	time.Sleep(world.BlockTimeout)
	for _, src := range stolen {
		for dst, k := range sinks {
			if k.arrived("esc-"+src.String()+"-"+dst.String(), 0) {
				t.Errorf("escalated guest reached %s from %s", dst, src)
			}
		}
	}
	expectBlocked(t, "escalated guest over its default route",
		append(allThree(s.NetnsPath, w.Private), tcpProbe(s.NetnsPath, netip.AddrPortFrom(w.Web[2], 7)))...)
	// Its real address still obeys exactly its policy.
	sendFrom(t, s.NetnsPath, s.Guest, allowed, "after")
	if !sinks[allowed].arrived("after", world.ReachTimeout) {
		t.Errorf("positive control: the guest address no longer reaches its allowed destination")
	}
	for _, dst := range []netip.AddrPort{outside, meta} {
		sendFrom(t, s.NetnsPath, s.Guest, dst, "real-"+dst.String())
	}
	time.Sleep(world.BlockTimeout)
	for _, dst := range []netip.AddrPort{outside, meta} {
		if sinks[dst].arrived("real-"+dst.String(), 0) {
			t.Errorf("guest address reached %s outside its policy", dst)
		}
	}
}

// TestNetpolicyAttest: attested addresses are reachable until their timeout
// and then not for new connections, while an established connection
// survives; port-constrained attests open only their ports; re-attesting
// refreshes the timeout.
func TestNetpolicyAttest(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	s, _ := e.session(t, "att", netpolicy.ModeAllowlist, nil)
	ns := s.NetnsPath
	web0, web1, web2 := w.Web[0], w.Web[1], w.Web[2]
	expectBlocked(t, "before attest", tcpProbe(ns, netip.AddrPortFrom(web2, 7)), tcpProbe(ns, netip.AddrPortFrom(web0, 7)))

	eff, err := e.fw.Attest(s.Guest, []netip.Addr{web2}, 0, nil)
	if err != nil {
		t.Fatalf("attest: %v", err)
	}
	if eff != time.Second {
		t.Errorf("attest with ttl 0 took %s, want the floor 1s", eff)
	}
	if eff, err = e.fw.Attest(s.Guest, []netip.Addr{web2}, 2*time.Second, nil); err != nil || eff != 2*time.Second {
		t.Fatalf("attest 2s: %s %v", eff, err)
	}
	attestedAt := time.Now()
	conn, err := world.DialTCP(ns, netip.AddrPortFrom(web2, 7), world.ReachTimeout)
	if err != nil {
		t.Fatalf("connect to attested address: %v", err)
	}
	defer conn.Close()
	expectReach(t, "attested address", allThree(ns, web2)...)

	if _, err := e.fw.Attest(s.Guest, []netip.Addr{web1}, 30*time.Second, []netpolicy.PortSpec{{Port: 7, Proto: netpolicy.ProtoUDP}}); err != nil {
		t.Fatalf("attest with port: %v", err)
	}
	expectReach(t, "attested port", udpProbe(ns, netip.AddrPortFrom(web1, 7)))
	expectBlocked(t, "attested address outside its port", tcpProbe(ns, netip.AddrPortFrom(web1, 7)), pingProbe(ns, web1), httpProbe(ns, web1))

	list, err := e.fw.Attested(s.Guest)
	if err != nil {
		t.Fatalf("attested: %v", err)
	}
	var sawPlain, sawPort bool
	for _, a := range list {
		sawPlain = sawPlain || (a.IP == web2 && a.Port == 0 && a.Expires > 0 && a.Expires <= 2*time.Second)
		sawPort = sawPort || (a.IP == web1 && a.Port == 7 && a.Proto == netpolicy.ProtoUDP)
	}
	if !sawPlain || !sawPort {
		t.Errorf("attested list %+v lacks %s (any port, <=2s) or %s:7/udp", list, web2, web1)
	}

	// Refresh: web0 attested for 2s, re-attested after 1.2s, still open at 2.5s.
	if _, err := e.fw.Attest(s.Guest, []netip.Addr{web0}, 2*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	refreshStart := time.Now()
	time.Sleep(time.Until(attestedAt.Add(2500 * time.Millisecond)))
	// (Not ICMP: the probes reuse one echo id, so conntrack sees the earlier
	// pings' flow, which is established and outlives the element like any
	// established flow.)
	expectBlocked(t, "attested address after its timeout", tcpProbe(ns, netip.AddrPortFrom(web2, 7)), udpProbe(ns, netip.AddrPortFrom(web2, 7)))
	if err := echoOn(conn); err != nil {
		t.Errorf("established connection did not survive the expiry: %v", err)
	}
	time.Sleep(time.Until(refreshStart.Add(1200 * time.Millisecond)))
	if _, err := e.fw.Attest(s.Guest, []netip.Addr{web0}, 2*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(refreshStart.Add(2500 * time.Millisecond)))
	expectReach(t, "re-attested address past its first timeout", tcpProbe(ns, netip.AddrPortFrom(web0, 7)))

	c, err := e.fw.Counters(s.Guest)
	if err != nil || c.AcceptedPackets == 0 || c.DroppedPackets == 0 {
		t.Errorf("counters %+v %v: want both moved", c, err)
	}
}

func echoOn(c net.Conn) error {
	c.SetDeadline(time.Now().Add(world.ReachTimeout))
	msg := []byte("still-there")
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := c.Read(got); err != nil {
		return err
	}
	if string(got) != string(msg) {
		return errors.New("echo mismatch: " + string(got))
	}
	return nil
}

// TestNetpolicyRestartAndIdempotence: AddSession and RemoveSession twice are
// fine; a second Firewall on the existing table (a restarted daemon) keeps
// every element; removing one session leaves the others and the peers
// pointing at it are gone; a failed batch does not poison later ones.
func TestNetpolicyRestartAndIdempotence(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	static := []netpolicy.Target{staticHost(w.Web[0])}
	a, ra := e.session(t, "a", netpolicy.ModeAllowlist, static)
	b, _ := e.session(t, "b", netpolicy.ModeAllowlist, static, a.Guest)
	echoListeners(t, a.NetnsPath, netip.AddrPortFrom(a.Guest, 7))
	toA := tcpProbe(b.NetnsPath, netip.AddrPortFrom(a.Guest, 7)) // a new connection each time
	if err := e.fw.AddSession(ra); err != nil {
		t.Fatalf("second AddSession: %v", err)
	}
	if _, err := e.fw.Attest(a.Guest, []netip.Addr{w.Web[2]}, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	expectReach(t, "before restart", tcpProbe(a.NetnsPath, netip.AddrPortFrom(w.Web[0], 7)), tcpProbe(a.NetnsPath, netip.AddrPortFrom(w.Web[2], 7)))
	before, err := e.fw.Counters(a.Guest)
	if err != nil {
		t.Fatal(err)
	}

	// The daemon goes away: the kernel keeps enforcing.
	closed := e.fw
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	expectReach(t, "daemon down", tcpProbe(a.NetnsPath, netip.AddrPortFrom(w.Web[0], 7)))
	expectBlocked(t, "daemon down", tcpProbe(a.NetnsPath, netip.AddrPortFrom(w.Web[1], 7)))
	// A closed handle refuses everything, even an attest it could answer
	// from memory (web2 was attested through it), and closes again quietly.
	if err := closed.Ensure(); !errors.Is(err, nft.ErrClosed) {
		t.Errorf("Ensure after Close = %v, want ErrClosed", err)
	}
	if _, err := closed.Attest(a.Guest, []netip.Addr{w.Web[2]}, time.Minute, nil); !errors.Is(err, nft.ErrClosed) {
		t.Errorf("Attest after Close = %v, want ErrClosed", err)
	}
	if _, err := closed.Counters(a.Guest); !errors.Is(err, nft.ErrClosed) {
		t.Errorf("Counters after Close = %v, want ErrClosed", err)
	}
	if _, err := closed.OpenDropLog(); !errors.Is(err, nft.ErrClosed) {
		t.Errorf("OpenDropLog after Close = %v, want ErrClosed", err)
	}
	if err := closed.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	e.reopenFirewall(t) // the cleanups use the live one
	fw2 := e.fw
	if err := fw2.Ensure(); err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
	expectReach(t, "after restart", tcpProbe(a.NetnsPath, netip.AddrPortFrom(w.Web[0], 7)), tcpProbe(a.NetnsPath, netip.AddrPortFrom(w.Web[2], 7)),
		toA)
	sessions, err := fw2.Sessions()
	if err != nil {
		t.Fatal(err)
	}
	want := map[nft.SessionKey]bool{{HostIface: a.HostIface, Guest: a.Guest}: true, {HostIface: b.HostIface, Guest: b.Guest}: true}
	for _, k := range sessions {
		delete(want, k)
	}
	if len(want) != 0 || len(sessions) != 2 {
		t.Errorf("sessions after restart = %+v, missing %v", sessions, want)
	}
	if list, err := fw2.Attested(a.Guest); err != nil || len(list) != 1 || list[0].IP != w.Web[2] {
		t.Errorf("attested after restart = %+v %v", list, err)
	}
	after, err := fw2.Counters(a.Guest)
	if err != nil || after.AcceptedPackets < before.AcceptedPackets || after.AcceptedPackets == 0 {
		t.Errorf("counters after restart %+v (before %+v) %v", after, before, err)
	}

	for i := 0; i < 2; i++ {
		if err := fw2.RemoveSession(ra); err != nil {
			t.Fatalf("RemoveSession call %d: %v", i+1, err)
		}
	}
	expectBlocked(t, "removed session", tcpProbe(a.NetnsPath, netip.AddrPortFrom(w.Web[0], 7)), tcpProbe(a.NetnsPath, netip.AddrPortFrom(w.Web[2], 7)),
		toA)
	expectReach(t, "the other session after a removal", tcpProbe(b.NetnsPath, netip.AddrPortFrom(w.Web[0], 7)))
	peers := run(t, "ip", "netns", "exec", w.HostName, "nft", "list", "set", "inet", e.prefix, "peers")
	if strings.Contains(peers, a.Guest.String()) {
		t.Errorf("peer elements naming the removed session remain:\n%s", peers)
	}
	if list, err := fw2.Attested(a.Guest); err != nil || len(list) != 0 {
		t.Errorf("attested after removal = %+v %v", list, err)
	}
	if c, err := fw2.Counters(a.Guest); err != nil || !reflect.DeepEqual(c, nft.Counters{}) {
		t.Errorf("counters after removal = %+v %v", c, err)
	}

	// A batch the kernel rejects (no table) must not poison the connection.
	if err := fw2.DeleteTable(); err != nil {
		t.Fatal(err)
	}
	if _, err := fw2.Attest(b.Guest, []netip.Addr{w.Web[2]}, time.Minute, nil); err == nil {
		t.Fatalf("attest without a table succeeded")
	}
	if err := fw2.Ensure(); err != nil {
		t.Fatalf("ensure after delete: %v", err)
	}
	if _, err := fw2.Attest(b.Guest, []netip.Addr{w.Web[2]}, time.Minute, nil); err != nil {
		t.Fatalf("attest after a failed batch: %v", err)
	}
}

// TestNetpolicyIPv6GoesNowhere: even when both ends of a session's veth get
// IPv6 back (a guest with CAP_NET_ADMIN re-enables it; a host misconfigured),
// IPv6 from the session reaches nothing in the simulated host.
func TestNetpolicyIPv6GoesNowhere(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	s, _ := e.session(t, "six", netpolicy.ModePublic, nil)
	nsName := nsmgr.NetnsName(e.prefix, "six")
	setSysctl := func(do func(func() error) error, kv map[string]string) {
		t.Helper()
		err := do(func() error {
			for k, v := range kv {
				if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte(v), 0o644); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("enable ipv6: %v", err)
		}
	}
	setSysctl(func(fn func() error) error { return world.DoPath(s.NetnsPath, fn) }, map[string]string{"all": "0", "default": "0", "eth0": "0"})
	setSysctl(func(fn func() error) error { return nsmgr.Do(w.Host, fn) }, map[string]string{s.HostIface: "0"})
	run(t, "ip", "netns", "exec", nsName, "ip", "-6", "addr", "add", "fd00:20::2/64", "dev", "eth0", "nodad")
	run(t, "ip", "netns", "exec", w.HostName, "ip", "-6", "addr", "add", "fd00:20::1/64", "dev", s.HostIface, "nodad")
	dst := netip.MustParseAddrPort("[fd00:20::1]:9996")

	var sink net.PacketConn
	err := nsmgr.Do(w.Host, func() (err error) { sink, err = net.ListenPacket("udp6", dst.String()); return err })
	if err != nil {
		t.Fatalf("listen %s: %v", dst, err)
	}
	defer sink.Close()
	send := func(ns string) error {
		return world.DoPath(ns, func() error {
			c, err := net.DialUDP("udp6", nil, net.UDPAddrFromAddrPort(dst))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte(ns))
			return err
		})
	}
	received := func(timeout time.Duration) string {
		buf := make([]byte, 512)
		sink.SetReadDeadline(time.Now().Add(timeout))
		n, _, err := sink.ReadFrom(buf)
		if err != nil {
			return ""
		}
		return string(buf[:n])
	}
	// Positive control, retried: a freshly re-enabled interface can take a
	// moment before its address accepts traffic.
	ok := false
	for i := 0; i < 15 && !ok; i++ {
		if err := send(w.HostPath); err != nil {
			t.Logf("send inside the simulated host: %v", err)
		}
		ok = received(200*time.Millisecond) == w.HostPath
	}
	if !ok {
		t.Fatalf("positive control: ipv6 sink not reachable inside the simulated host")
	}
	for i := 0; i < 3; i++ {
		_ = send(s.NetnsPath) // may fail once neighbour discovery gives up: also "nowhere"
	}
	if got := received(world.BlockTimeout); got != "" {
		t.Errorf("ipv6 datagram from the session arrived: %q", got)
	}
}

// fakeSession returns rules for slot i of the pool without a network: the
// firewall only stores elements, so scale tests need no veths.
func fakeSession(prefix string, i int) nft.SessionRules {
	g := netip.AddrFrom4([4]byte{10, 20, byte(i >> 6), byte(i&63)*4 + 2})
	return nft.SessionRules{Name: "fake", HostIface: prefix + strconv.Itoa(i) + "h", Guest: g, Egress: netpolicy.ModeAllowlist,
		Static: []netpolicy.Target{{Prefix: netip.MustParsePrefix("93.184.216.34/32")}, {Prefix: netip.MustParsePrefix("93.184.216.35/32"), Port: 443}}}
}

// TestNetpolicyLargeBatches: thousands of sessions, a session with thousands
// of static targets, and an attest of thousands of addresses go through one
// batch each (no ENOBUFS or EMSGSIZE), list back completely, and are removed.
func TestNetpolicyLargeBatches(t *testing.T) {
	e := newNPEnv(t, time.Second)
	const sessions = 2000
	for i := 0; i < sessions; i++ {
		if err := e.fw.AddSession(fakeSession(e.prefix, i)); err != nil {
			t.Fatalf("add fake session %d: %v", i, err)
		}
	}
	big := fakeSession(e.prefix, sessions)
	big.Static = nil
	for _, a := range world.PublicAddrs(3000) {
		big.Static = append(big.Static, netpolicy.Target{Prefix: netip.PrefixFrom(a, 32), Port: 443})
	}
	if err := e.fw.AddSession(big); err != nil {
		t.Fatalf("add session with 3000 static targets: %v", err)
	}
	if _, err := e.fw.Attest(big.Guest, world.PublicAddrs(3000), time.Minute, nil); err != nil {
		t.Fatalf("attest 3000 addresses: %v", err)
	}
	list, err := e.fw.Attested(big.Guest)
	if err != nil || len(list) != 3000 {
		t.Fatalf("attested: %d addresses, %v; want 3000", len(list), err)
	}
	keys, err := e.fw.Sessions()
	if err != nil || len(keys) != sessions+1 {
		t.Fatalf("sessions: %d, %v; want %d", len(keys), err, sessions+1)
	}
	all, err := e.fw.AllCounters()
	if err != nil || len(all) != sessions+1 {
		t.Fatalf("counters: %d, %v", len(all), err)
	}
	if err := e.fw.RemoveSession(big); err != nil {
		t.Fatalf("remove big session: %v", err)
	}
	if list, err := e.fw.Attested(big.Guest); err != nil || len(list) != 0 {
		t.Errorf("after removal: %d attested, %v", len(list), err)
	}
	static := run(t, "ip", "netns", "exec", e.w.HostName, "nft", "list", "set", "inet", e.prefix, "static_ports")
	if strings.Contains(static, big.Guest.String()+" ") {
		t.Errorf("static_ports still holds elements of the removed session")
	}
}

// BenchmarkNetpolicyScaling measures Attest, AddSession and RemoveSession
// with 10 and with 4000 sessions loaded (the design keeps them flat).
func BenchmarkNetpolicyScaling(b *testing.B) {
	for _, loaded := range []int{10, 4000} {
		b.Run("sessions="+strconv.Itoa(loaded), func(b *testing.B) {
			w := world.New(b)
			prefix := "b" + w.ID[:4]
			g, err := netpolicy.NewGuard(nsmgr.DefaultPool, []netip.Prefix{w.PublicOverride})
			if err != nil {
				b.Fatal(err)
			}
			fw, err := nft.OpenFirewall(nft.FirewallConfig{NetNS: w.Host, Prefix: prefix, Pool: nsmgr.DefaultPool,
				DNSAddr: netip.MustParseAddr("10.20.255.254"), Guard: g, AttestFloor: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			defer fw.Close()
			if err := fw.Ensure(); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < loaded; i++ {
				if err := fw.AddSession(fakeSession(prefix, i)); err != nil {
					b.Fatal(err)
				}
				if _, err := fw.Attest(fakeSession(prefix, i).Guest, world.PublicAddrs(8), time.Minute, nil); err != nil {
					b.Fatal(err)
				}
			}
			probe := fakeSession(prefix, loaded)
			if err := fw.AddSession(probe); err != nil {
				b.Fatal(err)
			}
			ips := world.PublicAddrs(4)
			b.Run("attest", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					if _, err := fw.Attest(probe.Guest, ips, time.Minute, nil); err != nil {
						b.Fatal(err)
					}
				}
			})
			// attest-parallel: the DNS proxy's pattern, many answers in
			// flight for many sessions (group-committed batches).
			b.Run("attest-parallel", func(b *testing.B) {
				var next atomic.Int32
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					g := fakeSession(prefix, int(next.Add(1))%loaded).Guest
					for pb.Next() {
						if _, err := fw.Attest(g, ips, time.Minute, nil); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
			b.Run("add-session", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					r := fakeSession(prefix, loaded+1+i%1000)
					if err := fw.AddSession(r); err != nil {
						b.Fatal(err)
					}
				}
			})
			// remove-session: a session with 8 attested addresses, as the
			// loaded ones have, removed with the rules it was added with.
			b.Run("remove-session", func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					r := fakeSession(prefix, loaded+1+i%1000)
					if err := fw.AddSession(r); err != nil {
						b.Fatal(err)
					}
					if _, err := fw.Attest(r.Guest, world.PublicAddrs(8), time.Minute, nil); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if err := fw.RemoveSession(r); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// TestNetpolicyConcurrentUse: attests from many goroutines (the DNS proxy's
// hot path) interleaved with session adds and removals on the same Firewall.
func TestNetpolicyConcurrentUse(t *testing.T) {
	e := newNPEnv(t, time.Second)
	const workers, perWorker = 8, 100
	for i := 0; i < workers; i++ {
		if err := e.fw.AddSession(fakeSession(e.prefix, i)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*perWorker*2)
	for i := 0; i < workers; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			g := fakeSession(e.prefix, i).Guest
			for j := 0; j < perWorker; j++ {
				eff, err := e.fw.Attest(g, world.PublicAddrs(j + 1)[j:], 48*time.Hour, nil)
				if err != nil {
					errs <- err
				} else if eff != nft.MaxAttestTimeout {
					errs <- errors.New("attest timeout not clamped to the maximum: " + eff.String())
				}
			}
		}()
		go func() {
			defer wg.Done()
			r := fakeSession(e.prefix, 100+i)
			for j := 0; j < 10; j++ {
				if err := e.fw.AddSession(r); err != nil {
					errs <- err
				}
				if err := e.fw.RemoveSession(r); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := 0; i < workers; i++ {
		list, err := e.fw.Attested(fakeSession(e.prefix, i).Guest)
		if err != nil || len(list) != perWorker {
			t.Errorf("session %d: %d attested, %v; want %d", i, len(list), err, perWorker)
		}
	}
	keys, err := e.fw.Sessions()
	if err != nil || len(keys) != workers {
		t.Errorf("sessions after churn: %+v %v", keys, err)
	}
}
