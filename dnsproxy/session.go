package dnsproxy

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// SessionPolicy is what the proxy needs to answer one session's queries.
//
// Guest is the session's guest address: the source address its queries
// arrive from. Allow holds the session's allow entries (name entries are
// matched, CIDR entries are ignored: the firewall enforces them). Pinned maps
// a name to the addresses resolved once at session create: such names are
// answered from these addresses without an upstream.
type SessionPolicy struct {
	Name   string
	Guest  netip.Addr
	Mode   netpolicy.Mode
	Allow  []netpolicy.Entry
	Pinned map[string][]netip.Addr
}

// compiledSession is an immutable, ready-to-match form of a SessionPolicy.
type compiledSession struct {
	name   string
	guest  netip.Addr
	mode   netpolicy.Mode
	match  *matcher
	pinned map[string][]netip.Addr // key: lower-case, no trailing dot
}

// sessionMap is an immutable snapshot: it is never modified after it has
// been published through Proxy.sessions.
type sessionMap = map[netip.Addr]*compiledSession

// ErrBadSession is wrapped by Register for a policy it cannot accept.
var ErrBadSession = errors.New("bad session policy")

func compile(sp SessionPolicy) (*compiledSession, error) {
	if !sp.Guest.Is4() {
		return nil, fmt.Errorf("register session %q: guest address %q: %w: want an IPv4 address", sp.Name, sp.Guest, ErrBadSession)
	}
	switch sp.Mode {
	case netpolicy.ModeNone, netpolicy.ModeAllowlist, netpolicy.ModePublic:
	default:
		return nil, fmt.Errorf("register session %q: mode %v: %w: want none, allowlist or public", sp.Name, sp.Mode, ErrBadSession)
	}
	m, err := newMatcher(sp.Allow)
	if err != nil {
		return nil, fmt.Errorf("register session %q: %w: %w", sp.Name, ErrBadSession, err)
	}
	cs := &compiledSession{name: sp.Name, guest: sp.Guest, mode: sp.Mode, match: m}
	if len(sp.Pinned) > 0 {
		cs.pinned = make(map[string][]netip.Addr, len(sp.Pinned))
		for name, addrs := range sp.Pinned {
			n, err := netpolicy.NormalizeName(name)
			if err != nil {
				return nil, fmt.Errorf("register session %q: pinned name %q: %w: %w", sp.Name, name, ErrBadSession, err)
			}
			var v4 []netip.Addr
			for _, a := range addrs {
				a = a.Unmap()
				if !a.Is4() {
					return nil, fmt.Errorf("register session %q: pinned address %q for %s: %w: want IPv4", sp.Name, a, name, ErrBadSession)
				}
				v4 = append(v4, a)
			}
			cs.pinned[n] = append(cs.pinned[n], v4...)
		}
	}
	return cs, nil
}

// Register adds the session, or replaces the policy of the session with the
// same guest address. The new policy applies to queries that arrive after
// Register returns.
func (p *Proxy) Register(sp SessionPolicy) error {
	cs, err := compile(sp)
	if err != nil {
		return err
	}
	p.sessionsMu.Lock()
	defer p.sessionsMu.Unlock()
	old := *p.sessions.Load()
	next := make(sessionMap, len(old)+1)
	maps.Copy(next, old)
	next[cs.guest] = cs
	p.sessions.Store(&next)
	p.log.Debug("dnsproxy: session registered", "session", cs.name, "guest", cs.guest, "mode", sp.Mode)
	return nil
}

// Unregister removes the session with this guest address. Removing an
// unknown session is not an error.
func (p *Proxy) Unregister(guest netip.Addr) {
	p.sessionsMu.Lock()
	defer p.sessionsMu.Unlock()
	old := *p.sessions.Load()
	if _, ok := old[guest]; !ok {
		return
	}
	next := make(sessionMap, len(old))
	for k, v := range old {
		if k != guest {
			next[k] = v
		}
	}
	p.sessions.Store(&next)
	p.log.Debug("dnsproxy: session unregistered", "guest", guest)
}

// session returns the session whose guest address is src, or nil. It takes
// no lock.
func (p *Proxy) session(src netip.Addr) *compiledSession {
	return (*p.sessions.Load())[src.Unmap()]
}
