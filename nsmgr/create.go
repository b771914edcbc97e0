package nsmgr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/internal/txn"
)

// The steps of Create, in order; Config.Fault and Config.StepStarted are
// called with each name before the step runs. A session without NIC runs
// only StepCreateNetns, StepDisableIPv6 and StepLoUp.
const (
	StepAllocateSlot = "allocate-slot" // take a /30 slot
	StepCreateNetns  = "create-netns"  // netns file, new netns bind-mounted on it
	StepDisableIPv6  = "disable-ipv6"  // in the netns: net.ipv6.conf.{all,default}.disable_ipv6=1
	StepLoUp         = "lo-up"         // in the netns: lo up
	StepResolvConf   = "resolv-conf"   // <EtcNetnsDir>/<prefix>-<session>/resolv.conf naming the DNS anycast address
	StepAddVeth      = "add-veth"      // veth <prefix><slot>h in the host netns, peer eth0 created in the session netns
	StepTagVeth      = "tag-veth"      // alias "<prefix>-<session>" on the host side (its owner), its ARP locked (lockARP)
	StepHostIPv6     = "host-ipv6"     // IPv6 disabled on the host side
	StepHostAddr     = "host-addr"     // gateway/30 on the host side
	StepHostUp       = "host-up"       // host side up
	StepGuestAddr    = "guest-addr"    // guest/30 on eth0
	StepGuestUp      = "guest-up"      // eth0 up
	StepGuestRoute   = "guest-route"   // default route via the gateway
)

// CreateSteps lists every step of Create with a NIC, in order.
var CreateSteps = []string{
	StepAllocateSlot, StepCreateNetns, StepDisableIPv6, StepLoUp,
	StepResolvConf, StepAddVeth, StepTagVeth, StepHostIPv6, StepHostAddr, StepHostUp,
	StepGuestAddr, StepGuestUp, StepGuestRoute,
}

// Create builds the network of a session: a named netns with lo up and
// IPv6 disabled and, if nic, a veth pair with the slot's addresses, the
// guest's default route and the resolv.conf `ip netns exec` shows it (see
// Config.EtcNetnsDir). Without nic (egress none) the netns has only lo.
//
// Create is a transaction: every step registers its undo, and a failure at
// any step unwinds the steps before it in reverse, leaving no netns file,
// mount, link or slot behind. Creating a name that exists fails.
func (m *Manager) Create(name string, nic bool) (sess Session, err error) {
	return m.create(name, nic, nil)
}

// CreateAlongside is Create with alongside run on a goroutine of its own
// as soon as the session's slot is allocated, concurrently with the rest
// of the create: it gets the Session as Create would return it (its
// names and addresses; its kernel objects may not exist yet), for work
// that needs only those, such as the session's firewall elements.
// CreateAlongside returns once both ended; an error of alongside fails the
// create (which then unwinds its own steps). What alongside made is the
// caller's to undo, also when the create failed after alongside
// succeeded. Without nic alongside is not run.
func (m *Manager) CreateAlongside(name string, nic bool, alongside func(Session) error) (sess Session, err error) {
	return m.createWith(name, nic, nil, nil, alongside)
}

// create is Create, or Attach when at is set.
func (m *Manager) create(name string, nic bool, at *Attachment) (sess Session, err error) {
	return m.createWith(name, nic, at, nil, nil)
}

// createWith is create, or CreateVM when vm is set, or CreateAlongside
// when alongside is.
func (m *Manager) createWith(name string, nic bool, at *Attachment, vm *VMConfig, alongside func(Session) error) (sess Session, err error) {
	if err := ValidateSessionName(name); err != nil {
		return Session{}, err
	}
	if err := m.begin(name); err != nil {
		return Session{}, fmt.Errorf("create session %s: %w", name, err)
	}
	c := &creation{m: m, name: name, slot: -1, attach: at, vm: vm, ifname: GuestIface, nsFD: netns.None(), alongside: alongside}
	if at != nil {
		c.ifname = at.IfName
	}
	defer func() {
		c.close()
		if err != nil {
			err = fmt.Errorf("create session %s: %w", name, c.undo.Fail(err))
		}
		m.mu.Lock()
		delete(m.creating, name)
		if err == nil {
			m.sessions[name] = sess
		}
		if len(m.creating) == 0 {
			select { // the refill of prepared netns waits for this
			case m.prep.idle <- struct{}{}:
			default:
			}
		}
		m.mu.Unlock()
	}()
	if err := c.run(nic); err != nil {
		return Session{}, err
	}
	sess = m.session(name, c.slot)
	if at != nil {
		sess.Netns, sess.NetnsPath, sess.Attached, sess.IfName = at.NetnsPath, at.NetnsPath, true, at.IfName
	}
	if vm != nil {
		sess.VM = &VMNet{Bridge: VMBridge, Tap: vm.Tap, TapOwner: vm.TapOwner, MAC: vm.MAC}
		sess.Subnet6, sess.Gateway6, sess.Guest6 = netip.Prefix{}, netip.Addr{}, netip.Addr{} // IPv4-only
	}
	return sess, nil
}

