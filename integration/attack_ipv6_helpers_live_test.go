package integration

// Helpers of the IPv6 attack tests (attack_ipv6_live_test.go): a
// dual-stack daemon in a world with IPv6, network-only sessions whose
// netns the test enters as root (NET_RAW and NET_ADMIN there, as a guest
// with them has), Ethernet frames sent from the session's eth0 to the host
// side (past the guest's own stack), and raw listeners where a packet would
// arrive if it got through. Crafting lives in integration/world/attack6.go.

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/world"
)

// atk6Sess is a dual-stack session as its guest and the host see it.
type atk6Sess struct {
	name, ns, hostVeth string
	g6, gw6            netip.Addr       // the guest's ::2 and the host side's ::1
	ll, hostLL         netip.Addr       // eth0's and the host veth's link-local addresses
	mac, hostMAC       net.HardwareAddr // eth0's and the host veth's
}

// atk6Session creates a network-only dual-stack session and reads its
// addresses from both ends of its veth.
func atk6Session(t *testing.T, e *e2eEnv, name string, args ...string) atk6Sess {
	t.Helper()
	info := e.createNetOnly(name, append([]string{"--name-check", "off"}, args...)...)
	s := atk6Sess{name: name, ns: e.nsPath(name), hostVeth: info.HostVeth}
	var err error
	if s.g6, err = netip.ParseAddr(info.Guest6IP); err != nil {
		t.Fatalf("%s: guest6_ip %q: %v", name, info.Guest6IP, err)
	}
	s.gw6 = s.g6.Prev()
	s.mac, s.ll = atk6Link(t, mustNetns(t, s.ns), "eth0")
	s.hostMAC, s.hostLL = atk6Link(t, e.w.Host, s.hostVeth)
	if !s.ll.IsValid() || !s.hostLL.IsValid() {
		t.Fatalf("%s: link-local addresses %v (eth0) and %v (%s), want both", name, s.ll, s.hostLL, s.hostVeth)
	}
	return s
}

// atk6Link returns a link's MAC and its link-local address (invalid when
// it has none).
func atk6Link(t *testing.T, ns netns.NsHandle, name string) (net.HardwareAddr, netip.Addr) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatalf("addresses of %s: %v", name, err)
	}
	var ll netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() {
			ll = ip
		}
	}
	return l.Attrs().HardwareAddr, ll
}

// send sends whole IPv6 packets from the session's eth0 to the host veth.
func (s atk6Sess) send(t *testing.T, pkts ...[]byte) { s.sendTo(t, s.hostMAC, pkts...) }

// sendTo sends whole IPv6 packets from the session's eth0 to mac.
func (s atk6Sess) sendTo(t *testing.T, mac net.HardwareAddr, pkts ...[]byte) {
	t.Helper()
	if err := world.SendFrames6(s.ns, "eth0", mac, pkts...); err != nil {
		t.Fatalf("%s: %v", s.name, err)
	}
}

