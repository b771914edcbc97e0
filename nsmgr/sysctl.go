package nsmgr

import (
	"fmt"
	"os"

	"github.com/vishvananda/netns"
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
