package integration

// Helpers of the attack tests (attack_*_live_test.go): live tests that
// perform, against the netpolicy firewall in a test world, the attacks an
// attacker inside a session would (raw sockets, spoofed
// sources, crafted ICMP errors, ARP, a foreign netns on the simulated host,
// a flood of flows). Each asserts the secure behaviour next to a positive
// control in the same test; crafting lives in integration/world/craft.go.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/nsmgr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// atkMarker returns a payload no other packet of the run carries.
func atkMarker(w *world.World, tag string) []byte {
	b := make([]byte, 6)
	rand.Read(b)
	return []byte("atk-" + w.ID + "-" + tag + "-" + hex.EncodeToString(b))
}

// atkDialUDP opens a UDP socket inside nsPath connected to dst; it is closed
// when the test ends.
func atkDialUDP(t *testing.T, nsPath string, dst netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := world.DoPath(nsPath, func() (err error) {
		c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
		return err
	})
	if err != nil {
		t.Fatalf("udp socket in %s to %s: %v", nsPath, dst, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// atkListenUDP opens a UDP socket inside nsPath bound to addr; it is closed
// when the test ends.
func atkListenUDP(t *testing.T, nsPath string, addr netip.AddrPort) *net.UDPConn {
	t.Helper()
	pc, err := world.ListenUDP(nsPath, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.(*net.UDPConn)
}

func atkLocalPort(c net.Conn) uint16 { return c.LocalAddr().(*net.UDPAddr).AddrPort().Port() }

// atkEcho sends a fresh message on a connected socket and waits for the
// same bytes back. The error wraps the socket's (ECONNREFUSED when an ICMP
// error killed it).
func atkEcho(c net.Conn, timeout time.Duration) error {
	msg := world.EchoMessage()
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	got := make([]byte, 64)
	for {
		n, err := c.Read(got)
		if err != nil {
			return fmt.Errorf("read echo: %w", err)
		}
		if bytes.Equal(got[:n], msg) {
			return nil
		}
	}
}

// atkSawMarker reads datagrams from c until one carries marker (true) or
// timeout passes or the socket fails (false, with the error).
func atkSawMarker(c net.PacketConn, marker []byte, timeout time.Duration) (bool, error) {
	deadline := time.Now().Add(timeout)
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, 65535)
	for {
		c.SetReadDeadline(deadline)
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return false, err
		}
		if bytes.Contains(buf[:n], marker) {
			return true, nil
		}
	}
}

// atkSendRaw sends crafted packets from inside nsPath and fails the test
// when the kernel refuses them.
func atkSendRaw(t *testing.T, nsPath string, pkts ...[]byte) {
	t.Helper()
	if err := world.SendRaw(nsPath, pkts...); err != nil {
		t.Fatalf("raw send in %s: %v", nsPath, err)
	}
}

// atkConntrack dumps the IPv4 conntrack table of the simulated host (every
// zone).
func atkConntrack(t *testing.T, w *world.World) []*netlink.ConntrackFlow {
	t.Helper()
	h, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", w.HostName, err)
	}
	defer h.Close()
	var flows []*netlink.ConntrackFlow
	for i := 0; i < 5; i++ { // an interrupted dump is retried
		flows, err = h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err == nil {
			return flows
		}
	}
	t.Fatalf("conntrack dump in %s: %v", w.HostName, err)
	return nil
}

func atkIP(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip.To4())
	return a
}

// atkMasqPort returns the port the simulated host's masquerade gave the UDP
// flow src -> dst (the reply tuple's destination port).
func atkMasqPort(t *testing.T, w *world.World, src, dst netip.AddrPort) uint16 {
	t.Helper()
	for _, f := range atkConntrack(t, w) {
		if f.Forward.Protocol == unix.IPPROTO_UDP && atkIP(f.Forward.SrcIP) == src.Addr() && f.Forward.SrcPort == src.Port() &&
			atkIP(f.Forward.DstIP) == dst.Addr() && f.Forward.DstPort == dst.Port() {
			if atkIP(f.Reverse.DstIP) != w.Uplink {
				t.Fatalf("flow %s -> %s is translated to %s, not to the uplink %s", src, dst, atkIP(f.Reverse.DstIP), w.Uplink)
			}
			return f.Reverse.DstPort
		}
	}
	t.Fatalf("no conntrack entry for udp %s -> %s in %s", src, dst, w.HostName)
	return 0
}

// atkFlowsOf returns the conntrack entries of the simulated host that name
// guest as the original source or destination or the reply destination.
func atkFlowsOf(t *testing.T, w *world.World, guest netip.Addr) []string {
	t.Helper()
	var out []string
	for _, f := range atkConntrack(t, w) {
		if atkIP(f.Forward.SrcIP) == guest || atkIP(f.Forward.DstIP) == guest || atkIP(f.Reverse.DstIP) == guest {
			out = append(out, f.String())
		}
	}
	return out
}

