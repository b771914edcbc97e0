package world

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The world's IPv6 addresses, at the benchmarking prefix 2001:2::/48
// (RFC 5180, the IPv6 twin of 198.18.0.0/15): nothing leaves the world.
var (
	internetUplink6 = netip.MustParsePrefix("2001:2::1/64")
	hostUplink6     = netip.MustParsePrefix("2001:2::2/64")
	web6Addrs       = []netip.Addr{
		netip.MustParseAddr("2001:2:0:1::10"),
		netip.MustParseAddr("2001:2:0:1::11"),
	}
	// World6Prefix is the world's IPv6 internet: the public override a
	// dual-stack daemon gets, as 198.18.0.0/15 is the IPv4 one.
	World6Prefix = netip.MustParsePrefix("2001:2::/48")
)

// EnableIPv6 gives the world IPv6: addresses on both ends of the uplink
// (DAD off: the link has two ends, both ours), a default route from the
// simulated host to the internet side, and on every address of Web6 the
// same servers as on the IPv4 web addresses (TCP and UDP echo :7, HTTP
// :80). The world's DNS server answers AAAA for whatever records a test
// adds. Worlds are IPv4-only until this is called, so every test that does
// not call it sees exactly the world it always saw.
func (w *World) EnableIPv6() error {
	hh, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", w.HostName, err)
	}
	defer hh.Close()
	ih, err := netlink.NewHandleAt(w.Net)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", w.NetName, err)
	}
	defer ih.Close()
	var servers []netip.Prefix
	for _, a := range web6Addrs {
		servers = append(servers, netip.PrefixFrom(a, 128))
	}
	for _, step := range []struct {
		h     *netlink.Handle
		link  string
		addrs []netip.Prefix
	}{
		{hh, "uplink", []netip.Prefix{hostUplink6}},
		{ih, "lo", servers},
		{ih, "downlink", []netip.Prefix{internetUplink6}},
	} {
		l, err := step.h.LinkByName(step.link)
		if err != nil {
			return fmt.Errorf("find link %s: %w", step.link, err)
		}
		for _, p := range step.addrs {
			a := &netlink.Addr{IPNet: prefixToIPNet(p), Flags: unix.IFA_F_NODAD}
			if err := step.h.AddrAdd(l, a); err != nil {
				return fmt.Errorf("add %s to %s: %w", p, step.link, err)
			}
		}
	}
	up, err := hh.LinkByName("uplink")
	if err != nil {
		return fmt.Errorf("find uplink: %w", err)
	}
	def := prefixToIPNet(netip.MustParsePrefix("::/0"))
	route := &netlink.Route{LinkIndex: up.Attrs().Index, Dst: def, Gw: internetUplink6.Addr().AsSlice()}
	if err := hh.RouteAdd(route); err != nil {
		return fmt.Errorf("add default route via %s: %w", internetUplink6.Addr(), err)
	}
	w.Web6 = web6Addrs
	w.Uplink6 = hostUplink6.Addr()
	for _, a := range web6Addrs {
		if err := w.startEchoAndHTTP(a); err != nil {
			return err
		}
	}
	return nil
}

// family turns "tcp4"/"udp4" into "tcp6"/"udp6" for an IPv6 destination.
func family(network string, a netip.Addr) string {
	if a.Is6() && !a.Is4In6() && len(network) == 4 && network[3] == '4' {
		return network[:3] + "6"
	}
	return network
}

// addLoopback6 puts a v6 address (/128, DAD off) on the loopback of the
// internet side: a server of the world's IPv6 internet.
func (w *World) addLoopback6(a netip.Addr) error {
	ih, err := netlink.NewHandleAt(w.Net)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", w.NetName, err)
	}
	defer ih.Close()
	lo, err := ih.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find link lo: %w", err)
	}
	if err := ih.AddrAdd(lo, &netlink.Addr{IPNet: prefixToIPNet(netip.PrefixFrom(a, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("add %s to lo: %w", a, err)
	}
	return nil
}
