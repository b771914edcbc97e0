package nsmgr

import (
	"errors"
	"fmt"
	"io/fs"
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

// ipv6ConfDir is the directory of the per-interface IPv6 sysctls.
const ipv6ConfDir = "/proc/sys/net/ipv6/conf"

// Why /proc/sys lookups are avoided on the create path: procfs gives every
// netns its own sysctl dentries, and those of a directory that exists per
// netns (net/ipv6, net/ipv4, net/core) hang under the one shared dentry of
// /proc/sys/net with the same name, in one dcache hash chain. A lookup of
// /proc/sys/net/ipv6 walks that chain, and proc_sys_compare rejects (under
// the global sysctl_lock) every entry of another netns: with 4000 netns
// that had looked it up, a disable_ipv6 write took 4 ms in a long-lived
// netns and 10 ms in a new one (nsmgr's sysctl experiment, see
// docs/benchmarks.md). Below net/ipv6 the parents are per netns and the
// chains short, so:
//
//   - the host side opens the daemon netns's conf directory once
//     (hostConfDir) and resolves "<veth>/disable_ipv6" from it;
//   - a new netns is configured through a private, detached procfs
//     instance (privateProc): its dcache holds only this netns's entries,
//     and the netns leaves none behind in the shared /proc, so it does not
//     lengthen the chains of the next lookups either.

// disableIPv6 disables IPv6 on iface in the current thread's netns through
// the shared /proc (for the rare paths: the DNS interface, an attached
// session's interface in the runtime's netns).
func disableIPv6(iface string) error {
	return writeSysctl(ipv6ConfDir+"/"+iface+"/disable_ipv6", "1")
}

// openHostConfDir opens ipv6ConfDir of the current thread's netns; nil and
// no error without IPv6 (no such directory).
func openHostConfDir() (*os.File, error) {
	f, err := os.OpenFile(ipv6ConfDir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", ipv6ConfDir, err)
	}
	return f, nil
}

// writeSysctlAt writes value to the sysctl file rel below the directory dir
// (a /proc/sys directory, or the root of a procfs instance). The netns the
// entry belongs to is the directory's: dentries below a netns's own
// directory are that netns's.
func writeSysctlAt(dir int, rel, value string) error {
	fd, err := unix.Openat(dir, rel, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("write sysctl %s: %w", rel, err)
	}
	_, err = unix.Write(fd, []byte(value))
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write sysctl %s: %w", rel, err)
	}
	return nil
}

// disableHostIfaceIPv6 disables IPv6 on the interface iface of the netns
// whose conf directory dir is (see openHostConfDir; nil: no IPv6, nothing
// to do).
func disableHostIfaceIPv6(dir *os.File, iface string) error {
	if dir == nil {
		return nil
	}
	err := writeSysctlAt(int(dir.Fd()), iface+"/disable_ipv6", "1")
	if errors.Is(err, fs.ErrNotExist) {
		return nil // a kernel without IPv6 (or the module gone since)
	}
	return err
}

// privateProc mounts a new procfs instance, detached (never attached to a
// mount tree, invisible to other processes) and returns its root, or -1 if
// the kernel refuses (fsopen is newer than the kernels we test on, and a
// seccomp filter may deny it). Closing the fd destroys the instance with
// its dentries.
func privateProc() int {
	fsfd, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1
	}
	return mfd
}

// disableNewNetnsIPv6 sets net.ipv6.conf.{all,default}.disable_ipv6=1 in
// the current thread's netns, a new one, before any interface but lo exists
// (interfaces created afterwards inherit "default"). One write does it: the
// kernel applies a write to "all" to "default" and to every existing
// interface (addrconf_disable_ipv6; lo here), so a second write to
// "default" would change nothing (TestNsmgrCreateWithNIC and
// TestNsmgrIPv6SysctlsHitTheRightNetns read all, default, lo and eth0 back).
// It goes through a private procfs instance (see privateProc), or the
// shared /proc if none can be made. A kernel without IPv6 (no such file)
// is not an error.
func disableNewNetnsIPv6() error {
	root, sys := privateProc(), "sys/net/ipv6/conf/"
	if root >= 0 {
		// Closing it tears the instance down, which can wait for an RCU
		// grace period (several ms on a busy machine): not on the
		// caller's time.
		defer func() { go unix.Close(root) }()
	} else {
		root, sys = unix.AT_FDCWD, ipv6ConfDir+"/"
	}
	err := writeSysctlAt(root, sys+"all/disable_ipv6", "1")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

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
// (arp_announce=2), through sock, a rtnetlink socket in the daemon netns
// (Manager.hostRoute). Without it the veth answers for every local address
// of the daemon's netns (other sessions' gateways, the uplink, the DNS
// anycast address): an oracle for a sandbox with NET_RAW. It is one
// RTM_SETLINK (IFLA_AF_SPEC / AF_INET / IFLA_INET_CONF), cheaper than two
// /proc/sys writes whose path lookup grows with the number of namespaces
// on the machine.
func lockARP(sock *nl.SocketHandle, idx int) error {
	if err := setLinkARPLock(sock, idx, ""); err != nil {
		return fmt.Errorf("set arp_ignore=1 arp_announce=2 on link %d: %w", idx, err)
	}
	return nil
}

// tagAndLockARP is lockARP and the link's alias set to alias, in one
// RTM_SETLINK (the kernel validates the whole request before it applies
// any of it, then sets the alias and the IPv4 devconf).
func tagAndLockARP(sock *nl.SocketHandle, idx int, alias string) error {
	if err := setLinkARPLock(sock, idx, alias); err != nil {
		return fmt.Errorf("set alias %q and arp_ignore=1 arp_announce=2 on link %d: %w", alias, idx, err)
	}
	return nil
}

// setLinkARPLock sends lockARP's RTM_SETLINK, with IFLA_IFALIAS when alias
// is not empty.
func setLinkARPLock(sock *nl.SocketHandle, idx int, alias string) error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: sock}
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(idx)
	req.AddData(msg)
	if alias != "" {
		req.AddData(nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(alias)))
	}
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	conf := spec.AddRtAttr(unix.AF_INET, nil).AddRtAttr(unix.IFLA_INET_CONF, nil)
	conf.AddRtAttr(devconfARPIgnore, nl.Uint32Attr(1))
	conf.AddRtAttr(devconfARPAnnounce, nl.Uint32Attr(2))
	req.AddData(spec)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// openRouteSocket opens a rtnetlink socket in the current thread's netns,
// with the library's send and receive timeouts, for lockARP.
func openRouteSocket() (*nl.SocketHandle, error) {
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open rtnetlink socket: %w", err)
	}
	if err := s.SetSendTimeout(&nl.SocketTimeoutTv); err != nil {
		s.Close()
		return nil, fmt.Errorf("rtnetlink socket: %w", err)
	}
	if err := s.SetReceiveTimeout(&nl.SocketTimeoutTv); err != nil {
		s.Close()
		return nil, fmt.Errorf("rtnetlink socket: %w", err)
	}
	return &nl.SocketHandle{Socket: s}, nil
}
