package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// errEgressNoneUpdate refuses an update to egress none.
var errEgressNoneUpdate = badRequest(errors.New("egress none: a session's egress cannot change to none (it has a network interface); want egress allowlist with no entries to cut all egress"))

// UpdatePolicy changes a running session's policy: PATCH (replace false)
// adds and revokes entries, PUT (replace true) gives the whole new policy.
// The order, and what a failure at each step leaves:
//
//	validate (create's buildPolicy)       -> nothing changed
//	record with Pending (write-ahead)     -> undo: the old record back
//	rules and DNS: dnsproxy.Update, whose apply is one
//	  netpolicy.UpdateSession batch       -> neither changed
//	cut established flows (conntrack)     -> the new policy holds; the error says so
//	record without Pending
//
// A crash after the write-ahead record is completed by the next start's
// adopt (it re-applies the update), so the restarted daemon enforces the
// old policy (crash before the record) or the new one, never a mix.
func (e *Engine) UpdatePolicy(ctx context.Context, name string, u api.PolicyUpdate, replace bool) (info api.SessionInfo, err error) {
	recorded := false
	defer func() {
		if err != nil && !recorded {
			d := map[string]any{"allow": u.Allow, "scope": stripScopes(u.Scope), "revoke": stripScopes(u.Revoke), "egress": u.Egress, "replace": replace,
				"deny": u.Deny, "revoke_deny": u.RevokeDeny, "on_deny": u.OnDeny, "name_check": u.NameCheck, "quic": u.QUIC}
			e.recordCall(ctx, name, "policy_update_failed", d, err)
		}
	}()
	s, err := e.reserve(name, true)
	if err != nil {
		return info, err
	}
	defer e.release(name)
	cur := max(s.rec.Generation, 1)
	switch {
	case s.rec.Request.Locked && ctx.Value(grantExpiryKey{}) == nil:
		return info, api.Classify(fmt.Errorf("session %q was created with --locked: its policy never changes", name), api.ErrLocked)
	case u.Generation != 0 && u.Generation != cur:
		return info, api.Classify(fmt.Errorf("session %q: policy generation %d is stale (the current one is %d): inspect it and retry", name, u.Generation, cur), api.ErrStaleGeneration)
	case !s.hasNIC():
		return info, badRequest(fmt.Errorf("session %q has egress none and no network interface: its policy cannot change (create a new session)", name))
	}
	now := time.Now()
	ask := grantAsk{allowFor: u.AllowFor, keep: u.KeepEstablished, connections: u.Connections, budget: u.Budget}
	if err := e.checkGrantEntries(u.Allow, ask, ""); err != nil {
		return info, err
	}
	grant, err := newGrant(u.Allow, ask, now)
	if err != nil {
		return info, badRequest(err)
	}
	req, err := e.updatedRequest(s, u, replace)
	if err != nil {
		return info, err
	}
	if req.Egress == string(netpolicy.ModeNone) {
		// Before the policy's own checks: their complaints about what
		// egress none takes would hide the one that matters.
		return info, errEgressNoneUpdate
	}
	if u.EgressBudget > 0 || replace {
		req.EgressBudget = u.EgressBudget
	}
	policy, err := e.buildPolicy(req)
	if err != nil {
		return info, err
	}
	if replace {
		// A replacing update gives the whole policy: no --on-deny is the
		// default, as at create.
		defaultOnDeny(&req, &policy)
	}
	// Stored and shown without the credentials a scope URL may carry.
	req.Scope = stripScopes(req.Scope)
	if policy.Egress == netpolicy.ModeNone {
		return info, errEgressNoneUpdate
	}
	if policy.Egress == netpolicy.ModePublic {
		// The new grant's names, and those of the counted grants in
		// force: public mode would leave their flows uncounted.
		if err := e.checkGrantEntries(u.Allow, ask, policy.Egress); err != nil {
			return info, err
		}
		for _, g := range s.rec.Grants {
			if g.Ended == nil {
				if err := e.checkGrantEntries(g.Entries, grantAsk{connections: g.Connections, budget: g.Budget}, policy.Egress); err != nil {
					return info, err
				}
			}
		}
	}
	peers, err := e.resolvePeers(policy.LabPeers)
	if err != nil {
		return info, err
	}
	pinned := s.rec.Pinned
	if req.Pin {
		// Names already pinned keep their addresses; added names are
		// resolved now; revoked ones are dropped.
		if pinned, err = e.repin(ctx, policy, s.rec.Pinned); err != nil {
			return info, err
		}
	}

	rec := s.rec
	rec.Request, rec.Pinned, rec.Peers = req, pinned, peers
	rec.Generation = cur + 1
	// The grants past their deadline end with this update (the expiry's
	// own, or any other that comes first and finds them due).
	rec.Grants = endDueGrants(s.rec.Grants, now)
	if grant != nil {
		rec.Grants = append(rec.Grants, *grant)
	}
	rec.Updated = &api.PolicyChange{Time: now.UTC()}
	if c, ok := api.CallerFrom(ctx); ok {
		rec.Updated.By = &c
	}
	rec.Pending = &PendingUpdate{Request: s.rec.Request, Pinned: s.rec.Pinned, Peers: s.rec.Peers, KeepEstablished: u.KeepEstablished}
	next := &liveSession{rec: rec, policy: policy}
	next.rules = e.sessionRules(rec, policy, peerGuests(peers))
	upd := nft.SessionUpdate{Old: s.rules, New: next.rules}

	if err := e.state.Save(rec); err != nil {
		return info, fmt.Errorf("update policy of %s: write the record ahead: %w", name, err)
	}
	err = e.dns.Update(e.dnsPolicy(next), func(stale, keep []netpolicy.Attestation, forgotten bool) error {
		upd.Stale, upd.Keep = stale, keep
		if forgotten {
			// The proxy dropped names it could not keep: every attested
			// element no kept name holds is stale, or a forgotten revoked
			// name's addresses would stay allowed.
			all, err := e.attestedElements(s.rec.Guest)
			if err != nil {
				return fmt.Errorf("list the session's attested elements: %w", err)
			}
			upd.Stale = append(upd.Stale, all...)
		}
		// Before the batch: a drop the update causes is not-allowed.
		e.names.forget(name, staleAddrs(stale, keep))
		return e.fw.UpdateSession(upd)
	})
	if err != nil {
		err = fmt.Errorf("update policy of %s: %w", name, err)
		if serr := e.state.Save(s.rec); serr != nil {
			e.log.Error("policy update failed and the old record could not be restored: a restart applies the new policy", "session", name, "err", serr)
			err = errors.Join(err, serr)
		}
		return info, err
	}
	// What follows the batch cannot undo it: a failure is reported with
	// the new policy in force.
	var cutErr error
	cut, aborted := 0, 0
	if !u.KeepEstablished {
		cut, aborted, cutErr = e.cutFlows(rec, upd)
	}
	// After the batch: an added pin is allowed before the sandbox's
	// /etc/hosts names it; a revoked one is dropped before the file
	// forgets it.
	if herr := e.setHosts(rec, s.rec.Pinned); herr != nil && cutErr == nil {
		cutErr = herr
	} else if herr != nil {
		e.log.Error("policy updated", "session", name, "err", herr)
	}
	rec.Pending = nil
	next.rec = rec
	if serr := e.state.Save(rec); serr != nil {
		// The next start re-applies the same update: harmless.
		e.log.Warn("policy updated; clearing its write-ahead mark failed", "session", name, "err", serr)
	}
	e.mu.Lock()
	e.sessions[name] = next
	e.mu.Unlock()
	if ctx.Value(grantExpiryKey{}) == nil {
		// The expiry arms the next deadline itself, after its event.
		e.scheduleGrants(rec)
	}
	detail := map[string]any{
		"generation": rec.Generation, "egress": string(policy.Egress), "allow": entryStrings(policy.Allow),
		"lab_peers": policy.LabPeers, "deny": entryStrings(policy.Deny), "on_deny": onDeny(policy), "replace": replace, "keep_established": u.KeepEstablished,
		"flows_cut": cut, "sockets_aborted": aborted, "attested_removed": len(upd.Stale),
	}
	if len(policy.InboundFromHost) > 0 {
		detail["inbound_from_host"] = inboundStrings(policy.InboundFromHost)
	}
	if grant != nil && grant.hasEnd() {
		detail["grant_deadline"] = grant.Deadline
	}
	if grant != nil && grant.Connections > 0 {
		detail["grant_connections"] = grant.Connections
	}
	if grant != nil && grant.Budget > 0 {
		detail["grant_budget"] = grant.Budget
	}
	if u.EgressBudget > 0 {
		detail["egress_budget"] = u.EgressBudget
	}
	recorded = true
	// A changed budget or a new grant may have limits to reach again.
	e.limitsReached.forget(name)
	e.recordCall(ctx, name, "policy_updated", detail, cutErr)
	if cutErr != nil {
		return e.summary(next), fmt.Errorf("policy of %s updated (generation %d), but: %w", name, rec.Generation, cutErr)
	}
	// The answer is the session without the kernel's reads (as create's):
	// its attested set and counters come from dumps of every session's
	// sets, which would make an update's cost grow with the number of
	// sessions. Inspect has them.
	return e.summary(next), nil
}

