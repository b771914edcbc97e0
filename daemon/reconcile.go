package daemon

import (
	"fmt"
	"net/netip"

	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Reconcile re-adopts every session whose record, kernel objects and
// sandbox survived, and reaps everything partial or orphaned (one log line
// each). It never flushes the table: adopted sessions keep their attested
// elements.
func (e *Engine) Reconcile() error {
	recs, bad, err := e.state.LoadAllReport()
	if err != nil {
		return err
	}
	for _, b := range bad {
		// Its kernel objects, if any, are reaped below as orphans.
		e.log.Error("skipped a state record that does not load (a bad record is kept as file, never loaded again)", "file", b.Path, "session", b.Name, "reason", b.Err)
	}
	found, err := e.nets.Recover()
	if err != nil {
		return err
	}
	nets := map[string]nsmgr.Session{}
	for _, s := range found {
		nets[s.Name] = s
	}
	keys, err := e.fw.Sessions()
	if err != nil {
		return err
	}
	inTable := map[netip.Addr]bool{}
	for _, k := range keys {
		inTable[k.Guest] = true
	}
	// Lab targets first, so their peers can resolve them.
	sortLabFirst(recs)
	for _, rec := range recs {
		why := e.missingPart(rec, nets, inTable)
		if why == "" {
			if err := e.adopt(rec); err != nil {
				why = err.Error()
			}
		}
		if why != "" {
			e.log.Warn("reaping partial session", "session", rec.Name, "reason", why)
			e.lifecycle(rec.Name, "reaped", map[string]any{"reason": why})
			if err := e.teardown(rec, nft.SessionRules{Name: rec.Name, HostIface: rec.HostIface, Guest: rec.Guest}); err != nil {
				e.log.Error("reap partial session", "session", rec.Name, "err", err)
			}
			continue
		}
		e.log.Info("re-adopted session", "session", rec.Name, "guest", addrString(rec.Guest))
	}
	keep := map[string]bool{}
	adopted := map[netip.Addr]bool{}
	for name, s := range e.sessions {
		keep[name] = true
		adopted[s.rec.Guest] = true
	}
	removed, err := e.nets.Reap(keep)
	for _, r := range removed {
		e.log.Warn("reaped orphaned network object", "object", r)
	}
	if err != nil {
		e.log.Error("reap networks", "err", err)
	}
	// Only now: the reap above removes prepared netns it does not own.
	e.nets.StartPrepared()
	boxes, err := e.boxes.Reap(keep)
	for _, r := range boxes {
		e.log.Warn("reaped orphaned sandbox", "sandbox", r)
	}
	if err != nil {
		e.log.Error("reap sandboxes", "err", err)
	}
	e.adoptExecs()
	for _, k := range keys {
		if !adopted[k.Guest] {
			e.log.Warn("reaping orphaned rules", "guest", k.Guest.String(), "iface", k.HostIface)
		}
	}
	// Everything keyed by a pool address that is no live session's goes,
	// not only what the sessions set names: attested elements and
	// conntrack entries a session left behind (a crash mid-removal) would
	// otherwise serve the next session on the address.
	// The removed sessions' events past their retention go; the adopted
	// ones' stay whatever their age.
	e.events.Prune()
	flows, err := e.fw.PruneGuests(func(g netip.Addr) bool { return e.nets.IsGuestAddr(g) && !adopted[g] })
	if err != nil {
		e.log.Error("prune orphaned rules and flows", "err", err)
	} else if flows > 0 {
		e.log.Warn("reaped orphaned flows", "conntrack_entries", flows)
	}
	return nil
}

// missingPart names the part of a recorded session that is gone ("its
// netns is gone"), or "" when every part survived.
func (e *Engine) missingPart(rec SessionRecord, nets map[string]nsmgr.Session, inTable map[netip.Addr]bool) string {
	n, ok := nets[rec.Name]
	switch {
	case !ok:
		return "its netns is gone"
	case rec.Slot >= 0 && n.Slot != rec.Slot:
		return fmt.Sprintf("its host veth for slot %d is gone", rec.Slot)
	case rec.Slot >= 0 && !inTable[rec.Guest]:
		return "its rules are gone from the nftables table"
	case rec.Sandbox && !e.boxes.Exists(rec.Name):
		return "its sandbox is gone"
	}
	return ""
}

// adopt rebuilds a surviving session's in-memory state, re-applies its
// static rules (idempotent) and registers it with the DNS proxy. Its error
// says why the session cannot be kept.
func (e *Engine) adopt(rec SessionRecord) error {
	p, err := e.buildPolicy(rec.Request)
	if err != nil {
		return fmt.Errorf("its recorded policy no longer validates: %v", err)
	}
	s := &liveSession{rec: rec, policy: p}
	if rec.Slot >= 0 {
		// A lab target deleted while this session lived took its peering
		// with it (RemoveSession removes the elements pointing at it); a new
		// session that reused its name or address is not the one named.
		peers := peerGuests(e.livePeers(rec.Name, rec.Peers))
		s.rules = e.sessionRules(rec, p, peers)
		if err := e.fw.AddSession(s.rules); err != nil {
			return fmt.Errorf("re-apply rules: %v", err)
		}
		e.seedLimitsReached(rec, p)
		if rec.Pending != nil {
			if err := e.finishPending(s); err != nil {
				return err
			}
		}
		if err := e.dns.Register(e.dnsPolicy(s)); err != nil {
			return fmt.Errorf("register with the dns proxy: %v", err)
		}
		// A VM guest renewing while the daemon was down gets its lease
		// from here on.
		if err := e.startLease(rec); err != nil {
			return err
		}
	}
	e.mu.Lock()
	e.addSessionLocked(s)
	e.mu.Unlock()
	e.events.Load(rec.Name, rec.Request.Labels)
	e.lifecycle(rec.Name, "adopted", nil)
	// A deadline passed while the daemon was down ends its grant now.
	e.scheduleGrants(rec)
	return nil
}

func sortLabFirst(recs []SessionRecord) {
	lab := func(r SessionRecord) int {
		if r.Request.Lab {
			return 0
		}
		return 1
	}
	for i := 1; i < len(recs); i++ {
		for j := i; j > 0 && lab(recs[j]) < lab(recs[j-1]); j-- {
			recs[j], recs[j-1] = recs[j-1], recs[j]
		}
	}
}
