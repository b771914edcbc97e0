package nsmgr

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The steps of Attach that Create does not have, in CreateSteps' place of
// StepCreateNetns and StepResolvConf (an attached session has neither).
const (
	StepOpenNetns = "open-netns" // open the runtime's netns, check it may be used
	StepGuestIPv6 = "guest-ipv6" // in the netns: IPv6 disabled on the guest interface (dual-stack: closed down)
)

// AttachSteps lists every step of Attach, in order.
var AttachSteps = []string{
	StepAllocateSlot, StepOpenNetns, StepAddVeth, StepTagVeth, StepGuestIPv6, StepHostIPv6,
	StepHostAddr, StepHostUp, StepGuestAddr, StepGuestUp, StepGuestRoute,
}

// Attachment names a netns that something else made (a container runtime,
// through CNI) and the interface a session gets in it.
type Attachment struct {
	NetnsPath string // an nsfs file: /var/run/netns/NAME, /proc/PID/ns/net
	IfName    string // the guest side of the veth (see ValidateIfName)
}

// ValidateAttachment checks an attachment before anything is made: an
// absolute path on which a netns is mounted, and a valid interface name.
func ValidateAttachment(at Attachment) error {
	if err := ValidateIfName(at.IfName); err != nil {
		return err
	}
	if !filepath.IsAbs(at.NetnsPath) {
		return fmt.Errorf("invalid netns path %q: want an absolute path", at.NetnsPath)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(at.NetnsPath, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("invalid netns path %q: no such file", at.NetnsPath)
		}
		return fmt.Errorf("invalid netns path %q: %w", at.NetnsPath, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		return fmt.Errorf("invalid netns path %q: not a network namespace (want a netns file such as /var/run/netns/NAME or /proc/PID/ns/net)", at.NetnsPath)
	}
	return nil
}

// Attach builds the network of a session in a netns it did not make: the
// veth pair with its peer created directly in that netns under at.IfName,
// the slot's /30, IPv6 disabled on both sides, the host side's ARP locked,
// and the default route via the gateway, exactly as Create does for a netns
// of its own. On a dual-stack daemon (Config.Pool6) the slot's /126 goes on
// both sides too, with the guest's IPv6 default route, and IPv6 is closed
// down on the guest interface alone (ipv6Closed on at.IfName in the
// runtime's netns: its "all" and "default" are the runtime's), its
// link-local address pinned to GuestLinkLocal6 as an owned eth0's is. It writes no resolv.conf (the runtime owns the container's
// /etc) and never touches lo or anything else already in the netns.
//
// The host veth's alias is "<prefix>-<session> attached", so Recover and
// Reap know the session without a netns file. Delete removes the veth pair
// (the kernel would keep it as long as the runtime keeps its netns: the
// host side down at once, the pair deleted in the background, retire.go)
// and never the netns. A failure unwinds like Create's.
//
// It refuses the daemon's own netns, init's, the netns of any session
// of this Manager, made (or being made) or attached, and its prepared netns: a veth there would
// give the caller a route out of, or into, what enforcerd confines.
func (m *Manager) Attach(name string, at Attachment) (Session, error) {
	if err := ValidateAttachment(at); err != nil {
		return Session{}, fmt.Errorf("create session %s: %w", name, err)
	}
	return m.create(name, true, &at)
}

func (c *creation) runAttach() error {
	m := c.m
	if err := c.step(StepAllocateSlot, c.allocate); err != nil {
		return err
	}
	if err := c.step(StepOpenNetns, c.openNetns); err != nil {
		return err
	}
	c.hostName = HostIfaceName(m.cfg.Prefix, c.slot)
	_, c.gw, c.guestAddr = m.geo.SlotAddrs(c.slot)
	if m.cfg.Pool6.IsValid() {
		_, c.gw6, c.guest6 = Slot6Addrs(m.cfg.Pool6, c.slot)
	}
	steps := []struct {
		name string
		fn   func() error
	}{
		{StepAddVeth, c.addVeth},
		{StepTagVeth, c.tagVeth},
		{StepGuestIPv6, c.configureGuestIPv6},
		{StepHostIPv6, c.disableHostIPv6},
		{StepHostAddr, c.addHostAddrs},
		{StepHostUp, func() error { return setUp(m.host, c.host) }},
		{StepGuestAddr, c.addGuestAddr},
		{StepGuestUp, func() error { return setUp(c.guest, c.eth0) }},
		{StepGuestRoute, c.addDefaultRoutes},
	}
	for _, s := range steps {
		if err := c.step(s.name, s.fn); err != nil {
			return err
		}
	}
	return nil
}

// openNetns opens the runtime's netns and a netlink socket in it, refuses a
// netns that is not the caller's to give (see Attach), and checks that the
// interface name is free there, so that a failed add names the right cause.
// An interface of that name that is the guest side of a veth this Manager
// is deleting in the background (a DEL just before: retire.go) is waited
// for, not refused.
func (c *creation) openNetns() error {
	path := c.attach.NetnsPath
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	c.nsFD = ns
	if err := c.m.refuseMade(ns, path); err != nil {
		return err
	}
	if c.guest, err = handleIn(ns); err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	links, err := c.m.linksIn(c.guest, path)
	if err != nil {
		return err
	}
	session, err := c.m.sessionWithPeerIn(c.guest, links)
	if err != nil || session != "" {
		return refusal(path, "the netns of session "+session, err)
	}
	for _, l := range links {
		if l.Attrs().Name == c.ifname {
			return &RefusedError{fmt.Sprintf("interface %s exists in netns %s: want another interface name", c.ifname, path)}
		}
	}
	return nil
}

// linksIn lists the links of the netns of h (a runtime's netns: lo and
// little else), first waiting for the background deletes of this
// Manager's veths that still reach into it (retire.go), so that neither
// their guest side nor their owner alias is met.
func (m *Manager) linksIn(h *netlink.Handle, path string) ([]netlink.Link, error) {
	deadline := time.Now().Add(retireWait)
	for {
		links, err := retryDump("links", h.LinkList)
		if err != nil {
			return nil, fmt.Errorf("list links in netns %s: %w", path, err)
		}
		var wait <-chan struct{}
		for _, l := range links {
			if a := l.Attrs(); a.NetNsID >= 0 && a.ParentIndex > 0 {
				if done := m.retiringDone(a.ParentIndex); done != nil {
					wait = done
					break
				}
			}
		}
		if wait == nil {
			return links, nil
		}
		select {
		case <-wait:
		case <-time.After(time.Until(deadline)):
			return links, nil // (still there: refused below as any session's netns)
		}
	}
}

// refuseMade fails when ns is the daemon's netns, init's, or the netns of
// a session this Manager made (sessionWithPeerIn covers the netns a session
// was attached to: attaching must not add a route to a netns whose policy,
// --locked included, another session holds).
func (m *Manager) refuseMade(ns netns.NsHandle, path string) error {
	if same, err := sameNetns(ns, m.cfg.HostNS); err != nil || same {
		return refusal(path, "the daemon's own netns", err)
	}
	if init, err := netns.GetFromPath("/proc/1/ns/net"); err == nil {
		same, err := sameNetns(ns, init)
		init.Close()
		if err != nil || same {
			return refusal(path, "the host's netns (init's)", err)
		}
	}
	// The netns this Manager made: its sessions', those of the Creates in
	// flight (no veth of ours in them yet), and the prepared ones (no
	// session's yet: an interface attached there would be in the netns
	// the next Create claims).
	type madeNetns struct{ path, what string }
	m.mu.Lock()
	var own []madeNetns
	for _, s := range m.sessions {
		if !s.Attached {
			own = append(own, madeNetns{s.NetnsPath, "the netns of session " + filepath.Base(s.NetnsPath)})
		}
	}
	for name := range m.creating {
		p := m.NetnsPath(name) // an Attach in flight has no file there: skipped below
		own = append(own, madeNetns{p, "the netns of session " + filepath.Base(p)})
	}
	for name := range m.prep.names {
		own = append(own, madeNetns{filepath.Join(m.cfg.NetnsDir, name), "a netns the daemon prepared for its own sessions"})
	}
	m.mu.Unlock()
	for _, o := range own {
		sns, err := netns.GetFromPath(o.path)
		if err != nil {
			continue // deleted meanwhile, or not made yet
		}
		same, err := sameNetns(ns, sns)
		sns.Close()
		if err != nil || same {
			return refusal(path, o.what, err)
		}
	}
	return nil
}

// sessionWithPeerIn returns the session whose host veth has its peer among
// links, the links of the netns of h, or "" when none has. This is how an
// attached session's netns is known (a CNI or bring-your-own netns: the
// Manager keeps no path of it after Recover, and a /proc/PID/ns/net path
// may name another netns by now): by the kernel's own link between the two
// ends of a veth, seen from the netns being attached, which holds a few
// links, rather than from the host's, which holds one per session. A link
// there whose peer is in the host's netns (its link-netnsid is the id the
// netns gives the host's) names the peer's ifindex, and that host link's
// name and owner alias name the session. It covers every session with a
// NIC, daemon-made ones included, of this Manager and of an earlier run of
// it.
func (m *Manager) sessionWithPeerIn(h *netlink.Handle, links []netlink.Link) (string, error) {
	var peers []int
	for _, l := range links {
		if a := l.Attrs(); a.NetNsID >= 0 && a.ParentIndex > 0 {
			peers = append(peers, a.ParentIndex)
		}
	}
	if len(peers) == 0 {
		return "", nil
	}
	// The dump (linksIn) filled each link's IFLA_LINK_NETNSID, which gives
	// the peer's netns an id in this one if it had none: the host's id
	// read here is comparable whenever a veth reaches into the host.
	id, err := h.GetNetNsIdByFd(int(m.cfg.HostNS))
	if err != nil {
		return "", fmt.Errorf("netns id of the host: %w", err)
	}
	if id < 0 {
		return "", nil // no id here for the host's netns: no veth reaches it
	}
	for _, l := range links {
		a := l.Attrs()
		if a.NetNsID != id || a.ParentIndex <= 0 {
			continue
		}
		peer, err := m.host.LinkByIndex(a.ParentIndex)
		if isNotFound(err) {
			continue // deleted meanwhile
		}
		if err != nil {
			return "", fmt.Errorf("peer of %s: %w", a.Name, err)
		}
		pa := peer.Attrs()
		if _, ok := parseHostIfaceName(m.cfg.Prefix, pa.Name); !ok {
			continue
		}
		if session, _, ok := parseOwnerAlias(m.cfg.Prefix, pa.Alias); ok {
			return session, nil
		}
	}
	return "", nil
}

func refusal(path, what string, err error) error {
	if err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	return &RefusedError{fmt.Sprintf("invalid netns path %q: it is %s, not a container's", path, what)}
}

// RefusedError is an attachment Attach will not make (the netns is not a
// container's, or the interface name is taken in it): the caller's
// mistake, not the kernel's.
type RefusedError struct{ msg string }

func (e *RefusedError) Error() string { return e.msg }

func sameNetns(a, b netns.NsHandle) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Fstat(int(a), &sa); err != nil {
		return false, fmt.Errorf("stat netns: %w", err)
	}
	if err := unix.Fstat(int(b), &sb); err != nil {
		return false, fmt.Errorf("stat netns: %w", err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

// configureGuestIPv6 sets IPv6 on the guest interface before it goes up
// (the netns's "all" and "default" are the runtime's to choose; this
// interface's are ours), from a thread in the runtime's netns: disabled on
// an IPv4-only daemon; on a dual-stack one enabled and closed down to the
// address Attach assigns (ipv6Closed: no RA, no autoconfiguration, no
// redirects, no DAD, no router solicitation).
func (c *creation) configureGuestIPv6() error {
	if !c.guest6.IsValid() {
		return Do(c.nsFD, func() error {
			if err := disableIPv6(c.ifname); err != nil && !errors.Is(err, fs.ErrNotExist) { // (no such file: a kernel without IPv6)
				return fmt.Errorf("disable ipv6 on %s in netns %s: %w", c.ifname, c.attach.NetnsPath, err)
			}
			return nil
		})
	}
	return Do(c.nsFD, func() error {
		dir := ipv6ConfDir + "/" + c.ifname + "/"
		for _, s := range ipv6Closed {
			if err := writeSysctl(dir+s.key, s.value); err != nil {
				return fmt.Errorf("dual-stack: ipv6 settings of %s in netns %s: %w", c.ifname, c.attach.NetnsPath, err)
			}
		}
		if err := writeSysctl(dir+"disable_ipv6", "0"); err != nil { // the runtime's default may disable it
			return fmt.Errorf("dual-stack: enable ipv6 on %s in netns %s: %w", c.ifname, c.attach.NetnsPath, err)
		}
		return nil
	})
}

// retireAttachedVeth takes the host veth of slot down and deletes it in
// the background (retire.go) if its alias names name as attached (the peer
// goes with it). Once it returns, no packet passes the veth either way. A
// missing link, or one that is not this attached session's, is left alone:
// success.
func (m *Manager) retireAttachedVeth(name string, slot int) error {
	hostName := HostIfaceName(m.cfg.Prefix, slot)
	link, err := m.host.LinkByName(hostName)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("find link %s: %w", hostName, err)
	}
	if session, attached, _ := parseOwnerAlias(m.cfg.Prefix, link.Attrs().Alias); !attached || session != name {
		return nil
	}
	if err := m.host.LinkSetDown(link); err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("set link %s down: %w", hostName, err)
	}
	return m.retireLink(link)
}
