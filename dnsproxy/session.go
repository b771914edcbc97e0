package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// SessionPolicy is what the proxy needs to answer one session's queries.
//
// Guest is the session's guest address: the source address its queries
// arrive from. Allow holds the session's allow entries (name entries are
// matched, CIDR entries are ignored: the firewall enforces them). Pinned maps
// a name to the addresses resolved once at session create: such names are
// answered from these addresses without an upstream, and attested nothing:
// the caller must have put them in the session's static sets with their
// entry's port constraint (netpolicy.StaticTargets), so that a pinned
// answer opens exactly what the entry allows.
type SessionPolicy struct {
	Name   string
	Guest  netip.Addr
	Mode   netpolicy.Mode
	Allow  []netpolicy.Entry
	Pinned map[string][]netip.Addr
	// Deny wins over Allow and Pinned in every mode: a name a deny entry
	// matches (the question, or a CNAME target of the answer) is answered
	// NXDOMAIN, the question never sent upstream; an address a port-less
	// deny entry covers is removed from every answer and never attested.
	Deny []netpolicy.Entry
	// KeepECH leaves the ech parameter of SVCB and HTTPS answers in place:
	// for a session whose flows' names are not checked (--name-check off).
	// By default it is removed, so clients send the name in the clear.
	KeepECH bool
	// Guest6 is a dual-stack session's IPv6 address (invalid: IPv4-only):
	// its queries from there are this session's too.
	Guest6 netip.Addr
	// AAAA keeps the AAAA records and ipv6hints of allowed answers,
	// attested into the session's v6 set before release exactly like A
	// (a dual-stack session: the name check reads its v6 flows as its
	// v4 ones). Without it they are emptied, as on every IPv4-only
	// session.
	AAAA bool
}

// compiledSession is one registration: a ready-to-match form of a
// SessionPolicy (immutable) and the state that ends it.
//
// A query holds its session across the upstream wait, so a registration
// can end while its queries are in flight. Invariant: once retire has
// returned, no Attest for this registration is in progress or will start.
// The answer path holds mu for reading around "not gone, then Attest";
// retire cancels ctx (ending the upstream waits at once) and then takes mu
// for writing to set gone, so it waits only for attests already in
// progress, never for an upstream.
type compiledSession struct {
	name    string
	guest   netip.Addr
	guest6  netip.Addr // SessionPolicy.Guest6
	aaaa    bool       // SessionPolicy.AAAA
	mode    netpolicy.Mode
	match   *matcher
	pinned  map[string][]netip.Addr // key: lower-case, no trailing dot
	deny    *matcher                // the deny entries' names
	denied  []netip.Prefix          // the port-less deny entries' CIDRs
	keepECH bool                    // SessionPolicy.KeepECH

	// ctx is the context the session's upstream waits run in; it descends
	// from the proxy's (so Shutdown ends it too) and retire cancels it.
	ctx    context.Context
	cancel context.CancelFunc

	mu   sync.RWMutex // protects gone; see the invariant above
	gone bool

	// attests is what the session's answers attested, by name (see
	// attestLog); an Update hands its kept part to the next registration.
	attests *attestLog
}

// ErrSessionGone is wrapped by the error recorded in an Event when the
// query's session was unregistered (or replaced) while the query was in
// flight: the answer became SERVFAIL and nothing was attested.
var ErrSessionGone = errors.New("session unregistered while its query was in flight")

// retire ends the registration: its upstream waits are cancelled, and once
// retire returns nothing is ever attested for it.
func (cs *compiledSession) retire() {
	cs.cancel()
	cs.mu.Lock()
	cs.gone = true
	cs.mu.Unlock()
}

// sessionMap is an immutable snapshot of one shard of Proxy.sessions: it
// is never modified after it has been published.
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
	var names []netpolicy.Entry
	var denied []netip.Prefix
	for _, e := range sp.Deny {
		switch {
		case e.Kind != netpolicy.KindCIDR:
			names = append(names, e)
		case e.Port == 0:
			denied = append(denied, e.Prefix)
		}
	}
	dm, err := newMatcher(names)
	if err != nil {
		return nil, fmt.Errorf("register session %q: %w: deny: %w", sp.Name, ErrBadSession, err)
	}
	cs := &compiledSession{name: sp.Name, guest: sp.Guest, mode: sp.Mode, match: m, deny: dm, denied: denied, keepECH: sp.KeepECH, guest6: sp.Guest6, aaaa: sp.AAAA && sp.Guest6.IsValid()}
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
// Register returns. A replaced registration ends as in Unregister: its
// queries in flight get SERVFAIL and nothing more is attested for them.
func (p *Proxy) Register(sp SessionPolicy) error {
	cs, err := compile(sp)
	if err != nil {
		return err
	}
	cs.ctx, cs.cancel = context.WithCancel(p.ctx)
	cs.attests = newAttestLog()
	p.sessionsMu.Lock()
	prev := p.sessions.put(cs)
	p.sessionsMu.Unlock()
	if prev != nil {
		prev.retire()
	}
	p.log.Debug("dnsproxy: session registered", "session", cs.name, "guest", cs.guest, "mode", sp.Mode, "replaced", prev != nil)
	return nil
}

// Unregister removes the session with this guest address. Once it returns,
// nothing is ever attested for that registration: its queries waiting for
// an upstream are cancelled (they get SERVFAIL), and an attest already in
// progress is waited for (it takes about a kernel round trip; Unregister
// never waits for an upstream). Removing an unknown session is not an
// error. The caller removes the session's firewall elements after it.
func (p *Proxy) Unregister(guest netip.Addr) {
	p.sessionsMu.Lock()
	prev := p.sessions.remove(guest)
	p.sessionsMu.Unlock()
	if prev == nil {
		return
	}
	// Outside sessionsMu: waiting for an attest in progress must not hold
	// up other sessions' Register and Unregister.
	prev.retire()
	p.log.Debug("dnsproxy: session unregistered", "guest", guest)
}

// session returns the session whose guest address is src, or nil. It takes
// no lock.
func (p *Proxy) session(src netip.Addr) *compiledSession {
	return p.sessions.get(src.Unmap())
}

// deniedName reports whether a deny entry matches qname.
func (cs *compiledSession) deniedName(qname string) bool {
	ok, _, _ := cs.deny.match(qname)
	return ok
}

// deniedAddr reports whether a port-less deny entry covers a.
func (cs *compiledSession) deniedAddr(a netip.Addr) bool {
	for _, p := range cs.denied {
		if p.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}
