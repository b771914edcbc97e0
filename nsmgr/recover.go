package nsmgr

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// Recover rebuilds the Manager's state from the kernel, so that a restarted
// daemon never hands out a live slot: a host veth of this prefix whose
// owner's netns is mounted is a live session holding its slot; a netns with
// no veth is a session without NIC; a veth whose netns is gone (the kernel
// is still removing it, or something holds the netns) leaves its slot
// quarantined until the veth is gone; pool addresses held by links that are
// not ours are never handed out. It returns the sessions found, sorted by
// name. Call it before serving: it replaces what the Manager knew.
func (m *Manager) Recover() ([]Session, error) {
	st, err := m.scan()
	if err != nil {
		return nil, fmt.Errorf("recover: %w", err)
	}
	ipam, _ := NewIPAM(m.cfg.Pool) // the pool was validated by New
	owner, stale := m.sessionLinks(st)
	// Free but dirty first (handed out only once the link is gone), so that
	// marking live slots below always wins.
	for _, l := range st.links {
		if !l.owned() {
			ipam.Release(l.slot)
		}
	}
	for _, l := range stale {
		ipam.Release(l.slot)
	}
	last := -1
	markUsed := func(slot int) {
		ipam.MarkUsed(slot)
		last = max(last, slot)
	}
	sessions := map[string]Session{}
	for session, l := range owner {
		markUsed(l.slot)
		for _, a := range l.addrs {
			if slot, ok := ipam.SlotOf(a); ok {
				markUsed(slot) // never hand out a live address, even one we did not configure
			}
		}
		sess := m.session(session, l.slot)
		if l.attached {
			// The runtime's netns path is not in the kernel's view of the
			// link: the caller's record holds it.
			sess.Attached, sess.Netns, sess.NetnsPath = true, "", ""
		}
		if l.vm && !l.attached {
			vm, err := readVMNet(sess.NetnsPath)
			if err != nil {
				// Still a VM session (its veth says so): the caller's
				// record names the tap and MAC.
				vm = &VMNet{Bridge: VMBridge, TapOwner: NoTapOwner}
			}
			sess.VM = vm
			sess.Subnet6, sess.Gateway6, sess.Guest6 = netip.Prefix{}, netip.Addr{}, netip.Addr{} // IPv4-only
		}
		sessions[session] = sess
	}
	for _, a := range st.poolAddrs {
		if slot, ok := ipam.SlotOf(a); ok {
			markUsed(slot)
		}
	}
	for _, n := range st.netns {
		if _, ok := sessions[n.session]; n.mounted && !ok {
			sessions[n.session] = m.session(n.session, -1)
		}
	}
	ipam.seek(last + 1) // carry on where the previous run probably stopped
	// Sessions with a NIC get their resolv.conf again (idempotent): one
	// made by a version that wrote none, or one removed by hand.
	for session, l := range owner {
		if l.attached {
			continue // the runtime writes its resolv.conf
		}
		if err := m.writeResolvConf(session); err != nil {
			return nil, fmt.Errorf("recover: %w", err)
		}
	}
	// Veths made by a version that did not lock ARP get it now (idempotent).
	for _, l := range owner {
		// A veth that went away since the scan has nothing to lock.
		if err := lockARP(m.hostRoute, l.index); err != nil && !errors.Is(err, unix.ENODEV) {
			return nil, fmt.Errorf("recover: %s: %w", l.name, err)
		}
	}

	m.mu.Lock()
	m.ipam = ipam
	m.sessions = sessions
	m.mu.Unlock()
	return sortedSessions(sessions), nil
}

// Reap removes every netns file "<prefix>-<session>", every prepared netns
// "<prefix>-pool_<pid>_<n>" but this Manager's own live pool, every host veth
// owned by this prefix (alias "<prefix>-<session>") and the resolv.conf of
// every directory <EtcNetnsDir>/<prefix>-<session> (with the directory when
// left empty) whose session is not in keep, and nothing else: no object of
// another prefix, not the DNS interface. Veths are deleted synchronously,
// including those that linger because something still holds their netns.
// It returns the kernel objects it removed ("netns <name>", "link <name>").
// Do not run it concurrently with a Create of a session that is not in
// keep.
func (m *Manager) Reap(keep map[string]bool) ([]string, error) {
	st, err := m.scan()
	if err != nil {
		return nil, fmt.Errorf("reap: %w", err)
	}
	var (
		removed []string
		errs    []error
		freed   []int // slots whose veth was deleted
	)
	for _, n := range st.netns {
		if keep[n.session] {
			continue
		}
		if err := deleteVMLinks(n.path, ""); err != nil {
			errs = append(errs, err)
		}
		if err := removeNetns(n.path); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "netns "+NetnsName(m.cfg.Prefix, n.session))
	}
	m.mu.Lock()
	own := maps.Clone(m.prep.names)
	m.mu.Unlock()
	for _, name := range st.prepared {
		if own[name] {
			continue
		}
		if err := removeNetns(filepath.Join(m.cfg.NetnsDir, name)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, "netns "+name)
	}
	confs, err := m.resolvConfSessions()
	if err != nil {
		errs = append(errs, err)
	}
	for _, session := range confs {
		if !keep[session] {
			if err := m.removeResolvConf(session); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// Veths of sessions not kept, and stale veths of kept sessions (an old
	// veth lingering beside the live one after the name was reused).
	owner, stale := m.sessionLinks(st)
	var doomed []foundLink
	for _, l := range owner {
		if !keep[l.session] {
			doomed = append(doomed, l)
		}
	}
	for _, l := range stale {
		if !keep[l.session] || owner[l.session].name != "" {
			doomed = append(doomed, l)
		}
	}
	sort.Slice(doomed, func(i, j int) bool { return doomed[i].slot < doomed[j].slot })
	for _, l := range doomed {
		deleted, err := deleteLinkByName(m.host, l.name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		freed = append(freed, l.slot)
		if deleted {
			removed = append(removed, "link "+l.name)
		}
	}

	m.mu.Lock()
	for name, s := range m.sessions {
		if !keep[name] {
			m.ipam.Release(s.Slot)
			delete(m.sessions, name)
		}
	}
	for _, slot := range freed {
		if !m.slotHeldLocked(slot) {
			m.ipam.Release(slot)
		}
	}
	m.mu.Unlock()

	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("reap: %w", err)
	}
	return removed, nil
}

// slotHeldLocked reports whether a known session holds slot. Caller holds
// m.mu.
func (m *Manager) slotHeldLocked(slot int) bool {
	for _, s := range m.sessions {
		if s.Slot == slot {
			return true
		}
	}
	return false
}

func sortedSessions(byName map[string]Session) []Session {
	out := make([]Session, 0, len(byName))
	for _, s := range byName {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