// begin reserves name for a Create in flight.
func (m *Manager) begin(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.closed:
		return errors.New("manager closed")
	case m.creating[name]:
		return errors.New("already being created")
	}
	if _, ok := m.sessions[name]; ok {
		return errors.New("session exists")
	}
	if err := m.prepareDirLocked(); err != nil {
		return err
	}
	m.creating[name] = true
	return nil
}

// creation is the state of one Create or Attach.
type creation struct {
	m      *Manager
	name   string
	slot   int
	attach *Attachment // nil: a netns of our own
	vm     *VMConfig   // nil: not a VM session (see CreateVM)
	ifname string      // the guest side: GuestIface, or the attachment's
	undo   txn.Undo
	nsFD   netns.NsHandle  // the session netns, open while creating; netns.None() before (the zero value is fd 0!)
	guest  *netlink.Handle // rtnetlink socket in the session netns
	host   netlink.Link    // the host-side veth once added
	eth0   netlink.Link    // the guest side, found through guest

	hostName      string     // <prefix><slot>h
	gw, guestAddr netip.Addr // of the slot
	gw6, guest6   netip.Addr // of the slot's /126; invalid: IPv4-only

	resolvDone chan error // the resolv.conf write in flight (startResolvConf); nil: none

	alongside     func(Session) error // CreateAlongside's; nil: none
	alongsideDone chan error          // its outcome once started; nil: not started
}

func (c *creation) close() {
	if c.guest != nil {
		c.guest.Close()
	}
	if c.nsFD.IsOpen() {
		c.nsFD.Close()
	}
}

