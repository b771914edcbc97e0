package nsmgr

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The steps a VM session runs instead of StepGuestAddr, StepGuestUp and
// StepGuestRoute (see CreateVM): the guest's address is the VM's, handed
// out by DHCP, and nothing in the session netns holds an address.
const (
	StepAddBridge = "add-bridge" // bridge VMBridge in the session netns, STP off
	StepAddTap    = "add-tap"    // persistent tap VMConfig.Tap, owned by VMConfig.TapOwner
	StepLockTap   = "lock-tap"   // eth0 and the tap enslaved; the tap port locked to the guest MAC
	StepVMUp      = "vm-up"      // eth0, the tap and the bridge up
)

// VMCreateSteps lists every step of CreateVM, in order.
var VMCreateSteps = []string{
	StepAllocateSlot, StepCreateNetns, StepDisableIPv6, StepLoUp,
	StepResolvConf, StepAddVeth, StepTagVeth, StepHostIPv6, StepHostAddr, StepHostUp,
	StepAddBridge, StepAddTap, StepLockTap, StepVMUp,
}

const (
	// VMBridge is the bridge in a VM session's netns joining eth0 (the
	// veth's guest side) and the tap.
	VMBridge = "br0"
	// DefaultTap is the tap's name unless VMConfig.Tap names another.
	DefaultTap = "tap0"
	// NoTapOwner leaves the tap owned by root (CAP_NET_ADMIN attaches).
	NoTapOwner = -1
	// vmMark ends the alias of a VM session's host veth:
	// "<prefix>-<session> vm". It tells Recover to look for the tap.
	vmMark = " vm"
)

// VMConfig is the guest attachment of a VM session (see CreateVM).
type VMConfig struct {
	// Tap names the tap device the VMM attaches to (default DefaultTap).
	Tap string
	// TapOwner is the uid that may attach to the tap without
	// CAP_NET_ADMIN (an unprivileged VMM), or NoTapOwner.
	TapOwner int
	// MAC is the guest's MAC: the only source address the tap's bridge
	// port forwards. Default GuestMAC of the session.
	MAC net.HardwareAddr
}

// VMNet is what a VM session's netns holds besides eth0.
type VMNet struct {
	Bridge   string // VMBridge
	Tap      string
	TapOwner int // NoTapOwner: root
	MAC      net.HardwareAddr
}

// GuestMAC derives a session's guest MAC: locally administered, unicast,
// the rest from a hash of the prefix and the session name (stable across
// restarts, different for every session of a daemon).
func GuestMAC(prefix, session string) net.HardwareAddr {
	h := sha256.Sum256([]byte(NetnsName(prefix, session)))
	mac := net.HardwareAddr(h[:6])
	mac[0] = mac[0]&0xfc | 0x02
	return mac
}

// ParseGuestMAC parses a guest MAC given by a user: 6 octets, unicast
// (a multicast source address is never a guest's) and not all zeros.
func ParseGuestMAC(s string) (net.HardwareAddr, error) {
	const want = "want six hex octets like 02:00:00:00:00:01, unicast (first octet even), not all zeros"
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return nil, fmt.Errorf("mac %q: %s", s, want)
	}
	if mac[0]&1 == 1 || mac.String() == "00:00:00:00:00:00" {
		return nil, fmt.Errorf("mac %q: %s", s, want)
	}
	return mac, nil
}

// ValidateVMConfig checks a VMConfig and fills in its defaults.
func ValidateVMConfig(prefix, session string, vm *VMConfig) error {
	if vm.Tap == "" {
		vm.Tap = DefaultTap
	}
	if err := validateIfName(vm.Tap); err != nil {
		return fmt.Errorf("tap %q: %w", vm.Tap, err)
	}
	if vm.Tap == GuestIface || vm.Tap == VMBridge || vm.Tap == "lo" {
		return fmt.Errorf("tap %q: taken in the session netns (%s, %s, lo); want another name", vm.Tap, GuestIface, VMBridge)
	}
	if vm.TapOwner < NoTapOwner || int64(vm.TapOwner) > 1<<32-2 {
		return fmt.Errorf("tap owner %d: want a uid from 0 to 4294967294", vm.TapOwner)
	}
	if vm.MAC == nil {
		vm.MAC = GuestMAC(prefix, session)
	} else if _, err := ParseGuestMAC(vm.MAC.String()); err != nil {
		return err
	}
	return nil
}

