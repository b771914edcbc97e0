package nsmgr

import (
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
)

// Retiring an attached session's veth. Deleting a veth holds the kernel's
// network lock through a synchronize and then waits for an RCU barrier
// (~35 ms on a quiet machine), which a CNI DEL paid in full. Delete instead
// takes the host side down, which is enough for no packet to pass either
// way (a veth drops what it would hand to a peer that is down, and taking
// the host side down removes the routes to the /30 and the gateway's local
// address), and deletes the pair on a goroutine of its own with a netlink
// socket of its own (the shared one would hold every other request behind
// the delete). Until the kernel has really removed it:
//   - its slot stays quarantined: Delete releases it as dirty, and a dirty
//     slot is handed out only once LinkByName no longer finds its host
//     veth (allocateLocked), so the slot's host interface name is never
//     met twice;
//   - an Attach into the netns that still holds its guest side waits for
//     the delete to finish (waitRetired), so a DEL followed at once by an
//     ADD with the same netns and interface name gets the name free;
//   - Close waits for it;
//   - after a crash (kill -9) the host side is still there, down, with its
//     owner alias: Recover sees a session with no record and Reap deletes
//     it, or, when a re-ADD reused the session name, Reap deletes it as
//     the stale one of two veths claiming the session (the older ifindex).

// retireWait bounds how long an Attach waits for the retiring veths in its
// netns: far beyond any delete the kernel completes (a delete that takes
// longer is stuck, and the Attach is refused as if the name were taken).
const retireWait = 10 * time.Second

// retireLink deletes the host veth link (already down) in the background and
// returns at once. After Close it deletes synchronously.
func (m *Manager) retireLink(link netlink.Link) error {
	idx := link.Attrs().Index
	done := make(chan struct{})
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return m.deleteRetired(link)
	}
	if m.retiring[idx] != nil {
		m.mu.Unlock()
		return nil // (a second Delete: its delete is in flight)
	}
	m.retiring[idx] = done
	m.retireWG.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.retireWG.Done()
		err := m.deleteRetired(link)
		m.mu.Lock()
		delete(m.retiring, idx)
		m.mu.Unlock()
		close(done)
		if err != nil && m.cfg.RetireFailed != nil {
			m.cfg.RetireFailed(err)
		}
	}()
	return nil
}

// deleteRetired deletes link by its ifindex through a netlink socket of its
// own in the host netns; gone already is success.
func (m *Manager) deleteRetired(link netlink.Link) error {
	h, err := handleIn(m.cfg.HostNS)
	if err != nil {
		return fmt.Errorf("delete link %s: %w", link.Attrs().Name, err)
	}
	defer h.Close()
	if err := h.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete link %s: %w", link.Attrs().Name, err)
	}
	return nil
}

// retiringDone returns the channel closed when the background delete of
// the host veth with ifindex idx finishes; nil when none is in flight.
func (m *Manager) retiringDone(idx int) <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.retiring[idx]
}

// waitRetiring waits for every background delete in flight (Close).
func (m *Manager) waitRetiring() { m.retireWG.Wait() }
