package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/nsmgr"
)

// netFloor is the network create floor (issue 25): in this process, only
// the kernel calls a session's network needs, made the way nsmgr makes them
// (the same netlink library, one request per object, no lookup) and nothing else: a new
// netns bind-mounted at a name, lo up, a veth pair from the simulated host
// with its peer created in the netns, an address on each side, both sides
// up, the guest's default route. No daemon, no policy, no state: no slot
// allocator, no alias, no sysctl (IPv6, ARP lockdown), no resolv.conf, no
// undo log. Its addresses come from floorPool, apart from the sessions' and
// the ptp peer's in the same simulated host.
type netFloor struct {
	host   *netlink.Handle  // in the simulated host
	route  *nl.SocketHandle // a rtnetlink socket there, for the veth's create
	dir    string           // where its netns are mounted
	prefix string           // of its netns and links: unique per run
	pool6  netip.Prefix     // valid: dual-stack (floorPool6), each slot also gets a /126
	live   map[int]bool
}

// floorPool6 holds the dual-stack floor's /126s: slot i's ::1 (host) and
// ::2 (guest) at offset 4i, as nsmgr lays out its pool6.
var floorPool6 = netip.MustParsePrefix("fd00:22::/112")

// floorPool holds the floor's /30s: slot i is 10.22.0.4i/30, the host side
// .1, the guest .2, apart from nsmgr's default pool (10.20.0.0/16) and the
// ptp peer's (10.21.0.0/16, peerPool) in the same simulated host.
var floorPool = netip.MustParsePrefix("10.22.0.0/16")

// newNetFloor6 is newNetFloor for dual-stack slots: each also gets its
// /126 of floorPool6 (an address on each side, DAD off as nsmgr's, and the
// guest's IPv6 default route); IPv6 is otherwise left as a new netns has it.
func newNetFloor6(host netns.NsHandle, prefix string) (*netFloor, error) {
	f, err := newNetFloor(host, prefix)
	if f != nil {
		f.pool6 = floorPool6
	}
	return f, err
}

func newNetFloor(host netns.NsHandle, prefix string) (*netFloor, error) {
	h, err := netlink.NewHandleAt(host)
	if err != nil {
		return nil, fmt.Errorf("netlink socket in the simulated host: %w", err)
	}
	if err := nsmgr.PrepareNetnsDir(nsmgr.DefaultNetnsDir); err != nil {
		h.Close()
		return nil, err
	}
	cur, err := netns.Get()
	if err != nil {
		h.Close()
		return nil, err
	}
	defer cur.Close()
	s, err := nl.GetNetlinkSocketAt(host, cur, unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("rtnetlink socket in the simulated host: %w", err)
	}
	return &netFloor{host: h, route: &nl.SocketHandle{Socket: s}, dir: nsmgr.DefaultNetnsDir, prefix: prefix,
		live: map[int]bool{}}, nil
}

func (f *netFloor) path(i int) string     { return filepath.Join(f.dir, f.prefix+"-"+strconv.Itoa(i)) }
func (f *netFloor) hostName(i int) string { return f.prefix + strconv.Itoa(i) + "h" }

func (f *netFloor) addrs(i int) (gw, guest netip.Addr) {
	b := floorPool.Addr().As4()
	base := uint32(b[0])<<24 | uint32(b[1])<<16 + uint32(4*i)
	at := func(v uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	return at(base + 1), at(base + 2)
}

// Create makes slot i's network and returns how long it took.
func (f *netFloor) Create(i int) (time.Duration, error) {
	if i < 0 || 4*i+3 >= 1<<(32-floorPool.Bits()) {
		return 0, fmt.Errorf("network floor: slot %d: want 0 to %d", i, 1<<(32-floorPool.Bits())/4-1)
	}
	path, hostName := f.path(i), f.hostName(i)
	gw, guest := f.addrs(i)
	start := time.Now()
	file, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return 0, fmt.Errorf("network floor: %w", err)
	}
	file.Close()
	f.live[i] = true
	var ns netns.NsHandle
	var g *netlink.Handle
	err = func() error { // a new netns, mounted at path, on a locked thread
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			return err
		}
		defer func() {
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread() // else the thread dies with the goroutine
			}
			orig.Close()
		}()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mount %s: %w", path, err)
		}
		if ns, err = netns.Get(); err != nil {
			return err
		}
		g, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	}()
	if err != nil {
		return 0, fmt.Errorf("network floor: netns %s: %w", path, err)
	}
	defer ns.Close()
	defer g.Close()
	if err := g.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo", Index: 1}}); err != nil {
		return 0, fmt.Errorf("network floor: lo up: %w", err)
	}
	index, peerIndex, err := f.addVeth(hostName, int(ns))
	if err != nil {
		return 0, fmt.Errorf("network floor: add veth %s: %w", hostName, err)
	}
	host := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: hostName, Index: index}}
	if err := f.host.AddrAdd(host, floorAddr(gw)); err != nil {
		return 0, fmt.Errorf("network floor: address of %s: %w", hostName, err)
	}
	if err := f.host.LinkSetUp(host); err != nil {
		return 0, fmt.Errorf("network floor: %s up: %w", hostName, err)
	}
	eth0 := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: nsmgr.GuestIface, Index: peerIndex}}
	if err := g.AddrAdd(eth0, floorAddr(guest)); err != nil {
		return 0, fmt.Errorf("network floor: guest address: %w", err)
	}
	if err := g.LinkSetUp(eth0); err != nil {
		return 0, fmt.Errorf("network floor: guest up: %w", err)
	}
	if err := g.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
		return 0, fmt.Errorf("network floor: default route: %w", err)
	}
	if f.pool6.IsValid() {
		_, gw6, guest6 := nsmgr.Slot6Addrs(f.pool6, i)
		if err := f.host.AddrAdd(host, floorAddr6(gw6)); err != nil {
			return 0, fmt.Errorf("network floor: v6 address of %s: %w", hostName, err)
		}
		if err := g.AddrAdd(eth0, floorAddr6(guest6)); err != nil {
			return 0, fmt.Errorf("network floor: guest v6 address: %w", err)
		}
		def := &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		if err := g.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: def, Gw: gw6.AsSlice()}); err != nil {
			return 0, fmt.Errorf("network floor: v6 default route: %w", err)
		}
	}
	return time.Since(start), nil
}

