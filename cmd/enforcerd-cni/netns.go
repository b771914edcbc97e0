package main

// Reading the container's interface from inside CNI_NETNS, without netlink:
// the plugin stays a small exec (no netlink library), and it looks at the
// netns through the path the runtime gave it, which is what the runtime
// will use, whatever the daemon's own view of the filesystem is. A thread
// enters the netns with setns(2) and asks the kernel through ioctl(2) on a
// socket made there (SIOCGIFFLAGS, SIOCGIFHWADDR, SIOCGIFADDR,
// SIOCGIFNETMASK) and through /proc/thread-self/net/route, which is the
// routing table of the reading thread's netns.

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// containerIface is what the container's netns holds for one interface.
type containerIface struct {
	Up       bool
	MAC      net.HardwareAddr
	Addr     netip.Prefix // the primary IPv4 address; invalid when it has none
	Gateway  netip.Addr   // of the IPv4 default route through it; invalid when none
	HasRoute bool
	// Addrs6 are its global IPv6 addresses (no link-local); Gateway6 is
	// the next hop of the IPv6 default route through it.
	Addrs6    []netip.Prefix
	Gateway6  netip.Addr
	HasRoute6 bool
}

// errNoIface is an interface the netns does not have.
var errNoIface = errors.New("no such interface")

// inspectIface reads ifname in the netns at path. The thread that enters
// the netns is never handed back to the Go scheduler: its goroutine ends
// with the thread still locked, so the runtime terminates it, and no other
// goroutine can run in the container's netns.
func inspectIface(path, ifname string) (containerIface, error) {
	return readIface(path, ifname, true)
}

// ifaceMAC reads only what ADD's result needs of ifname in the netns at
// path: that it exists, and its MAC (nil: not an Ethernet interface).
func ifaceMAC(path, ifname string) (net.HardwareAddr, error) {
	ci, err := readIface(path, ifname, false)
	return ci.MAC, err
}

// readIface reads ifname in the netns at path as inspectIface says; all
// false stops after its flags and MAC.
func readIface(path, ifname string, all bool) (containerIface, error) {
	type answer struct {
		ci  containerIface
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see inspectIface
		ci, err := inspectIfaceHere(path, ifname, all)
		ch <- answer{ci, err}
	}()
	a := <-ch
	return a.ci, a.err
}

func inspectIfaceHere(path, ifname string, all bool) (containerIface, error) {
	var ci containerIface
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return ci, fmt.Errorf("open netns %s: %w", path, err)
	}
	err = unix.Setns(fd, unix.CLONE_NEWNET)
	unix.Close(fd)
	if err != nil {
		return ci, fmt.Errorf("enter netns %s: %w", path, err)
	}
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return ci, fmt.Errorf("socket in netns %s: %w", path, err)
	}
	defer unix.Close(s)

	ifr, err := unix.NewIfreq(ifname)
	if err != nil {
		return ci, fmt.Errorf("interface %q: %w", ifname, err)
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return ci, fmt.Errorf("%s in netns %s: %w", ifname, path, errNoIface)
		}
		return ci, fmt.Errorf("flags of %s in netns %s: %w", ifname, path, err)
	}
	ci.Up = ifr.Uint16()&unix.IFF_UP != 0
	if ci.MAC, err = hardwareAddr(s, ifname); err != nil {
		return ci, fmt.Errorf("mac of %s in netns %s: %w", ifname, path, err)
	}
	if !all {
		return ci, nil
	}
	if ci.Addr, err = ipv4Addr(s, ifname); err != nil {
		return ci, fmt.Errorf("address of %s in netns %s: %w", ifname, path, err)
	}
	if ci.Gateway, ci.HasRoute, err = defaultRoute(ifname); err != nil {
		return ci, fmt.Errorf("routes of netns %s: %w", path, err)
	}
	// IPv6, when the netns has it (no such file: a kernel without IPv6).
	if ci.Addrs6, err = readProcNet("if_inet6", func(sc *bufio.Scanner) ([]netip.Prefix, error) { return parseIfInet6(sc, ifname) }); err != nil {
		return ci, fmt.Errorf("IPv6 addresses of netns %s: %w", path, err)
	}
	type route6 struct {
		gw netip.Addr
		ok bool
	}
	r, err := readProcNet("ipv6_route", func(sc *bufio.Scanner) (route6, error) {
		gw, ok, err := parseRoutes6(sc, ifname)
		return route6{gw, ok}, err
	})
	if err != nil {
		return ci, fmt.Errorf("IPv6 routes of netns %s: %w", path, err)
	}
	ci.Gateway6, ci.HasRoute6 = r.gw, r.ok
	return ci, nil
}

