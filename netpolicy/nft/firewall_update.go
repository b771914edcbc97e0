package nft

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/internal/nfnetlink"
	"github.com/enforcerd/enforcerd/netpolicy"
)

// SessionUpdate is one change of a running session's rules: the rules it
// was added (or last updated) with, the rules it gets, and the attestations
// the new policy no longer justifies (Stale) and those it still does
// (Keep). An element of a stale attestation that a kept one holds as well
// stays: another still-allowed name attested the same address.
//
// Old and New must name the same session (Name, HostIface, Guest) and
// neither may be ModeNone: whether a session has an interface is decided at
// create.
type SessionUpdate struct {
	Old, New    SessionRules
	Stale, Keep []netpolicy.Attestation
}

func (u SessionUpdate) check(f *Firewall) error {
	if u.Old.HostIface != u.New.HostIface || u.Old.Guest != u.New.Guest {
		return fmt.Errorf("old rules (%s, %s) and new rules (%s, %s) name different sessions",
			u.Old.HostIface, u.Old.Guest, u.New.HostIface, u.New.Guest)
	}
	for _, r := range []SessionRules{u.Old, u.New} {
		if r.Egress == netpolicy.ModeNone {
			return fmt.Errorf("egress none: a session's egress cannot change to or from none")
		}
		if err := f.checkRules(r); err != nil {
			return err
		}
	}
	return nil
}

// elemID is one element's identity in a set: its key and, in an interval
// set, its key end.
type elemID struct{ set, key, end string }

func idOf(set string, e nftables.SetElement) elemID {
	return elemID{set, string(e.Key), string(e.KeyEnd)}
}

// updatePlan is the pure part of an update: the elements of Old that New
// lacks (del), those of New that Old lacks (add), and the stale attested
// elements no kept attestation holds (unattest). Elements both hold (the
// session's interface, address and counters among them) are not touched.
type updatePlan struct {
	del, add, unattest []setElems
}

func (f *Firewall) planUpdate(u SessionUpdate) updatePlan {
	oldEls, newEls := f.allSessionElements(u.Old), f.allSessionElements(u.New)
	in := func(plan []setElems) map[elemID]bool {
		m := map[elemID]bool{}
		for _, se := range plan {
			for _, e := range se.elems {
				m[idOf(se.set, e)] = true
			}
		}
		return m
	}
	oldIDs, newIDs := in(oldEls), in(newEls)
	minus := func(plan []setElems, other map[elemID]bool, forDelete bool) []setElems {
		var out []setElems
		for _, se := range plan {
			var elems []nftables.SetElement
			for _, e := range se.elems {
				if other[idOf(se.set, e)] {
					continue
				}
				if forDelete {
					e = nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd} // a delete names the key only
				}
				elems = append(elems, e)
			}
			if len(elems) > 0 {
				out = append(out, setElems{se.set, elems})
			}
		}
		return out
	}
	p := updatePlan{del: minus(oldEls, newIDs, true), add: minus(newEls, oldIDs, false)}
	kept := map[elemID]bool{}
	for _, a := range u.Keep {
		for _, se := range f.allAttestElements(u.New.Guest, a) {
			for _, e := range se.elems {
				kept[idOf(se.set, e)] = true
			}
		}
	}
	seen := map[elemID]bool{}
	bySet := map[string][]nftables.SetElement{}
	var order []string
	for _, a := range u.Stale {
		for _, se := range f.allAttestElements(u.New.Guest, a) {
			for _, e := range se.elems {
				id := idOf(se.set, e)
				if kept[id] || seen[id] {
					continue
				}
				seen[id] = true
				if _, ok := bySet[se.set]; !ok {
					order = append(order, se.set)
				}
				bySet[se.set] = append(bySet[se.set], nftables.SetElement{Key: e.Key})
			}
		}
	}
	for _, s := range order {
		p.unattest = append(p.unattest, setElems{s, bySet[s]})
	}
	return p
}

// allSessionElements are every element AddSession inserts for r: the v4
// ones and, on a dual-stack daemon, the v6 ones (sessionElements6).
func (f *Firewall) allSessionElements(r SessionRules) []setElems {
	return append(sessionElements(r), f.sessionElements6(r)...)
}

