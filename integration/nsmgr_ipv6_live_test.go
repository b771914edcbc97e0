package integration

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// TestNsmgrDualStackSession: with Pool6 a session (from the prepared pool
// and made fresh) gets its slot's /126: ::2 on eth0, ::1 on the host side,
// the IPv6 default route via ::1, IPv6 on but closed (no RA, no autoconf,
// no redirects, no DAD) on both ends, eth0's link-local pinned to
// nsmgr.GuestLinkLocal6 with none generated (the host side keeps its
// kernel's, the control), and a resolv.conf naming both DNS
// anycast addresses, the v6 one on the DNS interface. The guest reaches a
// listener on its host side over v6 (the link works). The control, IPv6
// disabled everywhere without Pool6, is TestNsmgrIPv6SysctlsHitTheRightNetns.
func TestNsmgrDualStackSession(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	pool6 := netip.MustParsePrefix("fd00:20::/112")
	etc := t.TempDir()
	m, err := nsmgr.New(nsmgr.Config{
		Prefix: prefix, Pool: netip.MustParsePrefix("10.20.0.0/16"), Pool6: pool6,
		HostNS: w.Host, EtcNetnsDir: etc, Prepared: 1,
	})
	if err != nil {
		t.Fatalf("nsmgr.New: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	m.StartPrepared()
	waitPrepared(t, m, 1)
	if _, err := m.EnsureDNSInterface(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.RemoveDNSInterface() })
	dns6 := m.DNS6Addr()
	if !pool6.Contains(dns6) {
		t.Fatalf("dns6 %s outside %s", dns6, pool6)
	}
	hh, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	if !linkHasAddr(t, hh, nsmgr.DNSIfaceName(prefix), dns6) {
		t.Errorf("dns interface lacks %s", dns6)
	}

	for i, name := range []string{"d6a", "d6b"} { // the first claims the prepared netns
		s := mustCreate(t, w, m, name, true)
		sub, gw, guest := nsmgr.Slot6Addrs(pool6, s.Slot)
		if s.Subnet6 != sub || s.Gateway6 != gw || s.Guest6 != guest {
			t.Fatalf("%s: session v6 %s %s %s, want %s %s %s", name, s.Subnet6, s.Gateway6, s.Guest6, sub, gw, guest)
		}
		ns, h, release := sessionHandle(t, s.NetnsPath)
		if !linkHasAddr(t, h, nsmgr.GuestIface, guest) {
			t.Errorf("%s: eth0 lacks %s", name, guest)
		}
		if !linkHasAddr(t, hh, s.HostIface, gw) {
			t.Errorf("%s: %s lacks %s", name, s.HostIface, gw)
		}
		checkPinnedLinkLocal(t, name, ns, h, nsmgr.GuestIface, hh, s.HostIface)
		routes, err := h.RouteList(nil, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		var def bool
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.String() == "::/0") && net.IP(r.Gw).Equal(gw.AsSlice()) {
				def = true
			}
		}
		if !def {
			t.Errorf("%s: no v6 default route via %s in %v", name, gw, routes)
		}
		for _, key := range []string{"accept_ra", "autoconf", "accept_redirects", "accept_dad", "disable_ipv6"} {
			if v := readSysctl(t, ns, "/proc/sys/net/ipv6/conf/eth0/"+key); v != "0" {
				t.Errorf("%s: guest eth0 %s = %s, want 0", name, key, v)
			}
			if key == "disable_ipv6" {
				continue
			}
			if v := readSysctl(t, w.Host, "/proc/sys/net/ipv6/conf/"+s.HostIface+"/"+key); v != "0" {
				t.Errorf("%s: host side %s %s = %s, want 0", name, s.HostIface, key, v)
			}
		}
		rc, err := os.ReadFile(m.ResolvConfPath(name))
		if err != nil {
			t.Fatal(err)
		}
		if want := "nameserver " + m.DNSAddr().String() + "\nnameserver " + dns6.String() + "\n"; string(rc) != want {
			t.Errorf("%s: resolv.conf %q, want %q", name, rc, want)
		}
		// The link works: a listener on the host side, reached from the guest.
		l, err := world.ListenTCP(w.HostPath, netip.AddrPortFrom(gw, uint16(7100+i)))
		if err != nil {
			t.Fatal(err)
		}
		go world.ServeTCPEcho(l)
		if err := world.TCPEcho(s.NetnsPath, netip.AddrPortFrom(gw, uint16(7100+i)), 3*time.Second); err != nil {
			t.Errorf("%s: guest to its host side over v6: %v", name, err)
		}
		l.Close()
		release()
	}
}

// checkPinnedLinkLocal checks that a dual-stack session's guest interface
// (iface, h in its netns ns) generates no link-local address
// (addr_gen_mode 1) and holds one, nsmgr.GuestLinkLocal6, while its host
// side (hostIface, hh in the host netns) holds one its kernel generated
// (the control: the kernel does generate them where it is not turned off).
func checkPinnedLinkLocal(t *testing.T, name string, ns netns.NsHandle, h *netlink.Handle, iface string, hh *netlink.Handle, hostIface string) {
	t.Helper()
	if v := readSysctl(t, ns, "/proc/sys/net/ipv6/conf/"+iface+"/addr_gen_mode"); v != "1" {
		t.Errorf("%s: %s addr_gen_mode = %s, want 1 (none)", name, iface, v)
	}
	if got := linkLocalsOf(t, h, iface); !slices.Equal(got, []netip.Addr{nsmgr.GuestLinkLocal6}) {
		t.Errorf("%s: %s's link-local addresses are %v, want only %s", name, iface, got, nsmgr.GuestLinkLocal6)
	}
	if got := linkLocalsOf(t, hh, hostIface); len(got) != 1 || got[0] == nsmgr.GuestLinkLocal6 {
		t.Errorf("control: %s: the host side %s's link-local addresses are %v, want one its kernel generated", name, hostIface, got)
	}
}

