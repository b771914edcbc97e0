package nsmgr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/bits"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Dual-stack sessions (Config.Pool6). Each session slot of the IPv4 pool
// has a twin /126 in the IPv6 pool at the same index: the host side holds
// its ::1, the guest its ::2, mirroring the /30 (a /126 rather than a /127
// so that the layout, the slot arithmetic and the reverse lookup from an
// address to its slot are the v4 ones; the two spare addresses are
// never assigned). The DNS anycast address is ::2 of the /126 after the
// last session slot, as the v4 one is the last /30's. The IPv4 IPAM stays
// the only allocator: a slot is dual-stack or nothing.

// Pool6SlotBits is the size of a session's IPv6 subnet: a /126.
const Pool6SlotBits = 126

// ValidatePool6 checks an IPv6 session pool against the IPv4 pool whose
// slots it mirrors: a masked IPv6 prefix (not v4-mapped, not link-local,
// loopback or multicast) wide enough to hold one /126 per slot of pool plus
// the DNS one.
func ValidatePool6(pool6, pool netip.Prefix) error {
	const want = "want a masked IPv6 prefix such as fd00:20::/112"
	a := pool6.Addr()
	switch {
	case !pool6.IsValid():
		return fmt.Errorf("invalid pool6: not set; %s", want)
	case !a.Is6() || a.Is4In6():
		return fmt.Errorf("invalid pool6 %s: not IPv6; %s", pool6, want)
	case pool6.Masked() != pool6:
		return fmt.Errorf("invalid pool6 %s: host bits set (did you mean %s?); %s", pool6, pool6.Masked(), want)
	case a.IsLinkLocalUnicast() || a.IsLoopback() || a.IsMulticast() || a.IsUnspecified() || pool6.Bits() < 8:
		return fmt.Errorf("invalid pool6 %s: not a unicast range a host can route; %s", pool6, want)
	}
	if err := ValidatePool(pool); err != nil {
		return err
	}
	if max := pool6MaxBits(pool); pool6.Bits() > max {
		return fmt.Errorf("invalid pool6 %s: too small for the /126s of the %d slots of pool %s; want /%d or wider", pool6, slotsOf(pool), pool, max)
	}
	return nil
}

// slotsOf is the number of session slots of an IPv4 pool (see NewIPAM).
func slotsOf(pool netip.Prefix) int { return 1<<(32-pool.Bits())/4 - 1 }

// pool6MaxBits is the longest IPv6 prefix holding a /126 for every slot of
// pool and one for the DNS address.
func pool6MaxBits(pool netip.Prefix) int {
	n := uint(slotsOf(pool) + 1)
	return Pool6SlotBits - bits.Len(n-1)
}

// addr6 returns pool6's address at offset off (off < 2^64, and pool6 at
// least a /64 narrower than that, as ValidatePool6 guarantees).
func addr6(pool6 netip.Prefix, off uint64) netip.Addr {
	b := pool6.Addr().As16()
	lo := binary.BigEndian.Uint64(b[8:]) + off
	binary.BigEndian.PutUint64(b[8:], lo)
	return netip.AddrFrom16(b)
}

// Slot6Addrs returns a slot's /126 in pool6, the host side (::1) and the
// guest (::2).
func Slot6Addrs(pool6 netip.Prefix, slot int) (subnet netip.Prefix, gw, guest netip.Addr) {
	base := uint64(slot) * 4
	return netip.PrefixFrom(addr6(pool6, base), Pool6SlotBits), addr6(pool6, base+1), addr6(pool6, base+2)
}

// DNS6Addr returns the IPv6 DNS anycast address of pool6 for the IPv4 pool
// pool: ::2 of the /126 after the last slot.
func DNS6Addr(pool6, pool netip.Prefix) netip.Addr {
	return addr6(pool6, uint64(slotsOf(pool))*4+2)
}

// DNS6Addr returns the IPv6 DNS anycast address; invalid without Pool6.
func (m *Manager) DNS6Addr() netip.Addr {
	if !m.cfg.Pool6.IsValid() {
		return netip.Addr{}
	}
	return DNS6Addr(m.cfg.Pool6, m.cfg.Pool)
}

// ipv6Closed are the per-interface settings of every interface of a
// dual-stack session, host and guest side: no router advertisement
// accepted, no address autoconfiguration, no redirects, no DAD (the
// addresses are ours; the link has two ends, both made here), no router
// solicitations sent.
var ipv6Closed = []struct{ key, value string }{
	{"accept_ra", "0"},
	{"autoconf", "0"},
	{"accept_redirects", "0"},
	{"accept_dad", "0"},
	{"dad_transmits", "0"},
	{"router_solicitations", "0"},
}

