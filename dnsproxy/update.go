package dnsproxy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// attestLog records, for one session, the addresses each name's answers
// attested and the ports they were attested with, so that an update can
// tell which attested elements its new policy no longer justifies (and
// which another still-allowed name justifies too). It outlives the
// registration it was made under: an update hands the kept part to the new
// one. It may remember more than the kernel holds (expired elements; the
// firewall's removal tolerates them) and is bounded: past attestLogMax
// addresses the names attested longest ago are forgotten, and forgot says
// so: the next update's apply is told, and must treat every attested
// element of the session that no kept name holds as stale.
//
// mu protects everything below it.
type attestLog struct {
	mu     sync.Mutex
	seq    uint64
	size   int
	forgot bool                    // a name was dropped to stay within attestLogMax
	byName map[string]*nameAttests // key: lower-case, no trailing dot
}

// nameAttests is what one name attested under the current registration.
type nameAttests struct {
	addrs map[netip.Addr]bool
	ports []netpolicy.PortSpec // nil: every port
	last  uint64               // attestLog.seq at the latest note
}

const attestLogMax = 8192

func newAttestLog() *attestLog { return &attestLog{byName: map[string]*nameAttests{}} }

// note records an answer's attested addresses for name (called after the
// kernel acknowledged them).
func (l *attestLog) note(name string, addrs []netip.Addr, ports []netpolicy.PortSpec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	na := l.byName[name]
	if na == nil {
		na = &nameAttests{addrs: map[netip.Addr]bool{}, ports: slices.Clone(ports)}
		l.byName[name] = na
	}
	na.last = l.seq
	for _, a := range addrs {
		if a = a.Unmap(); !na.addrs[a] {
			na.addrs[a] = true
			l.size++
		}
	}
	for l.size > attestLogMax && len(l.byName) > 1 {
		oldest, at := "", ^uint64(0)
		for n, x := range l.byName {
			if x.last < at && n != name {
				oldest, at = n, x.last
			}
		}
		l.size -= len(l.byName[oldest].addrs)
		delete(l.byName, oldest)
		l.forgot = true
	}
}

func (na *nameAttests) attestation() netpolicy.Attestation {
	a := netpolicy.Attestation{Ports: slices.Clone(na.ports)}
	for ip := range na.addrs {
		a.Addrs = append(a.Addrs, ip)
	}
	slices.SortFunc(a.Addrs, netip.Addr.Compare)
	return a
}

// split divides the log between the names the compiled policy cs still
// allows with the same ports (kept, returned as a new log for cs) and the
// others (stale), and says whether the log forgot names. A name cs pins is
// stale: its pinned addresses are static. The kept log has forgotten
// nothing: after the update the kernel holds no attested element it lacks.
func (l *attestLog) split(cs *compiledSession) (kept *attestLog, keep, stale []netpolicy.Attestation, forgot bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	forgot = l.forgot
	kept = newAttestLog()
	kept.seq = l.seq
	names := make([]string, 0, len(l.byName))
	for n := range l.byName {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		na := l.byName[n]
		if stillAllowed(cs, n, na.ports) {
			kept.byName[n] = na
			kept.size += len(na.addrs)
			keep = append(keep, na.attestation())
		} else {
			stale = append(stale, na.attestation())
		}
	}
	return kept, keep, stale, forgot
}

func stillAllowed(cs *compiledSession, name string, ports []netpolicy.PortSpec) bool {
	if _, pinned := cs.pinned[name]; pinned || cs.deniedName(name) {
		return false
	}
	switch cs.mode {
	case netpolicy.ModePublic:
		return true
	case netpolicy.ModeAllowlist:
		ok, pp, _ := cs.match.match(name)
		return ok && slices.Equal(pp, ports)
	}
	return false
}

// Update replaces the policy of the registered session with sp's guest
// address, as one step for both the proxy and the kernel: apply is called
// with the attestations the new policy no longer justifies (stale) and
// those it still does (keep), and must make the kernel enforce the new
// policy (netpolicy's UpdateSession). forgotten says the session's log
// dropped names it could not keep: the kernel may hold attested elements
// of names in neither list, and apply must then remove every attested
// element of the session that no kept attestation holds. While apply runs, nothing is attested
// for the session (an attest in progress is waited for first, new ones
// wait), so every attested element apply sees is in stale or keep. If
// apply fails, the old registration goes on exactly as before and Update
// returns apply's error. Otherwise the new policy's snapshot is published
// in one swap, and the old registration ends as in Unregister: its queries
// still in flight get SERVFAIL and attest nothing. So a query is judged by
// the old policy (attested before the update), by the new one (arrived
// after it), or fails; it is never attested under a policy no longer in
// force.
//
// A policy that does not compile, or a guest that is not registered,
// changes nothing and apply is not called.
func (p *Proxy) Update(sp SessionPolicy, apply func(stale, keep []netpolicy.Attestation, forgotten bool) error) error {
	cs, err := compile(sp)
	if err != nil {
		return err
	}
	// Only one Register, Unregister or Update of a guest at a time: the
	// daemon serialises operations per session name; sessionsMu is not held
	// across apply, so other sessions' registrations are not held up.
	prev := p.session(cs.guest)
	if prev == nil {
		return fmt.Errorf("update session %q: guest %s is not registered", sp.Name, cs.guest)
	}
	prev.mu.Lock() // waits for an attest in progress; new ones wait for us
	if prev.gone {
		prev.mu.Unlock()
		return fmt.Errorf("update session %q: guest %s was unregistered meanwhile", sp.Name, cs.guest)
	}
	log := prev.attests
	if log == nil {
		log = newAttestLog()
	}
	kept, keep, stale, forgot := log.split(cs)
	if err := apply(stale, keep, forgot); err != nil {
		prev.mu.Unlock()
		return err
	}
	cs.attests = kept
	cs.ctx, cs.cancel = context.WithCancel(p.ctx)
	p.sessionsMu.Lock()
	p.sessions.put(cs)
	p.sessionsMu.Unlock()
	prev.gone = true
	prev.mu.Unlock()
	prev.cancel()
	p.log.Debug("dnsproxy: session policy updated", "session", cs.name, "guest", cs.guest, "mode", sp.Mode,
		"stale", len(stale), "kept", len(keep))
	return nil
}