// validateIfName checks an interface name against the kernel's rules.
func validateIfName(name string) error {
	if name == "" || len(name) > ifNameMax || name == "." || name == ".." || strings.ContainsAny(name, "/: \t\n") {
		return errors.New(ifNameWant)
	}
	return nil
}

// CreateVM builds the network of a VM session: what Create builds with a
// NIC, except that eth0 holds no address and has no route; instead a
// bridge (VMBridge, STP off so it forwards at once, no address) joins
// eth0 to a persistent tap the VMM attaches to. The tap's bridge port is
// locked (IFLA_BRPORT_LOCKED) with one static FDB entry, the guest MAC:
// the bridge forwards nothing the guest sends from another source MAC
// (learning is off on the port). The guest gets the slot's guest address
// from DHCP (see the dhcpguest package) or the kernel's ip= argument.
func (m *Manager) CreateVM(name string, vm VMConfig) (Session, error) {
	if err := ValidateVMConfig(m.cfg.Prefix, name, &vm); err != nil {
		return Session{}, fmt.Errorf("create session %s: %w", name, err)
	}
	return m.createWith(name, true, nil, &vm, nil)
}

// addBridge adds the bridge in the session netns.
func (c *creation) addBridge() error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: VMBridge}}
	if err := c.guest.LinkAdd(br); err != nil {
		return fmt.Errorf("add bridge %s in netns %s: %w", VMBridge, c.netnsName(), err)
	}
	// Nothing to undo: the bridge goes with the netns.
	return nil
}

// addTap adds the persistent tap in the session netns: /dev/net/tun is
// opened on a thread in that netns (a tap is made in its opener's netns),
// single queue (Firecracker and Cloud Hypervisor want multiqueue off), no
// packet information header, virtio-net headers offered.
func (c *creation) addTap() error {
	tap := &netlink.Tuntap{
		LinkAttrs: netlink.LinkAttrs{Name: c.vm.Tap},
		Mode:      netlink.TUNTAP_MODE_TAP,
		Flags:     netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR | netlink.TuntapFlag(unix.IFF_TUN_EXCL),
	}
	if c.vm.TapOwner != NoTapOwner {
		tap.Owner = uint32(c.vm.TapOwner)
	}
	err := Do(c.nsFD, func() error { return c.guest.LinkAdd(tap) })
	if err != nil {
		return fmt.Errorf("add tap %s in netns %s: %w", c.vm.Tap, c.netnsName(), err)
	}
	return nil
}

// lockTap enslaves eth0 and the tap to the bridge, turns learning off and
// the lock on for the tap's port and adds the guest MAC's static entry.
func (c *creation) lockTap() error {
	h := c.guest
	br, err := h.LinkByName(VMBridge)
	if err != nil {
		return fmt.Errorf("find %s in netns %s: %w", VMBridge, c.netnsName(), err)
	}
	eth0, err := h.LinkByName(c.ifname)
	if err != nil {
		return fmt.Errorf("find %s in netns %s: %w", c.ifname, c.netnsName(), err)
	}
	tap, err := h.LinkByName(c.vm.Tap)
	if err != nil {
		return fmt.Errorf("find %s in netns %s: %w", c.vm.Tap, c.netnsName(), err)
	}
	c.eth0 = eth0
	for _, l := range []netlink.Link{eth0, tap} {
		if err := h.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("enslave %s to %s: %w", l.Attrs().Name, VMBridge, err)
		}
	}
	if err := h.LinkSetLearning(tap, false); err != nil {
		return fmt.Errorf("turn learning off on %s: %w", c.vm.Tap, err)
	}
	fdb := &netlink.Neigh{
		LinkIndex:    tap.Attrs().Index,
		Family:       unix.AF_BRIDGE,
		State:        netlink.NUD_NOARP, // static
		Flags:        netlink.NTF_MASTER,
		HardwareAddr: c.vm.MAC,
	}
	if err := h.NeighAppend(fdb); err != nil {
		return fmt.Errorf("add fdb entry %s on %s: %w", c.vm.MAC, c.vm.Tap, err)
	}
	// netlink has no call for IFLA_BRPORT_LOCKED: the request is built
	// here and sent from a thread in the session netns.
	return Do(c.nsFD, func() error {
		if err := setBridgePortLocked(tap.Attrs().Index); err != nil {
			return fmt.Errorf("lock bridge port %s: %w", c.vm.Tap, err)
		}
		return nil
	})
}