// step runs one step after asking the fault seam.
func (c *creation) step(name string, fn func() error) error {
	if f := c.m.cfg.Fault; f != nil {
		if err := f(name); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if s := c.m.cfg.StepStarted; s != nil {
		s(name)
	}
	return fn()
}

// netnsName names the session's netns in errors.
func (c *creation) netnsName() string {
	if c.attach != nil {
		return c.attach.NetnsPath
	}
	return NetnsName(c.m.cfg.Prefix, c.name)
}

func (c *creation) run(nic bool) error {
	if c.attach != nil {
		return c.runAttach()
	}
	m := c.m
	if nic {
		if err := c.step(StepAllocateSlot, c.allocate); err != nil {
			return err
		}
	}
	if err := c.step(StepCreateNetns, c.createNetns); err != nil {
		return err
	}
	if !nic {
		return nil
	}
	c.hostName = HostIfaceName(m.cfg.Prefix, c.slot)
	_, c.gw, c.guestAddr = m.geo.SlotAddrs(c.slot)
	if m.cfg.Pool6.IsValid() && c.vm == nil {
		_, c.gw6, c.guest6 = Slot6Addrs(m.cfg.Pool6, c.slot)
	}
	c.startAlongside()
	steps := []struct {
		name string
		fn   func() error
	}{
		{StepResolvConf, c.startResolvConf},
		{StepAddVeth, c.addVeth},
		{StepTagVeth, c.tagVeth},
		{StepHostIPv6, c.disableHostIPv6},
		{StepHostAddr, c.addHostAddrs},
		{StepHostUp, func() error { return setUp(m.host, c.host) }},
		{StepGuestAddr, c.addGuestAddr},
		{StepGuestUp, func() error { return setUp(c.guest, c.eth0) }},
		{StepGuestRoute, c.addDefaultRoutes},
	}
	if c.vm != nil {
		// The address is the VM's: nothing in the netns holds one.
		steps = append(steps[:len(steps)-3], []struct {
			name string
			fn   func() error
		}{
			{StepAddBridge, c.addBridge},
			{StepAddTap, c.addTap},
			{StepLockTap, c.lockTap},
			{StepVMUp, c.vmUp},
		}...)
	}
	for _, s := range steps {
		if err := c.step(s.name, s.fn); err != nil {
			return errors.Join(err, c.waitResolvConf(), c.waitAlongside())
		}
	}
	return errors.Join(c.waitResolvConf(), c.waitAlongside())
}

// startAlongside starts CreateAlongside's work once the slot is known.
func (c *creation) startAlongside() {
	if c.alongside == nil {
		return
	}
	sess := c.m.session(c.name, c.slot)
	c.alongsideDone = make(chan error, 1)
	go func() { c.alongsideDone <- c.alongside(sess) }()
}

// waitAlongside waits for CreateAlongside's work, if started, and returns
// its error.
func (c *creation) waitAlongside() error {
	if c.alongsideDone == nil {
		return nil
	}
	err := <-c.alongsideDone
	c.alongsideDone = nil
	return err
}

func (c *creation) allocate() error {
	m := c.m
	m.mu.Lock()
	slot, err := m.allocateLocked()
	m.mu.Unlock()
	if err != nil {
		return err
	}
	c.slot = slot
	c.undo.Push(fmt.Sprintf("slot %d", slot), func() error {
		m.mu.Lock()
		m.ipam.Release(slot)
		m.mu.Unlock()
		return nil
	})
	return nil
}

// createNetns creates the named netns and, while the locked thread is in
// it, opens its fd and a netlink socket there, disables IPv6 (before any
// interface but lo exists, so eth0 inherits "default") and brings lo up.
//
// With a prepared netns ready (see prepared.go) it claims that one instead:
// the disable-ipv6 and lo-up steps were done when it was prepared, and run
// here as no-ops so that the Fault seam still sees every step in order (a
// fault there unwinds the claim like any other).
func (c *creation) createNetns() error {
	m := c.m
	if p := m.takePrepared(); p != nil {
		if err := c.claim(p); err != nil {
			return err
		}
		if err := c.step(StepDisableIPv6, func() error { return nil }); err != nil {
			return err
		}
		return c.step(StepLoUp, func() error { return nil })
	}
	path := m.NetnsPath(c.name)
	if err := createNetnsFile(path); err != nil {
		return err
	}
	c.undo.Push("netns "+path, func() error { return removeNetns(path) })
	return inNewNetns(path, func() error {
		var err error
		if c.nsFD, err = netns.Get(); err != nil {
			return fmt.Errorf("open netns %s: %w", path, err)
		}
		if c.guest, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
			return fmt.Errorf("open netlink socket in netns %s: %w", path, err)
		}
		if err := c.step(StepDisableIPv6, m.configureNewNetnsIPv6); err != nil {
			return err
		}
		return c.step(StepLoUp, func() error { return setLoUp(c.guest, path) })
	})
}

// setLoUp brings lo up through h, a netlink socket in the netns at path.
func setLoUp(h *netlink.Handle, path string) error {
	// lo is ifindex 1 in every netns (LOOPBACK_IFINDEX).
	lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo", Index: 1}}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up in netns %s: %w", path, err)
	}
	return nil
}

// addVeth creates the veth pair from the host netns with its peer created
// directly in the session netns: moving a link between namespaces holds
// rtnl_lock through an RCU barrier, a scaling cliff under concurrent creates.
// One request, whose echo names both ends' ifindexes (newVethEcho); the
// host side is looked up by name only when the kernel sent no echo.
func (c *creation) addVeth() error {
	m, hostName := c.m, c.hostName
	index, peerIndex, err := newVethEcho(m.hostRoute, hostName, c.ifname, int(c.nsFD), !m.cfg.NoLinkEcho)
	if err != nil {
		return fmt.Errorf("add veth %s: %w", hostName, err)
	}
	// Registered only now: if the add failed because the name exists, the
	// link is not ours to delete.
	c.undo.Push("veth "+hostName, func() error {
		_, err := deleteLinkByName(m.host, hostName)
		return err
	})
	if index == 0 {
		link, err := m.host.LinkByName(hostName)
		if err != nil {
			return fmt.Errorf("find veth %s: %w", hostName, err)
		}
		c.host = link
		return nil
	}
	c.host = &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostName, Index: index}, PeerName: c.ifname}
	c.eth0 = &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: c.ifname, Index: peerIndex}, PeerName: hostName}
	return nil
}

