package nsmgr

import (
	"fmt"
	"os"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// writeSysctl writes value to a /proc/sys file. /proc/sys/net shows the
// netns of the calling thread, so callers run it inside Do.
func writeSysctl(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("write sysctl %s: %w", path, err)
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write sysctl %s: %w", path, err)
	}
	return nil
}

// ipv6SysctlPath is the disable_ipv6 sysctl of an interface (or of "all",
// "default").
func ipv6SysctlPath(iface string) string {
	return "/proc/sys/net/ipv6/conf/" + iface + "/disable_ipv6"
}

// disableIPv6 disables IPv6 on iface in the current thread's netns.
func disableIPv6(iface string) error { return writeSysctl(ipv6SysctlPath(iface), "1") }

// EnableForwarding sets net.ipv4.ip_forward=1 in the netns ns (the daemon's
// netns: sessions are routed through it).
func EnableForwarding(ns netns.NsHandle) error {
	err := Do(ns, func() error { return writeSysctl("/proc/sys/net/ipv4/ip_forward", "1") })
	if err != nil {
		return fmt.Errorf("enable ipv4 forwarding: %w", err)
	}
	return nil
}

// IPV4_DEVCONF indexes (linux/ip.h) of the ARP settings.
const (
	devconfARPAnnounce = 18
	devconfARPIgnore   = 19
)

// lockARP makes the host veth with index idx answer ARP only for its own
// address (arp_ignore=1) and source its own requests from it
// (arp_announce=2), in the current thread's netns. Without it the veth
// answers for every local address of the daemon's netns (other sessions'
// gateways, the uplink, the DNS anycast address): an oracle for a sandbox
// with NET_RAW. It is one RTM_SETLINK (IFLA_AF_SPEC / AF_INET /
// IFLA_INET_CONF), cheaper than two /proc/sys writes whose path lookup
// grows with the number of namespaces on the machine.
func lockARP(idx int) error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(idx)
	req.AddData(msg)
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	conf := spec.AddRtAttr(unix.AF_INET, nil).AddRtAttr(unix.IFLA_INET_CONF, nil)
	conf.AddRtAttr(devconfARPIgnore, nl.Uint32Attr(1))
	conf.AddRtAttr(devconfARPAnnounce, nl.Uint32Attr(2))
	req.AddData(spec)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("set arp_ignore=1 arp_announce=2 on link %d: %w", idx, err)
	}
	return nil
}