// configureNewNetnsIPv6 is disableNewNetnsIPv6 on an IPv4-only daemon; on
// a dual-stack one it leaves IPv6 on and closes it down to the addresses
// Create assigns (ipv6Closed on "all" and "default", which eth0 inherits).
func (m *Manager) configureNewNetnsIPv6() error {
	if !m.cfg.Pool6.IsValid() {
		return disableNewNetnsIPv6()
	}
	root, sys := privateProc(), "sys/net/ipv6/conf/"
	if root >= 0 {
		defer func() { go unix.Close(root) }()
	} else {
		root, sys = unix.AT_FDCWD, ipv6ConfDir+"/"
	}
	for _, iface := range []string{"all", "default"} {
		for _, s := range ipv6Closed {
			if err := writeSysctlAt(root, sys+iface+"/"+s.key, s.value); err != nil {
				return fmt.Errorf("dual-stack netns: %w", err)
			}
		}
	}
	return nil
}

// configureHostIfaceIPv6 is disableHostIfaceIPv6 on an IPv4-only daemon;
// on a dual-stack one it applies ipv6Closed to the host side.
func (m *Manager) configureHostIfaceIPv6(iface string) error {
	if !m.cfg.Pool6.IsValid() {
		return disableHostIfaceIPv6(m.hostConf, iface)
	}
	if m.hostConf == nil {
		return errors.New("dual-stack: the host has no IPv6")
	}
	for _, s := range ipv6Closed {
		if err := writeSysctlAt(int(m.hostConf.Fd()), iface+"/"+s.key, s.value); err != nil {
			return err
		}
	}
	return nil
}

// addAddr6 adds a /126 address with DAD off.
func addAddr6(h *netlink.Handle, link netlink.Link, a netip.Addr) error {
	ipnet := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(Pool6SlotBits, 128)}
	if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipnet, Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("add address %s/%d to %s: %w", a, Pool6SlotBits, link.Attrs().Name, err)
	}
	return nil
}

// GuestLinkLocal6 is the link-local address of a dual-stack session's
// guest interface, the same in every session (a link-local address is
// scoped to its link, and each session's link is its own veth): the
// kernel generates none there (IN6_ADDR_GEN_MODE_NONE), so the only
// link-local source a well-behaved guest has is this one, and the table
// accepts neighbour discovery before anti-spoofing from it alone
// (netpolicy/nft: raw_session6). The host side keeps the link-local
// address its kernel generates.
var GuestLinkLocal6 = netip.MustParseAddr("fe80::2")

// pinLinkLocal6 turns off link-local generation on the guest interface
// (before it goes up, which is when the kernel would generate one) and
// puts GuestLinkLocal6/64 there with DAD off.
func pinLinkLocal6(h *netlink.Handle, link netlink.Link) error {
	name := link.Attrs().Name
	if err := h.LinkSetIP6AddrGenMode(link, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
		return fmt.Errorf("%s: turn off link-local address generation: %w", name, err)
	}
	ipnet := &net.IPNet{IP: GuestLinkLocal6.AsSlice(), Mask: net.CIDRMask(64, 128)}
	if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipnet, Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("add address %s/64 to %s: %w", GuestLinkLocal6, name, err)
	}
	return nil
}

// addDefaultRoute6 adds the guest's IPv6 default route via the host side.
func (c *creation) addDefaultRoute6() error {
	_, dst, _ := net.ParseCIDR("::/0")
	route := &netlink.Route{LinkIndex: c.eth0.Attrs().Index, Dst: dst, Gw: c.gw6.AsSlice()}
	if err := c.guest.RouteAdd(route); err != nil {
		return fmt.Errorf("add default route via %s in netns %s: %w", c.gw6, c.netnsName(), err)
	}
	return nil
}

// ensureDNS6 puts the IPv6 DNS anycast address on the DNS interface, IPv6
// enabled there with ipv6Closed (dual-stack daemons only).
func (m *Manager) ensureDNS6(link netlink.Link) error {
	name := link.Attrs().Name
	if err := Do(m.cfg.HostNS, func() error {
		for _, s := range append([]struct{ key, value string }{{"disable_ipv6", "0"}}, ipv6Closed...) {
			if err := writeSysctl(ipv6ConfDir+"/"+name+"/"+s.key, s.value); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("dns interface %s: %w", name, err)
	}
	a := m.DNS6Addr()
	ipnet := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(128, 128)}
	if err := m.host.AddrReplace(link, &netlink.Addr{IPNet: ipnet, Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("dns interface %s: add address %s/128: %w", name, a, err)
	}
	return nil
}

// EnableForwarding6 sets net.ipv6.conf.all.forwarding=1 in the netns ns
// (a dual-stack daemon's netns: sessions are routed through it).
func EnableForwarding6(ns netns.NsHandle) error {
	err := Do(ns, func() error { return writeSysctl(ipv6ConfDir+"/all/forwarding", "1") })
	if errors.Is(err, fs.ErrNotExist) {
		return errors.New("enable ipv6 forwarding: the host has no IPv6")
	}
	if err != nil {
		return fmt.Errorf("enable ipv6 forwarding: %w", err)
	}
	return nil
}