// allAttestElements are the elements an attestation of the guest put in
// the kernel: its IPv4 addresses' and, on a dual-stack daemon, its IPv6
// addresses' (an AAAA answer's, keyed by the guest's v6 address).
func (f *Firewall) allAttestElements(guest netip.Addr, a netpolicy.Attestation) []setElems {
	out := attestElements(guest, a.Addrs, 0, a.Ports)
	if g6 := f.guest6Of(guest); g6.IsValid() {
		out = append(out, attestElements6(g6, a.Addrs, 0, a.Ports)...)
	}
	return out
}

// UpdateSession changes a running session's elements from u.Old to u.New
// and removes the attested elements u.Stale names (unless u.Keep holds
// them too), in one batch: until the kernel applies it the old policy holds
// in full, after it the new one, never a mix: on a dual-stack daemon the
// batch holds the session's v6 elements too (static6*, public6, denied6,
// reject6, reset6, the name check's, and the stale attested6 elements of
// revoked names), so neither family changes without the other. It changes nothing of another
// session. New connections to what was revoked are dropped as soon as it
// returns; established ones are CutFlows' business.
//
// Attested elements may have expired meanwhile, so each is added and then
// deleted in the batch (an add of an existing key is a no-op), and the
// delete never meets a missing element. When the by-key batch fails for a
// missing element of u.Old (the kernel already holds u.New: an update
// re-applied after a restart), the guest's policy elements are dumped and
// the difference to u.New deleted instead, so UpdateSession converges from
// u.Old, from u.New, or from any state in between. The attested-element
// index may keep the removed elements until their expiry: it may hold more
// than the kernel, never less.
func (f *Firewall) UpdateSession(u SessionUpdate) error {
	if err := u.check(f); err != nil {
		return fmt.Errorf("update session %s: %w", u.New.Name, err)
	}
	if err := u.New.Limits.check(f.dualStack()); err != nil {
		return fmt.Errorf("update session %s: %w", u.New.Name, err)
	}
	plan := f.planUpdate(u)
	if len(plan.del)+len(plan.add)+len(plan.unattest) == 0 && reflect.DeepEqual(u.Old.Limits, u.New.Limits) {
		return nil
	}
	// Before the batch: from now on the sweep deletes any live copy of a
	// stale element, one a packet in flight created again after the
	// batch's delete included. Nothing of the guest is known from now on
	// either (and again after the batch): the next answers wait for the
	// kernel.
	f.attested.revoke(u.New.Guest, plan.unattest)
	f.attested6.revoke(u.New.Guest, plan.unattest)
	f.known.forgetGuest(u.New.Guest)
	defer f.known.forgetGuest(u.New.Guest)
	// During the batch, answers fill only the address sets both the old
	// and the new limits have (the others are made or deleted by it).
	oldNamed, newNamed := namedOf(u.Old.Guest, u.Old.Limits), namedOf(u.New.Guest, u.New.Limits)
	f.named.set(u.New.Guest, bothNamed(oldNamed, newNamed))
	err := f.admin.do(func(c *nftables.Conn) error { return f.updateByKeyLocked(c, u, plan) })
	for attempt := 0; err != nil && isNotFound(err) && attempt < 4; attempt++ {
		err = f.admin.do(func(c *nftables.Conn) error { return f.updateByDumpLocked(c, u, plan) })
	}
	if err != nil {
		f.named.set(u.Old.Guest, oldNamed)
		return fmt.Errorf("update session %s (guest %s): %w", u.New.Name, u.New.Guest, err)
	}
	f.named.set(u.New.Guest, newNamed)
	f.attested6.forget(u.New.Guest, plan.unattest) // its v6 elements; the v4 ones are not counted there
	if err := f.seedNamed(u.New.Guest, freshNamed(oldNamed, newNamed)); err != nil {
		return fmt.Errorf("update session %s (guest %s): fill the address sets of its limited names: %w", u.New.Name, u.New.Guest, err)
	}
	return nil
}

