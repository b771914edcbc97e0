package nsmgr

import "fmt"

// Delete removes a session's network from its name and slot alone (-1: no
// NIC); it needs no live handle, so it works after a restart. Every step
// treats "already gone" as success: calling Delete twice is fine.
//
// An attached session (see Attach) loses its veth pair and nothing else:
// its netns is never unmounted or removed. The host side goes down here, so
// no packet passes once Delete returns, and the pair is deleted in the
// background (retire.go), its slot quarantined until the kernel has
// removed it.
//
// It removes the session's resolv.conf under Config.EtcNetnsDir (and the
// directory holding it, when left empty) first.
//
// Fast path: it unmounts (MNT_DETACH) and removes the netns file, and the
// kernel removes the veth pair in the background once nothing else holds
// the netns (LinkDel would wait ~35 ms under the global network lock). The
// slot is released but stays quarantined: it is handed out again only after
// the allocator has wrapped around to it and its old host veth is gone. A
// veth that lingers because something still holds the netns is removed by
// Reap.
func (m *Manager) Delete(name string, slot int) error {
	if err := ValidateSessionName(name); err != nil {
		return err
	}
	if slot < -1 || slot >= m.geo.Slots() {
		return fmt.Errorf("delete session %s: slot %d outside the pool's 0..%d", name, slot, m.geo.Slots()-1)
	}
	m.mu.Lock()
	if m.creating[name] {
		m.mu.Unlock()
		return fmt.Errorf("delete session %s: a create of it is in flight", name)
	}
	s, known := m.sessions[name]
	if known && s.Slot != slot {
		m.mu.Unlock()
		return fmt.Errorf("delete session %s: slot %d given, but the session holds slot %d", name, slot, s.Slot)
	}
	m.mu.Unlock()

	// An attached session's veth goes down now and is deleted in the
	// background (retire.go): its netns is the runtime's and may live on.
	// (For a session not known, the alias decides.)
	if slot >= 0 && (!known || s.Attached) {
		if err := m.retireAttachedVeth(name, slot); err != nil {
			return fmt.Errorf("delete session %s: %w", name, err)
		}
	}

	// A VM session's tap and bridge go now, by name: a VMM still attached
	// loses its link at once, not when the netns is finally freed. (For a
	// session not known, whatever tap its bridge holds.)
	if slot >= 0 && (!known || s.VM != nil) && (!known || !s.Attached) {
		tap := ""
		if known {
			tap = s.VM.Tap
		}
		if err := deleteVMLinks(m.NetnsPath(name), tap); err != nil {
			return fmt.Errorf("delete session %s: %w", name, err)
		}
	}

	// Always, whatever the slot: a session without NIC has no file, and
	// removing none is success.
	if err := m.removeResolvConf(name); err != nil {
		return fmt.Errorf("delete session %s: %w", name, err)
	}
	if err := removeNetns(m.NetnsPath(name)); err != nil {
		return fmt.Errorf("delete session %s: %w", name, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.sessions, name)
	if slot >= 0 {
		m.ipam.Release(slot)
	}
	return nil
}