// readProcNet parses /proc/thread-self/net/NAME (the calling thread's
// netns) with parse; a missing file is the zero value.
func readProcNet[T any](name string, parse func(*bufio.Scanner) (T, error)) (T, error) {
	var zero T
	f, err := os.Open("/proc/thread-self/net/" + name)
	if errors.Is(err, os.ErrNotExist) {
		return zero, nil
	}
	if err != nil {
		return zero, err
	}
	defer f.Close()
	return parse(bufio.NewScanner(f))
}

// parseIfInet6 reads /proc/net/if_inet6: "ADDR IFINDEX PREFIXLEN SCOPE
// FLAGS IFNAME", the address as 32 hex digits, the length in hex; it
// returns ifname's addresses of global scope (0).
func parseIfInet6(sc *bufio.Scanner, ifname string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[5] != ifname || f[3] != "00" {
			continue
		}
		a, err := hex16(f[0])
		if err != nil {
			return nil, err
		}
		bits, err := strconv.ParseUint(f[2], 16, 8)
		if err != nil || bits > 128 {
			return nil, fmt.Errorf("prefix length %q", f[2])
		}
		out = append(out, netip.PrefixFrom(a, int(bits)))
	}
	return out, sc.Err()
}

// parseRoutes6 reads /proc/net/ipv6_route: "DST DSTLEN SRC SRCLEN NEXTHOP
// METRIC REFCNT USE FLAGS IFNAME", addresses as 32 hex digits; it returns
// the next hop of the default route (::/0) through ifname.
func parseRoutes6(sc *bufio.Scanner, ifname string) (netip.Addr, bool, error) {
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[9] != ifname || f[1] != "00" || strings.Trim(f[0], "0") != "" {
			continue
		}
		gw, err := hex16(f[4])
		if err != nil {
			return netip.Addr{}, false, err
		}
		return gw, true, nil
	}
	return netip.Addr{}, false, sc.Err()
}

func hex16(s string) (netip.Addr, error) {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 16 {
		return netip.Addr{}, fmt.Errorf("IPv6 address %q: want 32 hex digits", s)
	}
	return netip.AddrFrom16([16]byte(b)), nil
}

// ifreqHW is struct ifreq with its union read as ifr_hwaddr (a sockaddr);
// unix.Ifreq has no accessor for it.
type ifreqHW struct {
	Name   [unix.IFNAMSIZ]byte
	Family uint16
	Data   [14]byte
	_      [8]byte // the union is 24 bytes
}

func hardwareAddr(s int, ifname string) (net.HardwareAddr, error) {
	var r ifreqHW
	copy(r.Name[:], ifname)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(s), unix.SIOCGIFHWADDR, uintptr(unsafe.Pointer(&r))); e != 0 {
		return nil, e
	}
	if r.Family != unix.ARPHRD_ETHER {
		return nil, nil // no Ethernet address to report (not a veth)
	}
	return net.HardwareAddr(append([]byte(nil), r.Data[:6]...)), nil
}

func ipv4Addr(s int, ifname string) (netip.Prefix, error) {
	ifr, err := unix.NewIfreq(ifname)
	if err != nil {
		return netip.Prefix{}, err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFADDR, ifr); err != nil {
		if errors.Is(err, unix.EADDRNOTAVAIL) {
			return netip.Prefix{}, nil // no IPv4 address
		}
		return netip.Prefix{}, err
	}
	ip, err := ifr.Inet4Addr()
	if err != nil {
		return netip.Prefix{}, err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFNETMASK, ifr); err != nil {
		return netip.Prefix{}, err
	}
	mask, err := ifr.Inet4Addr()
	if err != nil {
		return netip.Prefix{}, err
	}
	ones, _ := net.IPMask(mask).Size()
	return netip.PrefixFrom(netip.AddrFrom4([4]byte(ip)), ones), nil
}

// defaultRoute finds the IPv4 default route through ifname in the main
// table of the calling thread's netns.
func defaultRoute(ifname string) (netip.Addr, bool, error) {
	f, err := os.Open("/proc/thread-self/net/route")
	if err != nil {
		return netip.Addr{}, false, err
	}
	defer f.Close()
	return parseRoutes(bufio.NewScanner(f), ifname)
}

// parseRoutes reads /proc/net/route: a header, then "Iface Destination
// Gateway Flags RefCnt Use Metric Mask ..." with addresses as hex of the
// address's bytes in host order.
func parseRoutes(sc *bufio.Scanner, ifname string) (netip.Addr, bool, error) {
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 8 || f[0] != ifname || f[1] != "00000000" || f[7] != "00000000" {
			continue
		}
		gw, err := strconv.ParseUint(f[2], 16, 32)
		if err != nil {
			return netip.Addr{}, false, fmt.Errorf("route gateway %q: %w", f[2], err)
		}
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], uint32(gw))
		return netip.AddrFrom4(b), true, nil
	}
	return netip.Addr{}, false, sc.Err()
}