func floorAddr6(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(nsmgr.Pool6SlotBits, 128)}, Flags: unix.IFA_F_NODAD}
}

// addVeth creates the pair, its peer in the netns of nsFD, with one
// RTM_NEWLINK whose echo (NLM_F_ECHO, Linux >= 6.3) gives both ifindexes:
// the kernel's part of making it, without the lookups by name the netlink
// library's LinkAdd adds (nsmgr makes it the same way).
func (f *netFloor) addVeth(hostName string, nsFD int) (index, peerIndex int, err error) {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK|unix.NLM_F_ECHO)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: f.route}
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(hostName)))
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("veth"))
	peer := info.AddRtAttr(nl.IFLA_INFO_DATA, nil).AddRtAttr(nl.VETH_INFO_PEER, nil)
	nl.NewIfInfomsgChild(peer, unix.AF_UNSPEC)
	peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(nsmgr.GuestIface))
	peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(nsFD)))
	req.AddData(info)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return 0, 0, err
	}
	for _, m := range msgs {
		if len(m) < unix.SizeofIfInfomsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfInfomsg:])
		if err != nil {
			return 0, 0, err
		}
		for _, a := range attrs {
			if a.Attr.Type == unix.IFLA_LINK && len(a.Value) >= 4 {
				return int(nl.DeserializeIfInfomsg(m).Index), int(binary.NativeEndian.Uint32(a.Value)), nil
			}
		}
	}
	return 0, 0, fmt.Errorf("no echo of the new link (a kernel older than 6.3?)")
}

func floorAddr(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(30, 32)}}
}

// Check verifies that slot i's guest reaches its gateway's address from
// inside its netns (the route and both addresses are there): the floor
// does the work it claims.
func (f *netFloor) Check(i int) error {
	ns, err := netns.GetFromPath(f.path(i))
	if err != nil {
		return err
	}
	defer ns.Close()
	g, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer g.Close()
	gw, guest := f.addrs(i)
	routes, err := g.RouteGet(net.ParseIP("198.18.0.1"))
	if err != nil {
		return fmt.Errorf("network floor: route from slot %d: %w", i, err)
	}
	if len(routes) == 0 || !routes[0].Gw.Equal(gw.AsSlice()) || !routes[0].Src.Equal(guest.AsSlice()) {
		return fmt.Errorf("network floor: slot %d routes %v, want via %s from %s", i, routes, gw, guest)
	}
	if f.pool6.IsValid() {
		_, gw6, guest6 := nsmgr.Slot6Addrs(f.pool6, i)
		routes, err := g.RouteGet(net.ParseIP("2001:2::1"))
		if err != nil {
			return fmt.Errorf("network floor: v6 route from slot %d: %w", i, err)
		}
		if len(routes) == 0 || !routes[0].Gw.Equal(gw6.AsSlice()) || !routes[0].Src.Equal(guest6.AsSlice()) {
			return fmt.Errorf("network floor: slot %d v6 routes %v, want via %s from %s", i, routes, gw6, guest6)
		}
	}
	return nil
}

// Delete removes slot i's netns (its veth goes with it) and returns how
// long it took.
func (f *netFloor) Delete(i int) (time.Duration, error) {
	path := f.path(i)
	start := time.Now()
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return 0, fmt.Errorf("network floor: unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return 0, fmt.Errorf("network floor: %w", err)
	}
	took := time.Since(start)
	delete(f.live, i)
	return took, nil
}

// Close removes every slot still there, by exact name.
func (f *netFloor) Close() {
	for i := range f.live {
		if _, err := f.Delete(i); err != nil {
			logf("cleanup: %v", err)
		}
	}
	f.route.Close()
	f.host.Close()
}
