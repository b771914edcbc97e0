package integration

// The attacks of issue 26 item 4, for IPv6: a dual-stack guest with
// NET_RAW and NET_ADMIN in its netns sends router advertisements, NDP and
// DAD games, extension headers and fragments, link-local and multicast
// traffic to the host side, spoofed sources, ICMPv6 errors quoting other
// flows, and v4-mapped and NAT64 destinations. Each test asserts the
// refusal where the packet would arrive next to a positive control (the
// same injection channel reaching the world, or the legitimate use).

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// TestAttack6RouterAdvert: a guest sends router advertisements (a default
// router, an on-link autonomous prefix, a route) to all-nodes, to the host
// veth's link-local and to its gateway address. The host installs no
// route, address or default router, and another session's netns neither
// receives them nor changes. Control: the guest's own neighbour discovery
// with its gateway works (its v6 flows to an allowed destination pass).
func TestAttack6RouterAdvert(t *testing.T) {
	e, _, udp := atk6World(t)
	a := atk6Session(t, e, "ra", "--allow", atk6Allowed.String())
	b := atk6Session(t, e, "rb", "--allow", atk6Allowed.String())
	bICMP := atk6Sniff(t, b.ns, unix.IPPROTO_ICMPV6)
	hostBefore, bBefore := atk6State(t, e.w.Host), atk6State(t, mustNetns(t, b.ns))

	prefix, route := netip.MustParsePrefix("2001:2:bad::/64"), netip.MustParsePrefix("2001:2:bad1::/48")
	src := a.ll
	allNodes := netip.MustParseAddr("ff02::1")
	ra := func(dst netip.Addr) []byte {
		return world.Packet6(src, dst, 255, nil, unix.IPPROTO_ICMPV6, world.ICMP6(src, dst, 134, 0, atk6RA(prefix, route, a.mac)))
	}
	a.sendTo(t, world.MulticastMAC6(allNodes), ra(allNodes))
	a.send(t, ra(a.hostLL))
	a.send(t, ra(a.gw6))
	// A second burst, as a router repeats itself.
	time.Sleep(200 * time.Millisecond)
	a.sendTo(t, world.MulticastMAC6(allNodes), ra(allNodes))

	p := prefix.Addr().As16()
	if bICMP.Saw(p[:8], 2*time.Second) {
		t.Errorf("session %s received %s's router advertisement", b.name, a.name)
	}
	if got := atk6State(t, e.w.Host); got != hostBefore {
		t.Errorf("the host's v6 routes or addresses changed after router advertisements:\nbefore:\n%s\nafter:\n%s", hostBefore, got)
	}
	if got := atk6State(t, mustNetns(t, b.ns)); got != bBefore {
		t.Errorf("session %s's v6 routes or addresses changed:\nbefore:\n%s\nafter:\n%s", b.name, bBefore, got)
	}

	if err := world.TCPEcho(a.ns, netip.AddrPortFrom(atk6Allowed, 7), 3*time.Second); err != nil {
		t.Errorf("control: %s's own v6 flow to its allowed %s: %v", a.name, atk6Allowed, err)
	}
	atk6Control(t, e, a, udp)
}