// updatedRequest is the session's request with the update's policy
// fields: the whole policy (replace) or the current one with additions and
// revocations. A revocation of an entry the policy lacks is refused.
func (e *Engine) updatedRequest(s *liveSession, u api.PolicyUpdate, replace bool) (api.CreateRequest, error) {
	req := s.rec.Request
	if replace {
		if len(u.RevokeInboundFromHost) > 0 {
			return req, badRequest(errors.New("revoke_inbound_from_host has no meaning when the policy is replaced (PUT, --replace): want the whole new inbound_from_host"))
		}
		req.InboundFromHost = slices.Clone(u.InboundFromHost)
		if len(u.Revoke) > 0 || len(u.RevokeLabPeers) > 0 || len(u.RevokeDeny) > 0 {
			return req, badRequest(errors.New("revoke, revoke_lab_peers and revoke_deny have no meaning when the policy is replaced (PUT, --replace): want the whole new policy"))
		}
		req.Allow, req.Scope, req.LabPeers, req.Egress = slices.Clone(u.Allow), slices.Clone(u.Scope), slices.Clone(u.LabPeers), u.Egress
		req.Deny, req.OnDeny = slices.Clone(u.Deny), u.OnDeny
		// The name check is not one of the entries: absent keeps it.
		if u.NameCheck != "" {
			req.NameCheck = u.NameCheck
		}
		if u.QUIC != "" {
			req.QUIC = u.QUIC
		}
		return req, nil
	}
	req.Deny = append(slices.Clone(req.Deny), u.Deny...)
	if u.OnDeny != "" {
		req.OnDeny = u.OnDeny
	}
	if u.NameCheck != "" {
		req.NameCheck = u.NameCheck
	}
	if u.QUIC != "" {
		req.QUIC = u.QUIC
	}
	for _, r := range u.RevokeDeny {
		ent, err := netpolicy.ParseDenyEntryFor(r, e.guard)
		n := len(req.Deny)
		if err == nil {
			req.Deny = slices.DeleteFunc(req.Deny, func(a string) bool {
				x, err := netpolicy.ParseDenyEntryFor(a, e.guard)
				return err == nil && x.String() == ent.String()
			})
		}
		if len(req.Deny) == n {
			return req, badRequest(fmt.Errorf("revoke deny %q: not a deny entry of session %s's policy (its deny entries: %s)", r, s.rec.Name, listOrNone(entryStrings(s.policy.Deny))))
		}
	}
	req.Allow = append(slices.Clone(req.Allow), u.Allow...)
	req.Scope = append(slices.Clone(req.Scope), u.Scope...)
	req.LabPeers = append(slices.Clone(req.LabPeers), u.LabPeers...)
	if u.Egress != "" {
		req.Egress = u.Egress
	} else {
		req.Egress = string(s.policy.Egress)
	}
	for _, r := range u.Revoke {
		n := len(req.Allow) + len(req.Scope)
		if ent, err := netpolicy.ParseEntry(r, e.guard); err == nil {
			req.Allow = slices.DeleteFunc(req.Allow, func(a string) bool {
				x, err := netpolicy.ParseEntry(a, e.guard)
				return err == nil && x.String() == ent.String()
			})
		}
		if ent, err := netpolicy.ParseScope(r, e.guard); err == nil {
			req.Scope = slices.DeleteFunc(req.Scope, func(a string) bool {
				x, err := netpolicy.ParseScope(a, e.guard)
				return err == nil && x.String() == ent.String()
			})
		}
		if len(req.Allow)+len(req.Scope) == n {
			return req, badRequest(fmt.Errorf("revoke %q: not an entry of session %s's policy (its entries: %s)", r, s.rec.Name, listOrNone(entryStrings(s.policy.Allow))))
		}
	}
	for _, p := range u.RevokeLabPeers {
		if !slices.Contains(req.LabPeers, p) {
			return req, badRequest(fmt.Errorf("revoke lab peer %q: not a lab peer of session %s (its lab peers: %s)", p, s.rec.Name, listOrNone(s.policy.LabPeers)))
		}
		req.LabPeers = slices.DeleteFunc(req.LabPeers, func(x string) bool { return x == p })
	}
	slices.Sort(req.LabPeers)
	req.LabPeers = slices.Compact(req.LabPeers)
	req.InboundFromHost = append(slices.Clone(req.InboundFromHost), u.InboundFromHost...)
	for _, r := range u.RevokeInboundFromHost {
		want, err := netpolicy.ParseInboundPort(r)
		if err != nil {
			return req, badRequest(err)
		}
		n := len(req.InboundFromHost)
		req.InboundFromHost = slices.DeleteFunc(req.InboundFromHost, func(a string) bool {
			x, err := netpolicy.ParseInboundPort(a)
			return err == nil && x == want
		})
		if len(req.InboundFromHost) == n {
			return req, badRequest(fmt.Errorf("revoke inbound from host %q: not a port of session %s's inbound from host (its ports: %s)", r, s.rec.Name, listOrNone(inboundStrings(s.policy.InboundFromHost))))
		}
	}
	return req, nil
}