// tagVeth names the owner session in the host veth's alias (the kernel
// ignores IFLA_IFALIAS on create, hence a step of its own) and, in the
// same RTM_SETLINK, locks its ARP answers to its own address (lockARP):
// one round trip for both, long before the veth goes up.
func (c *creation) tagVeth() error {
	alias := ownerAlias(c.m.cfg.Prefix, c.name, c.attach != nil)
	if c.vm != nil {
		alias += vmMark
	}
	if err := tagAndLockARP(c.m.hostRoute, c.host.Attrs().Index, alias); err != nil {
		return fmt.Errorf("%s: %w", c.hostName, err)
	}
	return nil
}

// disableHostIPv6 disables IPv6 on the host veth before it goes up (before
// it would get a link-local address). A sysctl is the only interface for
// disable_ipv6, resolved from the host netns's conf directory opened once
// (a full /proc/sys path costs a lookup that grows with the number of
// netns, see sysctl.go; below that directory a lookup stays in its netns,
// whatever the calling thread's): no thread is switched into the host
// netns.
func (c *creation) disableHostIPv6() error {
	if err := c.m.configureHostIfaceIPv6(c.hostName); err != nil {
		return fmt.Errorf("ipv6 settings of %s: %w", c.hostName, err)
	}
	return nil
}

func (c *creation) addGuestAddr() error {
	if c.eth0 == nil { // no echo from the veth's creation
		eth0, err := c.guest.LinkByName(c.ifname)
		if err != nil {
			return fmt.Errorf("find %s in netns %s: %w", c.ifname, c.netnsName(), err)
		}
		c.eth0 = eth0
	}
	if err := addAddr(c.guest, c.eth0, c.guestAddr); err != nil {
		return err
	}
	if c.guest6.IsValid() {
		if err := pinLinkLocal6(c.guest, c.eth0); err != nil {
			return fmt.Errorf("netns %s: %w", c.netnsName(), err)
		}
		return addAddr6(c.guest, c.eth0, c.guest6)
	}
	return nil
}

// addHostAddrs puts the gateway/30 (and on a dual-stack daemon ::1/126) on
// the host side.
func (c *creation) addHostAddrs() error {
	if err := addAddr(c.m.host, c.host, c.gw); err != nil {
		return err
	}
	if c.gw6.IsValid() {
		return addAddr6(c.m.host, c.host, c.gw6)
	}
	return nil
}

// addDefaultRoutes adds the guest's default route, and on a dual-stack
// daemon its IPv6 one.
func (c *creation) addDefaultRoutes() error {
	if err := c.addDefaultRoute(); err != nil {
		return err
	}
	if c.guest6.IsValid() {
		return c.addDefaultRoute6()
	}
	return nil
}

func (c *creation) addDefaultRoute() error {
	route := &netlink.Route{LinkIndex: c.eth0.Attrs().Index, Gw: c.gw.AsSlice()} // Dst nil: default
	if err := c.guest.RouteAdd(route); err != nil {
		return fmt.Errorf("add default route via %s in netns %s: %w", c.gw, c.netnsName(), err)
	}
	return nil
}

// startResolvConf writes the session's resolv.conf on a goroutine of its
// own while the netlink steps run (file system work beside rtnetlink work:
// the two share nothing); run waits for it before it returns, also on
// failure, so the undo (which removes the file and its directory when
// empty, even after a partial write) never races the write.
func (c *creation) startResolvConf() error {
	m, name := c.m, c.name
	c.undo.Push("resolv.conf "+m.ResolvConfPath(name), func() error { return m.removeResolvConf(name) })
	done := make(chan error, 1)
	c.resolvDone = done
	go func() { done <- m.writeResolvConf(name) }()
	return nil
}

// waitResolvConf waits for startResolvConf's write, if one was started,
// and returns its error.
func (c *creation) waitResolvConf() error {
	if c.resolvDone == nil {
		return nil
	}
	err := <-c.resolvDone
	c.resolvDone = nil
	return err
}

func addAddr(h *netlink.Handle, link netlink.Link, a netip.Addr) error {
	ipnet := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(30, 32)}
	if err := h.AddrAdd(link, &netlink.Addr{IPNet: ipnet}); err != nil {
		return fmt.Errorf("add address %s/30 to %s: %w", a, link.Attrs().Name, err)
	}
	return nil
}

func setUp(h *netlink.Handle, link netlink.Link) error {
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", link.Attrs().Name, err)
	}
	return nil
}