// atk6Sniff opens a raw listener of proto in the namespace at nsPath,
// closed when the test ends.
func atk6Sniff(t *testing.T, nsPath string, proto int) *world.Sniff6 {
	t.Helper()
	s, err := world.OpenSniff6(nsPath, proto)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// atk6Port is a random high port, a fresh flow per call.
func atk6Port() uint16 { return uint16(40000 + rand.IntN(20000)) }

// atk6Web is the world's v6 echo servers: Allowed is the attacker's
// allowed destination in every test, Denied is listed by no attacker.
var (
	atk6Allowed = netip.MustParseAddr("2001:2:0:1::11")
	atk6Denied  = netip.MustParseAddr("2001:2:0:1::10")
)

// atk6World starts the dual-stack daemon and opens the world-side
// listeners (TCP and UDP delivered to the world's v6 servers).
func atk6World(t *testing.T) (e *e2eEnv, tcp, udp *world.Sniff6) {
	t.Helper()
	e, _ = newDualStackE2E(t)
	return e, atk6Sniff(t, e.w.NetPath, unix.IPPROTO_TCP), atk6Sniff(t, e.w.NetPath, unix.IPPROTO_UDP)
}

// atk6Control sends a UDP datagram carrying a fresh marker from the
// session's own v6 address to its allowed destination, by the same frames
// the attacks use, and fails the test unless the world receives it: the
// injection channel works, so a refusal next to it is the table's.
func atk6Control(t *testing.T, e *e2eEnv, s atk6Sess, udp *world.Sniff6) {
	t.Helper()
	m := atkMarker(e.w, "control")
	s.send(t, world.Packet6(s.g6, atk6Allowed, 64, nil, unix.IPPROTO_UDP,
		world.UDP6(netip.AddrPortFrom(s.g6, atk6Port()), netip.AddrPortFrom(atk6Allowed, 7), m)))
	if !udp.Saw(m, 3*time.Second) {
		t.Fatalf("control: a datagram from %s's own v6 address to its allowed %s did not reach the world", s.name, atk6Allowed)
	}
}

// atk6State is what an attack on the host's IPv6 must not change: the
// host's v6 routes (every table) and addresses (with their flags), as
// sorted lines.
func atk6State(t *testing.T, ns netns.NsHandle) string {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// A settled state: an address still in duplicate address detection
	// (the world's uplink's link-local for about a second after it came
	// up) later loses its tentative flag and gains its local route, which
	// no attack caused.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		addrs, err := h.AddrList(nil, netlink.FAMILY_V6)
		if err != nil {
			t.Fatalf("v6 addresses: %v", err)
		}
		if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool {
			return a.Flags&unix.IFA_F_TENTATIVE != 0 && a.Flags&unix.IFA_F_DADFAILED == 0
		}) || time.Now().After(deadline) {
			break
		}
	}
	var lines []string
	routes, err := h.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatalf("v6 routes: %v", err)
	}
	for _, r := range routes {
		lines = append(lines, fmt.Sprintf("route table %d dst %v gw %v dev %d proto %d flags %d", r.Table, r.Dst, r.Gw, r.LinkIndex, r.Protocol, r.Flags))
	}
	addrs, err := h.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatalf("v6 addresses: %v", err)
	}
	for _, a := range addrs {
		lines = append(lines, fmt.Sprintf("addr %v dev %d flags %#x", a.IPNet, a.LinkIndex, a.Flags))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// atk6Neigh returns the host's v6 neighbour entries for ip: link index ->
// MAC.
func atk6Neigh(t *testing.T, ns netns.NsHandle, ip netip.Addr) map[int]string {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns6, err := h.NeighList(0, netlink.FAMILY_V6)
	if err != nil {
		t.Fatalf("v6 neighbours: %v", err)
	}
	out := map[int]string{}
	for _, n := range ns6 {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a == ip {
			out[n.LinkIndex] = n.HardwareAddr.String()
		}
	}
	return out
}

// atk6NeighCount is the number of v6 neighbour entries on link index in ns.
func atk6NeighCount(t *testing.T, ns netns.NsHandle, index int) int {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns6, err := h.NeighList(index, netlink.FAMILY_V6)
	if err != nil {
		t.Fatalf("v6 neighbours of link %d: %v", index, err)
	}
	return len(ns6)
}

// atk6LinkLocals are a link's link-local addresses in ns.
func atk6LinkLocals(t *testing.T, ns netns.NsHandle, name string) []netip.Addr {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatalf("addresses of %s: %v", name, err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() {
			out = append(out, ip)
		}
	}
	return out
}

// atk6LinkIndex is a link's index in ns.
func atk6LinkIndex(t *testing.T, ns netns.NsHandle, name string) int {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return l.Attrs().Index
}

// atk6SolicitedNode is the solicited-node multicast group of a.
func atk6SolicitedNode(a netip.Addr) netip.Addr {
	b := a.As16()
	return netip.AddrFrom16([16]byte{0xff, 0x02, 10: 0, 11: 1, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
}

// atk6NS is a neighbour solicitation body for target, with a source
// link-layer option when mac is set.
func atk6NS(target netip.Addr, mac net.HardwareAddr) []byte {
	t := target.As16()
	b := append(make([]byte, 4), t[:]...)
	if mac != nil {
		b = append(append(b, 1, 1), mac...)
	}
	return b
}

// atk6NA is an unsolicited override neighbour advertisement body for
// target with mac as its target link-layer address (router flag set when
// router).
func atk6NA(target netip.Addr, mac net.HardwareAddr, router bool) []byte {
	t := target.As16()
	b := make([]byte, 4)
	b[0] = 0x20 // override
	if router {
		b[0] |= 0x80
	}
	b = append(b, t[:]...)
	return append(append(b, 2, 1), mac...)
}

// atk6RA is a router advertisement body: a default router for 1800 s
// announcing prefix (on-link, autonomous) and a route to route.
func atk6RA(prefix, route netip.Prefix, mac net.HardwareAddr) []byte {
	b := []byte{64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0}
	pio := make([]byte, 32)
	pio[0], pio[1], pio[2], pio[3] = 3, 4, uint8(prefix.Bits()), 0xc0
	binary.BigEndian.PutUint32(pio[4:], 86400)
	binary.BigEndian.PutUint32(pio[8:], 14400)
	p := prefix.Addr().As16()
	copy(pio[16:], p[:])
	rio := make([]byte, 24)
	rio[0], rio[1], rio[2] = 24, 3, uint8(route.Bits())
	binary.BigEndian.PutUint32(rio[4:], 1800)
	r := route.Addr().As16()
	copy(rio[8:], r[:])
	b = append(append(b, pio...), rio...)
	return append(append(b, 1, 1), mac...)
}