func listOrNone(ss []string) string {
	if len(ss) == 0 {
		return "none"
	}
	return fmt.Sprint(ss)
}

// repin keeps the pinned addresses of the hosts the new policy still
// names and resolves the hosts it adds.
func (e *Engine) repin(ctx context.Context, p netpolicy.Policy, old map[string][]netip.Addr) (map[string][]netip.Addr, error) {
	var fresh netpolicy.Policy
	out := map[string][]netip.Addr{}
	for _, ent := range p.Allow {
		if as, ok := old[ent.Name]; ok && ent.Kind == netpolicy.KindHost {
			out[ent.Name] = as
			continue
		}
		fresh.Allow = append(fresh.Allow, ent)
	}
	added, err := e.resolvePins(ctx, fresh)
	if err != nil {
		return nil, err
	}
	maps.Copy(out, added)
	return out, nil
}

// finishPending completes an update a crash interrupted (adopt calls it
// for a record with Pending): the kernel may hold the old rules, the new
// ones or (never, one batch) a mix; UpdateSession converges from either.
// What the old policy's names attested is unknown after a restart, so
// every attested element of the session is removed (the new policy's
// names attest again at their next query), and its flows are cut.
func (e *Engine) finishPending(s *liveSession) error {
	p := s.rec.Pending
	oldPolicy, err := e.buildPolicy(p.Request)
	if err != nil {
		return fmt.Errorf("the policy before its interrupted update no longer validates: %v", err)
	}
	oldRec := s.rec
	oldRec.Request, oldRec.Pinned, oldRec.Peers = p.Request, p.Pinned, p.Peers
	upd := nft.SessionUpdate{Old: e.sessionRules(oldRec, oldPolicy, peerGuests(p.Peers)), New: s.rules}
	if all, err := e.attestedElements(s.rec.Guest); err == nil {
		upd.Stale = all
	}
	if err := e.fw.UpdateSession(upd); err != nil {
		return fmt.Errorf("complete its interrupted policy update: %v", err)
	}
	if !p.KeepEstablished {
		if _, _, err := e.cutFlows(s.rec, upd); err != nil {
			e.log.Error("completing an interrupted policy update", "session", s.rec.Name, "err", err)
		}
	}
	if err := e.setHosts(s.rec, p.Pinned); err != nil {
		e.log.Error("completing an interrupted policy update", "session", s.rec.Name, "err", err)
	}
	s.rec.Pending = nil
	if err := e.state.Save(s.rec); err != nil {
		e.log.Warn("completed an interrupted policy update; clearing its mark failed", "session", s.rec.Name, "err", err)
	}
	e.log.Info("completed a policy update interrupted by a restart", "session", s.rec.Name, "generation", s.rec.Generation)
	return nil
}