// setBridgePortLocked sets IFLA_BRPORT_LOCKED on the bridge port with
// index idx, in the calling thread's netns.
func setBridgePortLocked(idx int) error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_BRIDGE)
	msg.Index = int32(idx)
	req.AddData(msg)
	protinfo := nl.NewRtAttr(unix.IFLA_PROTINFO|unix.NLA_F_NESTED, nil)
	protinfo.AddRtAttr(unix.IFLA_BRPORT_LOCKED, []byte{1})
	req.AddData(protinfo)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// vmUp brings eth0, the tap and the bridge up.
func (c *creation) vmUp() error {
	for _, name := range []string{c.ifname, c.vm.Tap, VMBridge} {
		l, err := c.guest.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find %s in netns %s: %w", name, c.netnsName(), err)
		}
		if err := setUp(c.guest, l); err != nil {
			return err
		}
	}
	return nil
}

// deleteVMLinks deletes the tap and the bridge in the netns at path, by
// name: the tap named, else every port of VMBridge but eth0 (a session
// not known since a restart). A VMM still attached loses its link at
// once instead of when the netns is finally freed. A missing netns, tap or
// bridge is success.
func deleteVMLinks(path, tap string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer f.Close()
	if !isNetnsMount(path) {
		return nil
	}
	h, err := handleIn(netns.NsHandle(f.Fd()))
	if err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	defer h.Close()
	names := []string{}
	if tap != "" {
		names = append(names, tap)
	} else if ports, err := bridgePorts(h); err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	} else {
		for _, p := range ports {
			names = append(names, p.Attrs().Name)
		}
	}
	var errs []error
	for _, name := range append(names, VMBridge) {
		if _, err := deleteLinkByName(h, name); err != nil {
			errs = append(errs, fmt.Errorf("netns %s: %w", path, err))
		}
	}
	return errors.Join(errs...)
}

// bridgePorts lists the ports of VMBridge other than eth0 (the taps); none
// when there is no bridge.
func bridgePorts(h *netlink.Handle) ([]netlink.Link, error) {
	br, err := h.LinkByName(VMBridge)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", VMBridge, err)
	}
	links, err := retryDump("links", h.LinkList)
	if err != nil {
		return nil, err
	}
	var out []netlink.Link
	for _, l := range links {
		if a := l.Attrs(); a.MasterIndex == br.Attrs().Index && a.Name != GuestIface {
			out = append(out, l)
		}
	}
	return out, nil
}

// readVMNet reads a VM session's tap, its owner and the guest MAC (the
// tap port's static FDB entry) from the netns at path.
func readVMNet(path string) (*VMNet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer f.Close()
	h, err := handleIn(netns.NsHandle(f.Fd()))
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", path, err)
	}
	defer h.Close()
	ports, err := bridgePorts(h)
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", path, err)
	}
	if len(ports) != 1 {
		return nil, fmt.Errorf("netns %s: %d taps on %s, want 1", path, len(ports), VMBridge)
	}
	vm := &VMNet{Bridge: VMBridge, Tap: ports[0].Attrs().Name, TapOwner: NoTapOwner}
	if t, ok := ports[0].(*netlink.Tuntap); ok && t.Owner != 0 && t.Owner != ^uint32(0) {
		vm.TapOwner = int(t.Owner)
	}
	fdb, err := retryDump("fdb", func() ([]netlink.Neigh, error) { return h.NeighList(ports[0].Attrs().Index, unix.AF_BRIDGE) })
	if err != nil {
		return nil, fmt.Errorf("netns %s: list fdb of %s: %w", path, vm.Tap, err)
	}
	for _, n := range fdb {
		// Ours is static (NUD_NOARP); the bridge's own entries for
		// the tap's address are permanent.
		if n.State == netlink.NUD_NOARP && len(n.HardwareAddr) == 6 {
			vm.MAC = n.HardwareAddr
		}
	}
	return vm, nil
}