func (f *Firewall) updateByKeyLocked(c *nftables.Conn, u SessionUpdate, p updatePlan) error {
	for _, se := range p.del {
		if err := addElements(c, f.schema.sets[se.set], se.elems, true); err != nil {
			return err
		}
	}
	if err := f.queueUnattest(c, p.unattest); err != nil {
		return err
	}
	for _, se := range p.add {
		if err := addElements(c, f.schema.sets[se.set], se.elems, false); err != nil {
			return err
		}
	}
	if err := f.queueLimitsLocked(c, u.New.Guest, u.New.Limits, wantedLimits(u.Old.Guest, u.Old.Limits)); err != nil {
		return err
	}
	return c.Flush()
}

// queueUnattest deletes the stale attested elements and their live copies
// (each added first: it may be gone).
func (f *Firewall) queueUnattest(c *nftables.Conn, unattest []setElems) error {
	for _, se := range unattest {
		names := []string{se.set}
		if live, ok := liveOf(se.set); ok {
			names = append(names, live)
		}
		if live, ok := live6Of(se.set); ok && f.dualStack() {
			names = append(names, live)
		}
		for _, name := range names {
			s := f.schema.sets[name]
			if err := addElements(c, s, se.elems, false); err != nil {
				return err
			}
			if err := addElements(c, s, se.elems, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// updateByDumpLocked deletes every element of the guest in the sets an
// update may change that u.New lacks, found by dumping those sets, then
// queues the stale attested elements and u.New's elements, and flushes.
func (f *Firewall) updateByDumpLocked(c *nftables.Conn, u SessionUpdate, p updatePlan) error {
	// The sets every session holds the same elements in whatever its
	// policy (interface, address, counters) are never touched.
	base := map[string]bool{}
	for _, se := range f.allSessionElements(SessionRules{Guest: u.New.Guest, HostIface: u.New.HostIface, Egress: netpolicy.ModeAllowlist}) {
		base[se.set] = true
	}
	want := map[elemID]bool{}
	sets := []string{setPublic, setPeers, setStatic, setStaticPorts, setStaticCIDR, setStaticCIDRPorts, setDenied, setDeniedPorts, setReject, setReset, setNameCheck, setNameCheckPublic, setNameCheckQUIC, setPinned, setPinnedPorts}
	if f.cfg.Pool6.IsValid() {
		sets = append(sets, policySets6...)
	}
	for _, plan := range [][]setElems{f.allSessionElements(u.Old), f.allSessionElements(u.New)} {
		for _, se := range plan {
			if !slices.Contains(sets, se.set) && !base[se.set] {
				sets = append(sets, se.set)
			}
		}
	}
	for _, se := range f.allSessionElements(u.New) {
		for _, e := range se.elems {
			want[idOf(se.set, e)] = true
		}
	}
	for _, name := range sets {
		elems, err := c.GetSetElements(f.schema.sets[name])
		if err != nil {
			return fmt.Errorf("list set %s: %w", name, err)
		}
		var del []nftables.SetElement
		for _, e := range elems {
			if e.IntervalEnd {
				continue // the dump's end markers belong to their start
			}
			if g, ok := f.keyOwner(name, e.Key); ok && g == u.New.Guest && !want[idOf(name, e)] {
				del = append(del, nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd})
			}
		}
		if err := addElements(c, f.schema.sets[name], del, true); err != nil {
			return err
		}
	}
	if err := f.queueUnattest(c, p.unattest); err != nil {
		return err
	}
	for _, se := range f.allSessionElements(u.New) {
		if base[se.set] {
			continue
		}
		if err := addElements(c, f.schema.sets[se.set], se.elems, false); err != nil {
			return err
		}
	}
	have, err := f.listLimitsLocked(c, func(g netip.Addr) bool { return g == u.New.Guest })
	if err != nil {
		return err
	}
	if err := f.queueLimitsLocked(c, u.New.Guest, u.New.Limits, have[u.New.Guest]); err != nil {
		return err
	}
	return c.Flush()
}

// policySets6 are the v6 sets whose elements a session's policy decides
// (sessionElements6 but sessions6): those an update may change.
var policySets6 = append([]string{setPublic6, setStatic6, setStatic6Ports, setStatic6CIDR, setStatic6CIDRPorts,
	setDenied6, setReject6, setReset6}, nameCheckSets6...)

// keyOwner returns the (v4) guest a session-keyed element of set belongs
// to: keyGuest's for the v4 sets; for a v6 set, the session whose guest6
// leads the key (after the interface name in sessions6).
func (f *Firewall) keyOwner(set string, key []byte) (netip.Addr, bool) {
	if !slices.Contains(sessionSets6, set) {
		return keyGuest(set, key)
	}
	off := 0
	if set == setSessions6 {
		off = ifNameSize
	}
	if len(key) < off+16 {
		return netip.Addr{}, false
	}
	return f.guest4Of6(netip.AddrFrom16([16]byte(key[off : off+16])))
}

// cutsFlow reports whether an update takes away a flow of the guest to dst
// (protocol number proto, destination port dport): the old rules or a stale
// attestation allowed it, and neither the new rules nor a kept attestation
// does, or the new rules deny it (a deny wins over a kept attestation
// too). A flow no update step ever allowed (an attestation that expired
// long before, the DNS proxy, a destination the old rules denied) is left
// alone: its fate is not the update's.
func (u SessionUpdate) cutsFlow(g *netpolicy.Guard, dst netip.Addr, proto uint8, dport uint16) bool {
	was := !rulesDeny(u.Old, dst, proto, dport) && (rulesAllow(u.Old, g, dst, proto, dport) ||
		attestAllow(u.Stale, dst, proto, dport) || attestAllow(u.Keep, dst, proto, dport))
	now := !rulesDeny(u.New, dst, proto, dport) && (rulesAllow(u.New, g, dst, proto, dport) || attestAllow(u.Keep, dst, proto, dport))
	return was && !now
}

// widensOnly reports whether u takes nothing away, so CutFlows has nothing
// to cut and need not walk the conntrack table (a walk of every bucket of
// the kernel's table, ~10 ms whatever the number of flows: most of an
// update's time). It holds when no attestation goes stale, public egress
// stays public, every old lab peer and static target is still in the new
// rules, and the new rules deny nothing the old ones did not. Then every
// flow cutsFlow's "was" admits, its "now" admits too: the new deny is
// within the old one, the new allow contains the old, and Keep is on both
// sides.
func (u SessionUpdate) widensOnly() bool {
	switch {
	case len(u.Stale) > 0:
		return false
	case u.Old.Egress == netpolicy.ModePublic && u.New.Egress != netpolicy.ModePublic:
		return false
	}
	for _, p := range u.Old.InboundFromHost {
		for _, proto := range protosOf(p.Proto) {
			if !inboundNames(u.New, proto.Number(), p.Port) {
				return false
			}
		}
	}
	for _, p := range u.Old.Peers {
		if !slices.Contains(u.New.Peers, p) {
			return false
		}
	}
	for _, t := range u.Old.Static {
		if !slices.Contains(u.New.Static, t) {
			return false
		}
	}
	for _, t := range u.New.Deny {
		if !slices.Contains(u.Old.Deny, t) {
			return false
		}
	}
	return true
}

func rulesDeny(r SessionRules, dst netip.Addr, proto uint8, dport uint16) bool {
	for _, t := range r.Deny {
		// A v6 deny entry drops its range on every port (denied6).
		if t.Prefix.Contains(dst) && (dst.Is6() || portAllows(t.Port, t.Proto, proto, dport)) {
			return true
		}
	}
	return false
}

func portAllows(port uint16, p netpolicy.Proto, proto uint8, dport uint16) bool {
	portProto := proto == netpolicy.ProtoTCP.Number() || proto == netpolicy.ProtoUDP.Number()
	if port == 0 {
		// Every port but the resolver ports (the resolver chain).
		return !portProto || !netpolicy.IsResolverPort(dport)
	}
	if !portProto {
		return false
	}
	return port == dport && (p == netpolicy.ProtoAny || p.Number() == proto)
}

func rulesAllow(r SessionRules, g *netpolicy.Guard, dst netip.Addr, proto uint8, dport uint16) bool {
	if r.Egress == netpolicy.ModePublic && g.IsPublicUnicast(dst) {
		return true
	}
	if slices.Contains(r.Peers, dst) {
		return true
	}
	for _, t := range r.Static {
		if t.Prefix.Contains(dst) && portAllows(t.Port, t.Proto, proto, dport) {
			return true
		}
	}
	return false
}

func attestAllow(as []netpolicy.Attestation, dst netip.Addr, proto uint8, dport uint16) bool {
	for _, a := range as {
		if !slices.Contains(a.Addrs, dst) {
			continue
		}
		if len(a.Ports) == 0 {
			return true
		}
		for _, p := range a.Ports {
			if portAllows(p.Port, p.Proto, proto, dport) {
				return true
			}
		}
	}
	return false
}

// inboundNames reports whether r's --inbound-from-host names proto and port.
func inboundNames(r SessionRules, proto uint8, port uint16) bool {
	for _, p := range r.InboundFromHost {
		if p.Port == port && (p.Proto == netpolicy.ProtoAny || p.Proto.Number() == proto) {
			return true
		}
	}
	return false
}

// cutsInbound reports whether u takes away the port of a connection the
// host opened to the guest (src is its end): the host's, as the output
// hook's inbound_host admitted it, not another session's (a lab peer's
// flow is its policy's, judged in forward). A session's address is the
// third of its /30 (see nsmgr's IPAM); the host's addresses in the pool
// are the gateways and the DNS address.
func (u SessionUpdate) cutsInbound(pool netip.Prefix, src netip.Addr, proto uint8, dport uint16) bool {
	if pool.Contains(src) && src.As4()[3]%4 == 2 {
		return false
	}
	return inboundNames(u.Old, proto, dport) && !inboundNames(u.New, proto, dport)
}

// CutFlow is one flow CutFlows cut: Src is the guest's end (its address
// and port as the guest's socket sees them), Dst the other end, also for
// a connection the host opened to the guest (its server's socket).
type CutFlow struct {
	Proto    uint8 // the protocol number (unix.IPPROTO_TCP, ...)
	Src, Dst netip.AddrPort
}

// CutFlows deletes the conntrack entries of the guest's flows that u takes
// away (see cutsFlow), and of the host's connections to it on the ports u
// no longer names in --inbound-from-host (cutsInbound), over netlink, and returns them: the reply direction
// of an established flow no longer passes the policy's "established"
// accept, since there is no entry left to be established. (The guest's own
// socket learns nothing from this: the caller aborts it, see
// nsmgr.AbortTCP.) Call it after UpdateSession. It walks the conntrack
// table once per family (the kernel's dump filters nothing by destination
// port; a dual-stack session's v6 flows, from its guest6, are cut by the
// same judgement),
// unless the update only widens (widensOnly): then there is nothing to cut.
func (f *Firewall) CutFlows(u SessionUpdate) ([]CutFlow, error) {
	if u.widensOnly() {
		return nil, nil
	}
	guest, guest6 := u.New.Guest, f.guest6Of(u.New.Guest)
	var cut []CutFlow
	err := f.flows.Do(func(c *netlink.Conn) error {
		entries, err := nfnetlink.DumpFlows(c, nil)
		if err != nil {
			return err
		}
		if guest6.IsValid() {
			// A dual-stack session's v6 flows: a second dump, of the
			// AF_INET6 entries, judged by the same policy.
			more, err := nfnetlink.DumpFlowsOf(c, unix.AF_INET6, nil)
			if err != nil {
				return err
			}
			entries = append(entries, more...)
		}
		for _, e := range entries {
			var flow CutFlow
			switch {
			case (e.Src == guest || guest6.IsValid() && e.Src == guest6) && u.cutsFlow(f.guard, e.Dst, e.Proto, e.Dport):
				flow = CutFlow{Proto: e.Proto, Src: netip.AddrPortFrom(e.Src, e.Sport), Dst: netip.AddrPortFrom(e.Dst, e.Dport)}
			case e.Dst == guest && u.cutsInbound(f.cfg.Pool, e.Src, e.Proto, e.Dport):
				// A connection the host opened under a revoked --inbound-from-host port.
				flow = CutFlow{Proto: e.Proto, Src: netip.AddrPortFrom(e.Dst, e.Dport), Dst: netip.AddrPortFrom(e.Src, e.Sport)}
			default:
				continue
			}
			if err := nfnetlink.DeleteFlow(c, e); err != nil {
				return err
			}
			cut = append(cut, flow)
		}
		return nil
	})
	if err != nil {
		return cut, fmt.Errorf("cut revoked flows of %s (guest %s): %w", u.New.Name, guest, err)
	}
	return cut, nil
}

// ctnetlink tuple attributes (linux/netfilter/nfnetlink_conntrack.h).