// cutFlows cuts the flows upd revokes on both sides, in one step: their
// conntrack entries go (the remote end's next packet finds none, and the
// reply direction is dropped), and the guest's TCP sockets of those flows
// are aborted in the session's netns, so a client inside fails at once
// (ECONNABORTED) instead of waiting for its own timeout. An ICMP error
// would not do: to an established Linux socket it is only a soft error.
// It returns how many flows were cut and how many sockets aborted.
func (e *Engine) cutFlows(rec SessionRecord, upd nft.SessionUpdate) (cut, aborted int, err error) {
	flows, err := e.fw.CutFlows(upd)
	if err != nil {
		err = fmt.Errorf("its established flows may survive: %w", err)
	}
	var conns []nsmgr.TCPConn
	for _, f := range flows {
		if f.Proto == unix.IPPROTO_TCP {
			conns = append(conns, nsmgr.TCPConn{Local: f.Src, Remote: f.Dst})
		}
	}
	aborted, aerr := e.nets.AbortTCP(rec.NetnsPath, conns)
	if aerr != nil {
		aerr = fmt.Errorf("the guest's sockets of its cut flows may wait for their own timeout: %w", aerr)
	}
	return len(flows), aborted, errors.Join(err, aerr)
}

// attestedElements returns every attested element the kernel holds for
// guest, one attestation each.
func (e *Engine) attestedElements(guest netip.Addr) ([]netpolicy.Attestation, error) {
	att, err := e.fw.Attested(guest)
	if err != nil {
		return nil, err
	}
	out := make([]netpolicy.Attestation, 0, len(att))
	for _, a := range att {
		st := netpolicy.Attestation{Addrs: []netip.Addr{a.IP}}
		if a.Port != 0 {
			st.Ports = []netpolicy.PortSpec{{Port: a.Port, Proto: a.Proto}}
		}
		out = append(out, st)
	}
	return out, nil
}

// setHosts rewrites the /etc/hosts of rec's sandbox when its pinned names
// differ from old's.
func (e *Engine) setHosts(rec SessionRecord, old map[string][]netip.Addr) error {
	if !rec.Sandbox || maps.EqualFunc(rec.Pinned, old, slices.Equal) {
		return nil
	}
	if err := e.boxes.SetHosts(rec.Name, rec.Pinned); err != nil {
		return fmt.Errorf("its sandbox's /etc/hosts still names the old pinned addresses: %w", err)
	}
	return nil
}

// staleAddrs returns the addresses of stale that no kept attestation holds.
func staleAddrs(stale, keep []netpolicy.Attestation) []netip.Addr {
	kept := map[netip.Addr]bool{}
	for _, k := range keep {
		for _, a := range k.Addrs {
			kept[a] = true
		}
	}
	var out []netip.Addr
	for _, st := range stale {
		for _, a := range st.Addrs {
			if !kept[a] {
				out = append(out, a)
			}
		}
	}
	return out
}