// linkLocalsOf are the link-local addresses of the link name (h in its netns).
func linkLocalsOf(t *testing.T, h *netlink.Handle, name string) []netip.Addr {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("find %s: %v", name, err)
	}
	addrs, err := h.AddrList(l, unix.AF_INET6)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, ad := range addrs {
		if a, ok := netip.AddrFromSlice(ad.IP); ok && a.IsLinkLocalUnicast() {
			out = append(out, a)
		}
	}
	return out
}

// linkHasAddr reports whether the link name holds a (h in its netns).
func linkHasAddr(t *testing.T, h *netlink.Handle, name string, a netip.Addr) bool {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("find %s: %v", name, err)
	}
	addrs, err := h.AddrList(l, unix.AF_INET6)
	if err != nil {
		t.Fatal(err)
	}
	var have []string
	for _, ad := range addrs {
		if ad.IP.Equal(a.AsSlice()) {
			return true
		}
		have = append(have, ad.IPNet.String())
	}
	t.Logf("%s holds %s", name, strings.Join(have, " "))
	return false
}

// TestNsmgrAttachDualStack: with Pool6 an attached session gets its slot's
// /126 in the runtime's netns as an owned one does (::2 on the guest
// interface, ::1 on the host side, the v6 default route, the pinned
// link-local), IPv6 closed down on that interface alone (the runtime's "default" keeps its value); and a
// fault at every step of Attach unwinds.
func TestNsmgrAttachDualStack(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	pool6 := netip.MustParsePrefix("fd00:20::/112")
	path := runtimeNetns(t, w, "a6")
	newM := func(fault func(string) error) *nsmgr.Manager {
		m, err := nsmgr.New(nsmgr.Config{Prefix: prefix, Pool: netip.MustParsePrefix("10.20.0.0/16"), Pool6: pool6,
			HostNS: w.Host, EtcNetnsDir: t.TempDir(), Fault: fault})
		if err != nil {
			t.Fatalf("nsmgr.New: %v", err)
		}
		return m
	}
	for _, step := range nsmgr.AttachSteps {
		m := newM(func(s string) error {
			if s == step {
				return errInjected
			}
			return nil
		})
		if _, err := m.Attach("f", nsmgr.Attachment{NetnsPath: path, IfName: "eth0"}); !errors.Is(err, errInjected) {
			t.Fatalf("fault at %s: Attach = %v", step, err)
		}
		_, h, release := sessionHandle(t, path)
		if names := linkNames(t, h); !slices.Equal(names, []string{"lo"}) {
			t.Errorf("fault at %s: links left in the runtime's netns: %v", step, names)
		}
		release()
		if names := linkNames(t, hostHandle(t, w)); slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, prefix) }) {
			t.Errorf("fault at %s: host links of the prefix left: %v", step, names)
		}
		m.Close()
	}

	m := newM(nil)
	t.Cleanup(func() { m.Close() })
	ns, h, release := sessionHandle(t, path)
	defer release()
	defaultRA := readSysctl(t, ns, "/proc/sys/net/ipv6/conf/default/accept_ra")
	s, err := m.Attach("a6", nsmgr.Attachment{NetnsPath: path, IfName: "net1"})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	defer cleanupSession(t, w, prefix, "a6", s.Slot)
	sub, gw, guest := nsmgr.Slot6Addrs(pool6, s.Slot)
	if !s.Attached || s.Subnet6 != sub || s.Gateway6 != gw || s.Guest6 != guest {
		t.Fatalf("attached session v6 %s %s %s (attached %v), want %s %s %s", s.Subnet6, s.Gateway6, s.Guest6, s.Attached, sub, gw, guest)
	}
	if !linkHasAddr(t, h, "net1", guest) {
		t.Errorf("net1 lacks %s", guest)
	}
	if !linkHasAddr(t, hostHandle(t, w), s.HostIface, gw) {
		t.Errorf("%s lacks %s", s.HostIface, gw)
	}
	checkPinnedLinkLocal(t, "a6", ns, h, "net1", hostHandle(t, w), s.HostIface)
	routes, err := h.RouteList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
		return (r.Dst == nil || r.Dst.String() == "::/0") && net.IP(r.Gw).Equal(gw.AsSlice())
	}) {
		t.Errorf("no v6 default route via %s in the runtime's netns: %v", gw, routes)
	}
	for _, key := range []string{"accept_ra", "autoconf", "accept_redirects", "accept_dad", "disable_ipv6"} {
		if v := readSysctl(t, ns, "/proc/sys/net/ipv6/conf/net1/"+key); v != "0" {
			t.Errorf("net1 %s = %s, want 0", key, v)
		}
	}
	if v := readSysctl(t, ns, "/proc/sys/net/ipv6/conf/default/accept_ra"); v != defaultRA {
		t.Errorf("the runtime's default accept_ra went from %s to %s: Attach changes its own interface only", defaultRA, v)
	}
	if defaultRA == "0" {
		t.Errorf("control: the runtime's default accept_ra is already 0, so the test cannot tell")
	}
}
