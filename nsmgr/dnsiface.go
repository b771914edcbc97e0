package nsmgr

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// EnsureDNSInterface makes the interface "<prefix>dns" exist in the host
// netns, up, holding the DNS anycast address /32, with IPv6 disabled, and
// returns the address. Sessions reach it through their default route.
//
// The link is a dummy where the kernel has that type; kernels built without
// CONFIG_DUMMY (this one, CI's) get an empty bridge instead: it has no
// ports, so nothing is ever bridged, and like a dummy it holds a local
// address (local delivery does not need carrier). It is idempotent and
// accepts an existing interface of either kind.
func (m *Manager) EnsureDNSInterface() (netip.Addr, error) {
	name := DNSIfaceName(m.cfg.Prefix)
	addr := m.geo.DNSAddr()
	link, err := m.host.LinkByName(name)
	if isNotFound(err) {
		link, err = m.addDNSLink(name)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("dns interface %s: %w", name, err)
	}
	if t := link.Type(); t != "dummy" && t != "bridge" {
		return netip.Addr{}, fmt.Errorf("dns interface %s: exists with type %s; want dummy or bridge", name, t)
	}
	if m.cfg.Pool6.IsValid() {
		if err := m.ensureDNS6(link); err != nil {
			return netip.Addr{}, err
		}
	} else {
		err = Do(m.cfg.HostNS, func() error { return disableIPv6(name) })
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return netip.Addr{}, fmt.Errorf("dns interface %s: disable ipv6: %w", name, err)
		}
	}
	ipnet := &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}
	if err := m.host.AddrReplace(link, &netlink.Addr{IPNet: ipnet}); err != nil {
		return netip.Addr{}, fmt.Errorf("dns interface %s: add address %s/32: %w", name, addr, err)
	}
	if err := m.host.LinkSetUp(link); err != nil {
		return netip.Addr{}, fmt.Errorf("dns interface %s: set up: %w", name, err)
	}
	return addr, nil
}

// addDNSLink adds the DNS link: a dummy, or an empty bridge where the kernel
// has no dummy type. A concurrent add of the same name is not an error.
func (m *Manager) addDNSLink(name string) (netlink.Link, error) {
	attrs := netlink.LinkAttrs{Name: name}
	err := m.host.LinkAdd(&netlink.Dummy{LinkAttrs: attrs})
	if errors.Is(err, unix.EOPNOTSUPP) { // CONFIG_DUMMY off
		err = m.host.LinkAdd(&netlink.Bridge{LinkAttrs: attrs})
	}
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("add link: %w", err)
	}
	link, err := m.host.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("find link: %w", err)
	}
	return link, nil
}

// RemoveDNSInterface deletes "<prefix>dns"; "already gone" is success.
func (m *Manager) RemoveDNSInterface() error {
	if _, err := deleteLinkByName(m.host, DNSIfaceName(m.cfg.Prefix)); err != nil {
		return fmt.Errorf("remove dns interface: %w", err)
	}
	return nil
}

// CheckDNSInterface reports whether the DNS interface exists, is up and
// holds the anycast address (a health check: it changes nothing).
func (m *Manager) CheckDNSInterface() error {
	name := DNSIfaceName(m.cfg.Prefix)
	link, err := m.host.LinkByName(name)
	if err != nil {
		return fmt.Errorf("dns interface %s: %w", name, err)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("dns interface %s is down", name)
	}
	addrs, err := m.host.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("dns interface %s: list addresses: %w", name, err)
	}
	want := m.geo.DNSAddr()
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == want {
			return nil
		}
	}
	return fmt.Errorf("dns interface %s lacks the anycast address %s", name, want)
}