// atkForeign is a namespace that is not a session, linked to the simulated
// host by a veth whose host end does not carry the firewall's prefix (a
// foreign container on a host bridge, say).
type atkForeign struct {
	ns, nsPath     string
	hostIf, peerIf string
	hostAddr, addr netip.Addr
}

// atkNewForeign creates it, with a route to route via the host end, and
// removes it (link and netns, by exact name) when the test ends.
func atkNewForeign(t *testing.T, w *world.World, route netip.Prefix) *atkForeign {
	t.Helper()
	f := &atkForeign{
		ns: w.UniqueName("atkf"), hostIf: w.UniqueName("xf"), peerIf: w.UniqueName("xg"),
		hostAddr: netip.MustParseAddr("192.0.2.1"), addr: netip.MustParseAddr("192.0.2.2"),
	}
	f.nsPath = world.NetnsDir + "/" + f.ns
	fns := atkNewNamedNetns(t, f.ns)
	hh, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	fh, err := netlink.NewHandleAt(fns)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: f.hostIf}, PeerName: f.peerIf, PeerNamespace: netlink.NsFd(int(fns))}
	if err := hh.LinkAdd(veth); err != nil {
		t.Fatalf("add foreign veth %s: %v", f.hostIf, err)
	}
	t.Cleanup(func() { atkDelLink(t, w, f.hostIf) })
	mask := net.CIDRMask(30, 32)
	for _, s := range []struct {
		h    *netlink.Handle
		name string
		addr netip.Addr
	}{{hh, f.hostIf, f.hostAddr}, {fh, f.peerIf, f.addr}, {fh, "lo", netip.Addr{}}} {
		l, err := s.h.LinkByName(s.name)
		if err != nil {
			t.Fatal(err)
		}
		if s.addr.IsValid() {
			if err := s.h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: s.addr.AsSlice(), Mask: mask}}); err != nil {
				t.Fatalf("address %s on %s: %v", s.addr, s.name, err)
			}
		}
		if err := s.h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	pl, _ := fh.LinkByName(f.peerIf)
	if err := fh.RouteAdd(&netlink.Route{LinkIndex: pl.Attrs().Index, Dst: &net.IPNet{IP: route.Addr().AsSlice(), Mask: net.CIDRMask(route.Bits(), 32)}, Gw: f.hostAddr.AsSlice()}); err != nil {
		t.Fatalf("route %s in %s: %v", route, f.ns, err)
	}
	atkReady(t, f.nsPath, f.peerIf, f.addr, f.hostAddr)
	return f
}

// atkDelLink deletes the simulated host's link name (by exact name);
// "already gone" is fine.
func atkDelLink(t *testing.T, w *world.World, name string) {
	t.Helper()
	h, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Errorf("netlink handle in %s: %v", w.HostName, err)
		return
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return
	}
	if err := h.LinkDel(l); err != nil {
		t.Errorf("delete link %s: %v", name, err)
	}
}

// atkNewNamedNetns creates a named netns (the caller names it with the
// world's ID) and removes it by that name when the test ends.
func atkNewNamedNetns(t *testing.T, name string) netns.NsHandle {
	t.Helper()
	ns, err := world.NewNamedNetns(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	return ns
}

// atkLinkExists reports whether the simulated host has a link name.
func atkLinkExists(t *testing.T, w *world.World, name string) bool {
	t.Helper()
	h, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", w.HostName, err)
	}
	defer h.Close()
	_, err = h.LinkByName(name)
	return err == nil
}

func atkJoinLines(ls []string) string { return strings.Join(ls, "\n") }

// atkSession is npEnv.session followed by atkReady: a fresh veth drops what
// it is given to send until the kernel has activated it (a linkwatch event,
// late when rtnl is busy), and an attack packet lost that way would pass a
// test falsely.
func atkSession(t *testing.T, e *npEnv, name string, mode netpolicy.Mode, static []netpolicy.Target) nsmgr.Session {
	t.Helper()
	s, _ := e.session(t, name, mode, static)
	atkReady(t, s.NetnsPath, "eth0", s.Guest, s.Gateway)
	return s
}

// atkReady waits until ARP who-has gw sent on iface inside nsPath is
// answered: both ends of the link then carry packets.
func atkReady(t *testing.T, nsPath, iface string, self, gw netip.Addr) {
	t.Helper()
	deadline := time.Now().Add(2 * world.ReachTimeout)
	for {
		got, err := world.ARPProbe(nsPath, iface, self, []netip.Addr{gw}, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := got[gw]; ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("link %s in %s: no ARP reply from %s within %s", iface, nsPath, gw, 2*world.ReachTimeout)
		}
	}
}
