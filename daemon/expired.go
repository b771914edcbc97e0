package daemon

import (
	"net/netip"
	"strings"
	"sync"

	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// ReasonExpired is the reason of a dropped flow (an event's detail.reason,
// and session why) to an address a DNS answer attested for the session and
// whose attestation has since expired: the session connected after the
// answer's lifetime (and the refresh, if any) ran out, so it must resolve
// the name again. The kernel counts such a drop as not-allowed (it cannot
// tell them apart), and so do the per-reason counters: they are the
// kernel's exact counts.
const ReasonExpired = "expired"

// attestNames remembers, per session, the name whose answer last attested
// each address and the type of the record that carried it (A, or HTTPS
// and SVCB for an ipv4hint), so a later drop to the address can name it
// and session why can say which name's record opened it. Each session
// holds at most max addresses (the per-session cap on attested elements):
// a full session forgets an arbitrary address for each new one. mu guards
// bySession.
type attestNames struct {
	max int

	mu        sync.Mutex
	bySession map[string]map[netip.Addr]attestedBy
}

// attestedBy is the question whose answer attested an address.
type attestedBy struct {
	name  string // as policies write names (no trailing dot)
	qtype string // the question's type: A, HTTPS, SVCB
}

// remember notes that the answer to name (of type qtype) attested addrs
// for session.
func (n *attestNames) remember(session, name, qtype string, addrs []netip.Addr) {
	name = strings.TrimSuffix(name, ".") // as policies write names
	if session == "" || name == "" || len(addrs) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.bySession == nil {
		n.bySession = map[string]map[netip.Addr]attestedBy{}
	}
	m := n.bySession[session]
	if m == nil {
		m = map[netip.Addr]attestedBy{}
		n.bySession[session] = m
	}
	limit := n.max
	if limit <= 0 {
		limit = nft.DefaultMaxAttested
	}
	for _, a := range addrs {
		a = a.Unmap()
		if _, ok := m[a]; !ok && len(m) >= limit {
			for old := range m {
				delete(m, old)
				break
			}
		}
		m[a] = attestedBy{name: name, qtype: qtype}
	}
}

// lookup returns the name that last attested a for session.
func (n *attestNames) lookup(session string, a netip.Addr) (string, bool) {
	by, ok := n.lookupRecord(session, a)
	return by.name, ok
}

// lookupRecord returns the question whose answer last attested a for
// session.
func (n *attestNames) lookupRecord(session string, a netip.Addr) (attestedBy, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	by, ok := n.bySession[session][a.Unmap()]
	return by, ok
}

// forget drops addrs of session (an update revoked what attested them):
// a drop to one of them is not-allowed, not expired.
func (n *attestNames) forget(session string, addrs []netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.bySession[session]
	for _, a := range addrs {
		delete(m, a.Unmap())
	}
}

// drop forgets the session (it was deleted).
func (n *attestNames) drop(session string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.bySession, session)
}