// TestAttack6NDPGames: a guest plays neighbour discovery against the host
// side: unsolicited override advertisements claiming its gateway (the
// host's own address), another session's gateway, another session's
// address and the DNS address; solicitations and advertisements with a hop
// limit of 64; a solicitation from another session's address carrying its
// own MAC; DAD probes (from ::) for the host's address and another
// session's. The host's addresses keep their flags, its neighbour entry
// for the other session stays on that session's veth with that session's
// MAC, no entry binds another session's address to the attacker's MAC,
// and the other session keeps reaching its destination (the control).
func TestAttack6NDPGames(t *testing.T) {
	e, _, udp := atk6World(t)
	a := atk6Session(t, e, "nda", "--allow", atk6Allowed.String())
	b := atk6Session(t, e, "ndb", "--allow", atk6Denied.String())
	bDst := netip.AddrPortFrom(atk6Denied, 7) // b's allowed destination
	if err := world.TCPEcho(b.ns, bDst, 3*time.Second); err != nil {
		t.Fatalf("control before: %s to %s: %v", b.name, bDst, err)
	}
	bVeth := atk6LinkIndex(t, e.w.Host, b.hostVeth)
	if got := atk6Neigh(t, e.w.Host, b.g6); got[bVeth] != b.mac.String() {
		t.Fatalf("control: the host's neighbour entry for %s is %v, want %s on %s", b.g6, got, b.mac, b.hostVeth)
	}
	hostBefore := atk6State(t, e.w.Host)
	dns6 := netip.MustParseAddr(e.inspect(a.name).DNS6)

	allNodes := netip.MustParseAddr("ff02::1")
	var pkts [][]byte
	na := func(src, dst, target netip.Addr, hop uint8, router bool) []byte {
		return world.Packet6(src, dst, hop, nil, unix.IPPROTO_ICMPV6, world.ICMP6(src, dst, 136, 0, atk6NA(target, a.mac, router)))
	}
	ns := func(src, dst, target netip.Addr, hop uint8, mac net.HardwareAddr) []byte {
		return world.Packet6(src, dst, hop, nil, unix.IPPROTO_ICMPV6, world.ICMP6(src, dst, 135, 0, atk6NS(target, mac)))
	}
	for _, target := range []netip.Addr{a.gw6, b.gw6, b.g6, dns6} {
		for _, hop := range []uint8{255, 64} {
			pkts = append(pkts, na(a.g6, allNodes, target, hop, true), na(a.g6, a.gw6, target, hop, true), na(a.ll, allNodes, target, hop, true))
		}
		// DAD: "is anyone using this address?" from ::, to the target's
		// solicited-node group.
		pkts = append(pkts, ns(netip.IPv6Unspecified(), atk6SolicitedNode(target), target, 255, nil))
	}
	pkts = append(pkts,
		ns(a.g6, a.gw6, a.gw6, 64, net.HardwareAddr{2, 0, 0, 0, 0xba, 0xd}), // hop limit != 255
		ns(b.g6, a.gw6, a.gw6, 255, a.mac),                                  // another session's address as the source
		ns(b.g6, atk6SolicitedNode(a.gw6), a.gw6, 255, a.mac),
	)
	for _, p := range pkts {
		dst := netip.AddrFrom16([16]byte(p[24:40]))
		if dst.IsMulticast() {
			a.sendTo(t, world.MulticastMAC6(dst), p)
		} else {
			a.send(t, p)
		}
	}
	time.Sleep(500 * time.Millisecond)

	if got := atk6State(t, e.w.Host); got != hostBefore {
		t.Errorf("the host's v6 routes or addresses changed after NDP games:\nbefore:\n%s\nafter:\n%s", hostBefore, got)
	}
	got := atk6Neigh(t, e.w.Host, b.g6)
	if got[bVeth] != b.mac.String() {
		t.Errorf("the host's neighbour entry for %s on %s is %q, want %s", b.g6, b.hostVeth, got[bVeth], b.mac)
	}
	for idx, mac := range got {
		if mac == a.mac.String() {
			t.Errorf("the host binds %s's address %s to %s's MAC %s (link %d)", b.name, b.g6, a.name, mac, idx)
		}
	}
	for _, target := range []netip.Addr{b.gw6, dns6} {
		for idx, mac := range atk6Neigh(t, e.w.Host, target) {
			if mac == a.mac.String() {
				t.Errorf("the host binds its own %s to %s's MAC %s (link %d)", target, a.name, mac, idx)
			}
		}
	}
	if err := world.TCPEcho(b.ns, bDst, 3*time.Second); err != nil {
		t.Errorf("control: %s to its %s after %s's NDP games: %v", b.name, bDst, a.name, err)
	}
	if _, err := world.Lookup(b.ns, netip.AddrPortFrom(dns6, 53), "web6.e2e.test", dns.TypeAAAA, false, 3*time.Second); err != nil {
		t.Errorf("control: %s's DNS over v6 after %s's NDP games: %v", b.name, a.name, err)
	}
	if err := world.TCPEcho(a.ns, netip.AddrPortFrom(atk6Allowed, 7), 3*time.Second); err != nil {
		t.Errorf("control: %s's own neighbour discovery and flow: %v", a.name, err)
	}
	atk6Control(t, e, a, udp)
}

// TestAttack6NeighbourFlood: a guest sends neighbour solicitations, hop
// limit 255 and carrying its MAC, from 200 link-local sources it makes up,
// half to the host veth's link-local address and half to the solicited-node
// group of its gateway: the host's neighbour table gains no entry for any
// of them, on the guest's veth or elsewhere (a flood of them would crowd
// the table all of the host shares up to gc_thresh3). The guest's eth0
// holds one link-local address, the pinned nsmgr.GuestLinkLocal6, and no
// kernel-generated one. Controls: the same solicitation from that pinned
// address puts it in the host's neighbour table with the guest's MAC (the
// channel creates entries when the table lets it through), and the guest's
// own neighbour discovery and flow to its allowed destination work.
func TestAttack6NeighbourFlood(t *testing.T) {
	e, _, udp := atk6World(t)
	a := atk6Session(t, e, "nfl", "--allow", atk6Allowed.String())
	if got := atk6LinkLocals(t, mustNetns(t, a.ns), "eth0"); len(got) != 1 || got[0] != nsmgr.GuestLinkLocal6 {
		t.Fatalf("%s's eth0 has link-local addresses %v, want only %s", a.name, got, nsmgr.GuestLinkLocal6)
	}
	veth := atk6LinkIndex(t, e.w.Host, a.hostVeth)
	before := atk6NeighCount(t, e.w.Host, veth)

	ns := func(src, dst, target netip.Addr) []byte {
		return world.Packet6(src, dst, 255, nil, unix.IPPROTO_ICMPV6, world.ICMP6(src, dst, 135, 0, atk6NS(target, a.mac)))
	}
	group := atk6SolicitedNode(a.gw6)
	var unicast, multicast [][]byte
	var madeUp []netip.Addr
	for i := range 200 {
		b := [16]byte{0xfe, 0x80, 8: 0x02, 9: 0x5e, 10: byte(i >> 8), 11: byte(i), 12: byte(rand.IntN(256)), 13: byte(rand.IntN(256)), 14: 0xaa, 15: byte(i)}
		src := netip.AddrFrom16(b)
		madeUp = append(madeUp, src)
		if i%2 == 0 {
			unicast = append(unicast, ns(src, a.hostLL, a.hostLL))
		} else {
			multicast = append(multicast, ns(src, group, a.gw6))
		}
	}
	a.send(t, unicast...)
	a.sendTo(t, world.MulticastMAC6(group), multicast...)
	time.Sleep(500 * time.Millisecond)

	for _, src := range madeUp {
		if got := atk6Neigh(t, e.w.Host, src); len(got) > 0 {
			t.Errorf("the host has a neighbour entry for the made-up link-local %s: %v", src, got)
			break
		}
	}
	if after := atk6NeighCount(t, e.w.Host, veth); after > before {
		t.Errorf("the host's v6 neighbour entries on %s grew from %d to %d after %d solicitations from made-up link-local sources", a.hostVeth, before, after, len(madeUp))
	}

	// Control: the guest's own link-local passes, and the host learns it.
	a.send(t, ns(nsmgr.GuestLinkLocal6, a.hostLL, a.hostLL))
	deadline := time.Now().Add(3 * time.Second)
	for atk6Neigh(t, e.w.Host, nsmgr.GuestLinkLocal6)[veth] != a.mac.String() {
		if time.Now().After(deadline) {
			t.Fatalf("control: after a solicitation from %s the host's neighbour entries for it are %v, want %s on %s",
				nsmgr.GuestLinkLocal6, atk6Neigh(t, e.w.Host, nsmgr.GuestLinkLocal6), a.mac, a.hostVeth)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := world.TCPEcho(a.ns, netip.AddrPortFrom(atk6Allowed, 7), 3*time.Second); err != nil {
		t.Errorf("control: %s's own neighbour discovery and flow: %v", a.name, err)
	}
	atk6Control(t, e, a, udp)
}

// TestAttack6ExtensionHeaders: a TCP SYN (carrying a marker) to a
// destination the session is denied, behind a hop-by-hop header,
// destination options, both, an atomic fragment, a tiny first fragment
// (the TCP header split over two fragments) or overlapping fragments
// rewriting the port: never delivered. Behind a routing header (type 0,
// 2, or a segment routing header, type 4, whose first segment is the
// allowed destination and whose last is the denied one; the world's
// server processes segment routing): never delivered, neither to the
// denied destination nor to the allowed first segment. The same headers
// before a SYN to the allowed destination pass (stated in the network
// model), and the plain SYN passes (the control).
func TestAttack6ExtensionHeaders(t *testing.T) {
	e, tcp, udp := atk6World(t)
	// The world's servers process segment routing headers, as a router
	// of the internet may.
	for _, k := range []string{"all", "default", "downlink", "lo"} {
		if err := world.DoPath(e.w.NetPath, func() error {
			return os.WriteFile(filepath.Join("/proc/sys/net/ipv6/conf", k, "seg6_enabled"), []byte("1"), 0o644)
		}); err != nil {
			t.Fatal(err)
		}
	}
	a := atk6Session(t, e, "xh", "--allow", fmt.Sprintf("[%s]:7/tcp", atk6Allowed), "--allow", fmt.Sprintf("[%s]:7/udp", atk6Allowed))
	hbh, dst := world.Options6(0), world.Options6(unix.IPPROTO_DSTOPTS)
	syn := func(to netip.AddrPort, m []byte) []byte {
		return world.TCPSyn6(netip.AddrPortFrom(a.g6, atk6Port()), to, m)
	}
	type tc struct {
		what string
		pkts func(m []byte) [][]byte
		pass bool
	}
	plain := func(to netip.AddrPort, exts ...world.Ext6) func([]byte) [][]byte {
		return func(m []byte) [][]byte {
			return [][]byte{world.Packet6(a.g6, to.Addr(), 64, exts, unix.IPPROTO_TCP, syn(to, m))}
		}
	}
	// split: two fragments, the first with n bytes of the segment (a
	// multiple of 8), sent last first. tiny: the first holds 8 bytes of
	// the TCP header (the ports, not the flags), the second the rest.
	split := func(to netip.AddrPort, n int) func([]byte) [][]byte {
		return func(m []byte) [][]byte {
			l4, id := syn(to, m), rand32()
			return [][]byte{
				world.Packet6(a.g6, to.Addr(), 64, []world.Ext6{world.Fragment6(uint16(n/8), false, id)}, unix.IPPROTO_TCP, l4[n:]),
				world.Packet6(a.g6, to.Addr(), 64, []world.Ext6{world.Fragment6(0, true, id)}, unix.IPPROTO_TCP, l4[:n]),
			}
		}
	}
	tiny := func(to netip.AddrPort) func([]byte) [][]byte { return split(to, 8) }
	allowed, denied := netip.AddrPortFrom(atk6Allowed, 7), netip.AddrPortFrom(atk6Denied, 7)
	deniedPort := netip.AddrPortFrom(atk6Allowed, 80)
	// overlap: the first fragment names the allowed port, a second one at
	// offset 0 the denied port 80 (a filter that judged the first and a
	// host that kept the last would disagree).
	overlap := func(m []byte) [][]byte {
		src := netip.AddrPortFrom(a.g6, atk6Port())
		first, last, id := world.TCPSyn6(src, allowed, m), world.TCPSyn6(src, deniedPort, m), rand32()
		return [][]byte{
			world.Packet6(a.g6, atk6Allowed, 64, []world.Ext6{world.Fragment6(0, true, id)}, unix.IPPROTO_TCP, first[:16]),
			world.Packet6(a.g6, atk6Allowed, 64, []world.Ext6{world.Fragment6(0, false, id)}, unix.IPPROTO_TCP, last),
		}
	}
	routed := func(rh world.Ext6) func([]byte) [][]byte {
		return func(m []byte) [][]byte {
			// Checksummed for the first segment, the allowed one, as the
			// host's conntrack verifies it (the denied destination's TCP
			// then discards it, but its stack has the bytes: any raw
			// listener there reads them).
			l4 := world.TCPSyn6(netip.AddrPortFrom(a.g6, atk6Port()), allowed, m)
			return [][]byte{world.Packet6(a.g6, atk6Allowed, 64, []world.Ext6{rh}, unix.IPPROTO_TCP, l4)}
		}
	}
	// Control: with no table in the way (from the simulated host), the
	// world delivers a segment-routed SYN via the allowed server to the
	// denied one.
	down, _ := atk6Link(t, e.w.Net, "downlink")
	hm := atkMarker(e.w, "xh-host")
	hl4 := world.TCPSyn6(netip.AddrPortFrom(e.w.Uplink6, atk6Port()), denied, hm)
	srh := world.Packet6(e.w.Uplink6, atk6Allowed, 64, []world.Ext6{world.Routing6(4, 1, atk6Denied, atk6Allowed)}, unix.IPPROTO_TCP, hl4)
	if err := world.SendFrames6(e.w.HostPath, "uplink", down, srh); err != nil {
		t.Fatal(err)
	}
	if !tcp.Saw(hm, 3*time.Second) {
		t.Fatal("control: the world does not deliver a segment-routed SYN from the simulated host")
	}
	for _, c := range []tc{
		{"control: plain SYN to the allowed destination", plain(allowed), true},
		{"plain SYN to the denied destination", plain(denied), false},
		{"hop-by-hop to the denied destination", plain(denied, hbh), false},
		{"destination options to the denied destination", plain(denied, dst), false},
		{"hop-by-hop and destination options to the denied destination", plain(denied, hbh, dst), false},
		{"atomic fragment to the denied destination", plain(denied, world.Fragment6(0, false, rand32())), false},
		{"two fragments to the denied destination", split(denied, 24), false},
		{"two fragments to the denied port", split(deniedPort, 24), false},
		{"tiny first fragment to the denied destination", tiny(denied), false},
		{"tiny first fragment to the denied port", tiny(deniedPort), false},
		{"overlapping fragments rewriting the port", overlap, false},
		{"routing header type 0 via the allowed destination to the denied one", routed(world.Routing6(0, 1, atk6Denied)), false},
		{"routing header type 2 via the allowed destination to the denied one", routed(world.Routing6(2, 1, atk6Denied)), false},
		{"segment routing header via the allowed destination to the denied one", routed(world.Routing6(4, 1, atk6Denied, atk6Allowed)), false},
		{"hop-by-hop to the allowed destination", plain(allowed, hbh), true},
		{"destination options to the allowed destination", plain(allowed, dst), true},
		{"atomic fragment to the allowed destination", plain(allowed, world.Fragment6(0, false, rand32())), true},
		{"two fragments to the allowed destination", split(allowed, 24), true},
		{"hop-by-hop, destination options and two fragments to the allowed destination", func(m []byte) [][]byte {
			l4, id := syn(allowed, m), rand32()
			return [][]byte{
				world.Packet6(a.g6, allowed.Addr(), 64, []world.Ext6{hbh, dst, world.Fragment6(0, true, id)}, unix.IPPROTO_TCP, l4[:24]),
				world.Packet6(a.g6, allowed.Addr(), 64, []world.Ext6{hbh, dst, world.Fragment6(3, false, id)}, unix.IPPROTO_TCP, l4[24:]),
			}
		}, true},
		// The kernel's reassembly drops a first fragment without the whole
		// upper-layer header (RFC 7112), wherever it goes.
		{"tiny first fragment to the allowed destination", tiny(allowed), false},
	} {
		m := atkMarker(e.w, "xh")
		a.send(t, c.pkts(m)...)
		wait := 2 * time.Second
		if !c.pass {
			wait = time.Second
		}
		if got := tcp.Saw(m, wait); got != c.pass {
			t.Errorf("%s: delivered in the world = %v, want %v", c.what, got, c.pass)
		}
	}
	atk6Control(t, e, a, udp)
}

// rand32 is a fresh fragment identification.
func rand32() uint32 { return rand.Uint32() }

// TestAttack6LinkLocal: a guest sends UDP and TCP to a port a host service
// listens on (bound to :: in the host's netns): to the host veth's
// link-local address, to all-nodes and all-routers, to its gateway
// address, to the v6 DNS address, and to another session's link-local
// address (through the host veth), from its link-local source and its own.
// Nothing reaches the host service or the other session. Controls: the
// service hears a datagram from the world, and DNS to the v6 anycast
// address answers the guest.
func TestAttack6LinkLocal(t *testing.T) {
	e, _, udp := atk6World(t)
	a := atk6Session(t, e, "lla", "--allow", atk6Allowed.String())
	b := atk6Session(t, e, "llb", "--allow", atk6Allowed.String())
	dns6 := netip.MustParseAddr(e.inspect(a.name).DNS6)
	port := atk6Port()
	hostUDP := atk6Sniff(t, e.w.HostPath, unix.IPPROTO_UDP)
	hostTCP := atk6Sniff(t, e.w.HostPath, unix.IPPROTO_TCP)
	bUDP := atk6Sniff(t, b.ns, unix.IPPROTO_UDP)
	bTCP := atk6Sniff(t, b.ns, unix.IPPROTO_TCP)
	svc, err := world.ListenUDP(e.w.HostPath, netip.AddrPortFrom(netip.IPv6Unspecified(), port))
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	var ltcp net.Listener
	if err := world.DoPath(e.w.HostPath, func() (err error) {
		ltcp, err = net.Listen("tcp6", fmt.Sprintf("[::]:%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ltcp.Close()

	// Control: the service hears the world.
	cm := atkMarker(e.w, "ll-control")
	if err := world.DoPath(e.w.NetPath, func() error {
		c, err := net.Dial("udp6", netip.AddrPortFrom(e.w.Uplink6, port).String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(cm)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if ok, err := atkSawMarker(svc, cm, 3*time.Second); !ok {
		t.Fatalf("control: the host service on [::]:%d did not hear the world: %v", port, err)
	}

	type dest struct {
		what string
		addr netip.Addr
		mac  net.HardwareAddr
	}
	dests := []dest{{"the host veth's link-local", a.hostLL, a.hostMAC}}
	for _, g := range []string{"ff02::1", "ff02::2", "ff02::16", "ff02::fb"} {
		ga := netip.MustParseAddr(g)
		dests = append(dests, dest{g, ga, world.MulticastMAC6(ga)}, dest{g + " to the host veth's MAC", ga, a.hostMAC})
	}
	dests = append(dests, dest{"its gateway", a.gw6, a.hostMAC}, dest{"the v6 DNS address", dns6, a.hostMAC},
		dest{"another session's link-local", b.ll, a.hostMAC})
	// One marker for every packet, each naming its case after it: a
	// listener that finds the marker says which case got through.
	m := atkMarker(e.w, "ll")
	for _, d := range dests {
		for _, src := range []netip.Addr{a.g6, a.ll} {
			payload := fmt.Appendf(m, " from %s to %s (%s)", src, d.addr, d.what)
			to := netip.AddrPortFrom(d.addr, port)
			from := netip.AddrPortFrom(src, atk6Port())
			for _, hop := range []uint8{1, 255} {
				a.sendTo(t, d.mac,
					world.Packet6(src, d.addr, hop, nil, unix.IPPROTO_UDP, world.UDP6(from, to, payload)),
					world.Packet6(src, d.addr, hop, nil, unix.IPPROTO_TCP, world.TCPSyn6(from, to, payload)))
			}
		}
	}
	for _, l := range []struct {
		where string
		s     *world.Sniff6
	}{{"the host's stack", hostUDP}, {"the host's stack", hostTCP}, {"session " + b.name, bUDP}, {"session " + b.name, bTCP}} {
		if got, ok := l.s.Find(m, time.Second); ok {
			t.Errorf("reached %s: %q", l.where, got[max(0, len(got)-120):])
		}
	}
	if ok, _ := atkSawMarker(svc, m, 100*time.Millisecond); ok {
		t.Error("the host service on [::] received a session's datagram")
	}

	if _, err := world.Lookup(a.ns, netip.AddrPortFrom(dns6, 53), "web6.e2e.test", dns.TypeAAAA, false, 3*time.Second); err != nil {
		t.Errorf("control: DNS to the v6 anycast %s: %v", dns6, err)
	}
	if _, err := world.Lookup(a.ns, netip.AddrPortFrom(dns6, 53), "web6.e2e.test", dns.TypeAAAA, true, 3*time.Second); err != nil {
		t.Errorf("control: DNS over TCP to the v6 anycast %s: %v", dns6, err)
	}
	atk6Control(t, e, a, udp)
}

// TestAttack6Spoof: a guest sends UDP and TCP (raw, with a marker) to its
// allowed destination from another session's v6 address, that session's
// link-local address, an unassigned address of its own /126 and of the
// pool6, its gateway (the host side's ::1), the v6 DNS address and the
// host's uplink address: none reaches the world, none leaves a conntrack
// entry (refused before conntrack), and the other session receives no
// answer. Control: the same packets from its own source reach the world
// and are tracked.
func TestAttack6Spoof(t *testing.T) {
	e, tcp, udp := atk6World(t)
	a := atk6Session(t, e, "spa", "--allow", atk6Allowed.String())
	b := atk6Session(t, e, "spb", "--allow", atk6Allowed.String())
	bUDP := atk6Sniff(t, b.ns, unix.IPPROTO_UDP)
	bTCP := atk6Sniff(t, b.ns, unix.IPPROTO_TCP)
	dns6 := netip.MustParseAddr(e.inspect(a.name).DNS6)
	spoofed := []netip.Addr{b.g6, b.ll, a.ll, a.g6.Next(), netip.MustParseAddr("fd00:20::ff01"), a.gw6, b.gw6, dns6, e.w.Uplink6}
	send := func(src netip.Addr, m []byte) {
		to := netip.AddrPortFrom(atk6Allowed, 7)
		a.send(t,
			world.Packet6(src, atk6Allowed, 64, nil, unix.IPPROTO_UDP, world.UDP6(netip.AddrPortFrom(src, atk6Port()), to, m)),
			world.Packet6(src, atk6Allowed, 64, nil, unix.IPPROTO_TCP, world.TCPSyn6(netip.AddrPortFrom(src, atk6Port()), to, m)))
	}
	// One marker for every spoofed packet, each naming its source after it.
	sm := atkMarker(e.w, "spoof")
	for _, src := range spoofed {
		send(src, fmt.Appendf(sm, " from %s", src))
	}
	for _, l := range []struct {
		where string
		s     *world.Sniff6
	}{{"the world", udp}, {"the world", tcp}, {"session " + b.name, bUDP}, {"session " + b.name, bTCP}} {
		if got, ok := l.s.Find(sm, time.Second); ok {
			t.Errorf("a spoofed packet reached %s: %q", l.where, got[max(0, len(got)-80):])
		}
	}
	for _, src := range spoofed {
		if n := e2eConntrack6From(t, e.w, src); n != 0 {
			t.Errorf("spoofed source %s left %d conntrack entries", src, n)
		}
	}
	m := atkMarker(e.w, "own")
	send(a.g6, m)
	if !udp.Saw(m, 3*time.Second) || !tcp.Saw(m, 3*time.Second) {
		t.Errorf("control: %s's own source %s did not reach the world over UDP and TCP", a.name, a.g6)
	}
	if n := e2eConntrack6From(t, e.w, a.g6); n == 0 {
		t.Errorf("control: no conntrack entry from %s's own source %s", a.name, a.g6)
	}
}

// TestAttack6ICMPErrors: a guest sends ICMPv6 packet-too-big and
// destination-unreachable errors quoting another session's flow (to the
// server of that flow, and to the other session), and a flow of the host
// (to its gateway and to the host's address): none is delivered, and both
// flows keep echoing (a port unreachable would have ended them). Control: a genuine packet-too-big from the world about the
// guest's own flow is delivered to the guest.
func TestAttack6ICMPErrors(t *testing.T) {
	e, _, _ := atk6World(t)
	a := atk6Session(t, e, "ica", "--allow", atk6Allowed.String())
	b := atk6Session(t, e, "icb", "--allow", atk6Allowed.String())
	server := netip.AddrPortFrom(atk6Allowed, 7)
	var bc net.Conn
	if err := world.DoPath(b.ns, func() (err error) {
		bc, err = net.Dial("udp6", server.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	if err := atkEcho(bc, 3*time.Second); err != nil {
		t.Fatalf("control before: %s's flow to %s: %v", b.name, server, err)
	}
	bSrc := bc.LocalAddr().(*net.UDPAddr).AddrPort()
	bSrc = netip.AddrPortFrom(b.g6, bSrc.Port())
	bMasq := atk6MasqPort(t, e, bSrc, server)
	// A flow of the host's own (the simulated host to the same server).
	var hc net.Conn
	if err := world.DoPath(e.w.HostPath, func() (err error) {
		hc, err = net.Dial("udp6", server.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	if err := atkEcho(hc, 3*time.Second); err != nil {
		t.Fatalf("control before: the host's flow to %s: %v", server, err)
	}
	hostSrc := hc.LocalAddr().(*net.UDPAddr).AddrPort()
	worldICMP := atk6Sniff(t, e.w.NetPath, unix.IPPROTO_ICMPV6)
	bICMP := atk6Sniff(t, b.ns, unix.IPPROTO_ICMPV6)
	hostICMP := atk6Sniff(t, e.w.HostPath, unix.IPPROTO_ICMPV6)

	quote := func(from, to netip.AddrPort, m []byte) []byte {
		return world.Packet6(from.Addr(), to.Addr(), 63, nil, unix.IPPROTO_UDP, world.UDP6(from, to, m))
	}
	errs := func(dst netip.Addr, quoted []byte) [][]byte {
		ptb := append([]byte{0, 0, 0x05, 0x00}, quoted...) // MTU 1280
		unreach := append(make([]byte, 4), quoted...)
		return [][]byte{
			world.Packet6(a.g6, dst, 64, nil, unix.IPPROTO_ICMPV6, world.ICMP6(a.g6, dst, 2, 0, ptb)),
			world.Packet6(a.g6, dst, 64, nil, unix.IPPROTO_ICMPV6, world.ICMP6(a.g6, dst, 1, 4, unreach)),
			world.Packet6(a.g6, dst, 64, nil, unix.IPPROTO_ICMPV6, world.ICMP6(a.g6, dst, 1, 1, unreach)),
		}
	}
	for _, c := range []struct {
		what  string
		dst   netip.Addr
		quote func(m []byte) []byte
		sniff *world.Sniff6
	}{
		{"to the server, quoting its reply on " + b.name + "'s flow", atk6Allowed, func(m []byte) []byte {
			return quote(server, netip.AddrPortFrom(e.w.Uplink6, bMasq), m)
		}, worldICMP},
		{"to " + b.name + ", quoting its own flow", b.g6, func(m []byte) []byte { return quote(bSrc, server, m) }, bICMP},
		{"to its gateway, quoting the host's flow", a.gw6, func(m []byte) []byte { return quote(hostSrc, server, m) }, hostICMP},
		{"to the host's uplink address, quoting the host's flow", hostSrc.Addr(), func(m []byte) []byte { return quote(hostSrc, server, m) }, hostICMP},
	} {
		m := atkMarker(e.w, "icmp6")
		a.send(t, errs(c.dst, c.quote(m))...)
		if c.sniff.Saw(m, time.Second) {
			t.Errorf("an ICMPv6 error %s was delivered", c.what)
		}
	}
	if err := atkEcho(bc, 3*time.Second); err != nil {
		t.Errorf("control after: %s's flow to %s: %v", b.name, server, err)
	}
	if err := atkEcho(hc, 3*time.Second); err != nil {
		t.Errorf("control after: the host's flow to %s: %v", server, err)
	}

	// Control: a genuine packet-too-big from the path about a's own flow.
	var ac net.Conn
	if err := world.DoPath(a.ns, func() (err error) {
		ac, err = net.Dial("udp6", server.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	if err := atkEcho(ac, 3*time.Second); err != nil {
		t.Fatalf("control: %s's flow to %s: %v", a.name, server, err)
	}
	aSrc := netip.AddrPortFrom(a.g6, ac.LocalAddr().(*net.UDPAddr).AddrPort().Port())
	aMasq := atk6MasqPort(t, e, aSrc, server)
	aICMP := atk6Sniff(t, a.ns, unix.IPPROTO_ICMPV6)
	m := atkMarker(e.w, "ptb")
	router := netip.MustParseAddr("2001:2::1")
	q := quote(netip.AddrPortFrom(e.w.Uplink6, aMasq), server, m)
	ptb := world.Packet6(router, e.w.Uplink6, 64, nil, unix.IPPROTO_ICMPV6,
		world.ICMP6(router, e.w.Uplink6, 2, 0, append([]byte{0, 0, 0x05, 0x00}, q...)))
	if err := world.SendRaw6(e.w.NetPath, ptb); err != nil {
		t.Fatal(err)
	}
	if !aICMP.Saw(m, 3*time.Second) {
		t.Errorf("control: a packet-too-big about %s's own flow was not delivered to it", a.name)
	}
}

// atk6Conntrack dumps the simulated host's v6 conntrack table (a dump
// the kernel interrupts is tried again, up to 5 times).
func atk6Conntrack(t *testing.T, e *e2eEnv) []*netlink.ConntrackFlow {
	t.Helper()
	h, err := netlink.NewHandleAt(e.w.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var flows []*netlink.ConntrackFlow
	for i := 0; i < 5; i++ {
		if flows, err = h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET6); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("conntrack v6 dump: %v", err)
	}
	return flows
}

// atk6MasqPort is the port the host's NAT66 gave the UDP flow src -> dst.
func atk6MasqPort(t *testing.T, e *e2eEnv, src, dst netip.AddrPort) uint16 {
	t.Helper()
	flows := atk6Conntrack(t, e)
	for _, f := range flows {
		s, _ := netip.AddrFromSlice(f.Forward.SrcIP.To16())
		d, _ := netip.AddrFromSlice(f.Forward.DstIP.To16())
		if f.Forward.Protocol == unix.IPPROTO_UDP && s == src.Addr() && f.Forward.SrcPort == src.Port() && d == dst.Addr() && f.Forward.DstPort == dst.Port() {
			return f.Reverse.DstPort
		}
	}
	t.Fatalf("no v6 conntrack entry for udp %s -> %s", src, dst)
	return 0
}

// TestAttack6MappedNAT64: a public session denied 198.18.1.11 sends raw
// TCP and UDP to it as a v4-mapped address (::ffff:198.18.1.11) and
// through the NAT64 well-known prefix (64:ff9b::c612:10b, which the world
// routes to a server of its own, so only the table stands in the way):
// nothing arrives and no conntrack entry is made. Controls: the simulated
// host reaches the NAT64 server; the session reaches its allowed v6
// destination and 198.18.1.10 over v4, and is refused 198.18.1.11 over v4.
func TestAttack6MappedNAT64(t *testing.T) {
	e, tcp, udp := atk6World(t)
	nat64 := netip.MustParseAddr("64:ff9b::c612:10b")
	mapped := netip.MustParseAddr("::ffff:198.18.1.11")
	ih, err := netlink.NewHandleAt(e.w.Net)
	if err != nil {
		t.Fatal(err)
	}
	defer ih.Close()
	lo, err := ih.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := ih.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: nat64.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	cm := atkMarker(e.w, "nat64-control")
	reached := false
	for i := 0; i < 10 && !reached; i++ { // the first datagram may wait on neighbour discovery
		if err := world.DoPath(e.w.HostPath, func() error {
			c, err := net.Dial("udp6", netip.AddrPortFrom(nat64, 9).String())
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write(cm)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		reached = udp.Saw(cm, 300*time.Millisecond)
	}
	if !reached {
		t.Fatalf("control: the simulated host does not reach %s", nat64)
	}

	p := atk6Session(t, e, "m64", "--egress", "public", "--deny", "198.18.1.11")
	if err := world.TCPEcho(p.ns, netip.MustParseAddrPort("198.18.1.10:7"), 3*time.Second); err != nil {
		t.Errorf("control: public session to 198.18.1.10 over v4: %v", err)
	}
	if err := world.TCPEcho(p.ns, netip.MustParseAddrPort("198.18.1.11:7"), time.Second); err == nil {
		t.Error("control: the denied 198.18.1.11 reached over v4")
	}
	dsts := []netip.Addr{mapped, nat64, netip.MustParseAddr("64:ff9b:1::c612:10b")}
	// Refused by the table: the session's --on-deny reject answers each
	// from drop_policy6 with ICMPv6 administratively prohibited (code 1),
	// where a routing failure would say no route (code 0) or nothing.
	pICMP := atk6Sniff(t, p.ns, unix.IPPROTO_ICMPV6)
	for _, dst := range dsts {
		m := atkMarker(e.w, "m64-reject")
		to := netip.AddrPortFrom(dst, 7)
		p.send(t, world.Packet6(p.g6, dst, 64, nil, unix.IPPROTO_UDP, world.UDP6(netip.AddrPortFrom(p.g6, atk6Port()), to, m)))
		if got, ok := pICMP.Find(m, 2*time.Second); !ok || got[0] != 1 || got[1] != 1 {
			t.Errorf("%s: answer %x, want ICMPv6 destination unreachable, administratively prohibited (the table's reject)", dst, got[:min(len(got), 2)])
		}
	}
	for _, dst := range dsts {
		m := atkMarker(e.w, "m64")
		to := netip.AddrPortFrom(dst, 7)
		p.send(t,
			world.Packet6(p.g6, dst, 64, nil, unix.IPPROTO_UDP, world.UDP6(netip.AddrPortFrom(p.g6, atk6Port()), to, m)),
			world.Packet6(p.g6, dst, 64, nil, unix.IPPROTO_TCP, world.TCPSyn6(netip.AddrPortFrom(p.g6, atk6Port()), to, m)))
		if udp.Saw(m, time.Second) || tcp.Saw(m, 100*time.Millisecond) {
			t.Errorf("%s reached the world from a session denied 198.18.1.11", dst)
		}
		if n := atk6ConntrackTo(t, e, p.g6, dst); n != 0 {
			t.Errorf("%s: %d conntrack entries, want none (refused at the table)", dst, n)
		}
		// Through the guest's own stack too (a socket, as a program would).
		if err := world.TCPEcho(p.ns, to, time.Second); err == nil {
			t.Errorf("a socket in the session reached %s", to)
		}
	}
	atk6Control(t, e, p, udp)
}

// atk6ConntrackTo counts the host's v6 conntrack entries from src to dst.
func atk6ConntrackTo(t *testing.T, e *e2eEnv, src, dst netip.Addr) int {
	t.Helper()
	flows := atk6Conntrack(t, e)
	n := 0
	for _, f := range flows {
		s, _ := netip.AddrFromSlice(f.Forward.SrcIP.To16())
		if d, ok := netip.AddrFromSlice(f.Forward.DstIP.To16()); ok && d == dst && s == src {
			n++
		}
	}
	return n
}
