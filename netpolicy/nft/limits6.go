package nft

import (
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// Counted limits of a dual-stack session (limits.go, issue 26): one
// budget and one grant count per session and entry, whatever the family.
// The session's own chains, budget_<guest> and grants_<guest>, hold the
// rules of both families, and the v6 chains dispatch to them by the
// guest's v6 address:
//
//	from_session6 (after the ND drops)
//	  ip6 saddr vmap @budget_chains6        # guest6 -> jump budget_<guest>
//	from_session6 (after denied6 and blocked6, before every accept)
//	  ip6 saddr vmap @grant_chains6         # guest6 -> jump grants_<guest>
//	budget_<guest>
//	  meta nfproto ipv4 ip daddr TARGET ... quota name "quota_<guest>_<entry>" goto drop_budget
//	  meta nfproto ipv4 quota name "quota_<guest>" goto drop_budget
//	  meta nfproto ipv6 ip6 daddr TARGET6 ... quota name "quota_<guest>_<entry>" goto drop_budget6
//	  meta nfproto ipv6 ip6 daddr @addrs6_<guest>_<entry> update @addrs6_… { ip6 daddr timeout 24h } quota name … goto drop_budget6
//	  meta nfproto ipv6 quota name "quota_<guest>" goto drop_budget6
//	grants_<guest>
//	  ct state new meta nfproto ipv4 TARGET add @grant_… { ct id } goto accept_new   (or return, for a name)
//	  ct state new meta nfproto ipv4 TARGET goto drop_grant_used
//	  meta nfproto ipv6 meta l4proto P th dport {53,853} return    # DNS and DoT: never counted
//	  ct state new meta nfproto ipv6 TARGET6 add @grant_… { ct id } return
//	  ct state new meta nfproto ipv6 TARGET6 goto drop_grant_used6
//
// Each packet passes the rules of its own family only, so a quota
// referenced by a v4 and a v6 rule counts each byte once: the session's
// --egress-budget and an entry's --budget are the bytes of both families.
// A grant's set is keyed by the flow's conntrack id (ct id), which both
// families have: one set, one count, so the N connections of a grant may
// be any mix of v4 and v6 flows. (An IPv4-only daemon keys it by the
// 5-tuple, as before.) A retransmitted SYN is the same conntrack entry,
// counted once; a flow refused after the grant counted it (by the flow
// budget, or for a name by the policy) may count again when the client
// retries, as a fresh entry. A v6 grant rule returns to from_session6,
// whose static and attested elements accept the flow, rather than
// accepting itself: from_session6 dispatches to the grants before its
// port-specific accepts, and a port-less entry's grant must not open DNS.
// A name entry's v6 addresses are its address set's twin, addrs6_<guest>_<entry>,
// filled from the AAAA answers in the batch that attests them (AttestName).

const (
	setBudgetChains6 = "budget_chains6" // map ipv6_addr : verdict: guest6 -> jump budget_<guest>
	setGrantChains6  = "grant_chains6"  // map ipv6_addr : verdict: guest6 -> jump grants_<guest>
)

// addLimitSets6 adds the v6 dispatch maps to a dual-stack schema.
func (s *schema) addLimitSets6(add func(*nftables.Set)) {
	size := s.sets[setBudgetChains].Size
	add(&nftables.Set{Name: setBudgetChains6, KeyType: nftables.TypeIP6Addr, IsMap: true, DataType: nftables.TypeVerdict, Size: size})
	add(&nftables.Set{Name: setGrantChains6, KeyType: nftables.TypeIP6Addr, IsMap: true, DataType: nftables.TypeVerdict, Size: size})
}

func (env ruleEnv) dispatchBudget6() []expr.Any {
	return append(loadSaddr6(reg1), env.vmap(setBudgetChains6)...)
}

func (env ruleEnv) dispatchGrants6() []expr.Any {
	return append(loadSaddr6(reg1), env.vmap(setGrantChains6)...)
}

// addrs6SetName is the v6 twin of a name entry's address set.
func addrs6SetName(v4 string) string { return "addrs6_" + strings.TrimPrefix(v4, "addrs_") }

func (f *Firewall) addrsSet6(name string) *nftables.Set {
	return &nftables.Set{Table: f.schema.table, Name: name, KeyType: nftables.TypeIP6Addr, HasTimeout: true, Dynamic: true, Size: attestedSetSize}
}

func (f *Firewall) dualStack() bool { return f.cfg.Pool6.IsValid() }

// grantKeyType is a grant set's key: the 5-tuple of a v4 flow on an
// IPv4-only daemon, the conntrack id of a flow of either family on a
// dual-stack one.
func (f *Firewall) grantKeyType() (nftables.SetDatatype, bool) {
	if f.dualStack() {
		return nftables.TypeMark, false
	}
	return typeGrantFlow, true
}

// grantKey loads a grant set's key from register 32_00 on.
func (env ruleEnv) grantKey() []expr.Any {
	if env.pool6.IsValid() {
		return []expr.Any{&expr.Ct{Register: reg32(0), Key: expr.CtKey(unix.NFT_CT_ID)}}
	}
	return loadFlowKey()
}

// familyRules prefixes each rule with a family match.
func familyRules(fam []expr.Any, rules [][]expr.Any) [][]expr.Any {
	out := make([][]expr.Any, 0, len(rules))
	for _, r := range rules {
		out = append(out, append(append([]expr.Any{}, fam...), r...))
	}
	return out
}

// splitLimits splits l into its v4 part (name entries kept whole) and the
// v6 targets of its address entries, by entry ID.
func splitLimits(l SessionLimits) (SessionLimits, map[string][]netpolicy.Target) {
	v4 := SessionLimits{EgressBudget: l.EgressBudget}
	v6 := map[string][]netpolicy.Target{}
	for _, e := range l.Entries {
		t4, t6 := splitFamilies(e.Targets)
		v6[e.ID] = t6
		e.Targets = t4
		v4.Entries = append(v4.Entries, e)
	}
	return v4, v6
}

// budgetRulesOf are budget_<guest>'s rules for this daemon.
func (f *Firewall) budgetRulesOf(g netip.Addr, l SessionLimits, sets map[string]*nftables.Set) [][]expr.Any {
	if !f.dualStack() {
		return budgetRules(g, l, sets)
	}
	l4, t6 := splitLimits(l)
	out := familyRules(nfprotoIs(true), budgetRules(g, l4, sets))
	over := func(quota string) []expr.Any {
		return []expr.Any{&expr.Objref{Type: int(nftables.ObjTypeQuota), Name: quota}, &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainDropBudget6}}
	}
	var r6 [][]expr.Any
	for _, e := range l.Entries {
		if e.Budget == 0 {
			continue
		}
		if e.Name != nil {
			a := sets[addrs6SetName(addrsSetName(g, e.ID))]
			for _, t := range namedTargets(e) {
				r := append(matchNamed6(a, t), &expr.Dynset{SrcRegKey: reg1, SetName: a.Name, SetID: a.ID,
					Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: namedBudgetRefresh})
				r6 = append(r6, append(r, over(entryQuotaName(g, e.ID))...))
			}
			continue
		}
		for _, t := range netpolicy.ExpandProto(t6[e.ID]) {
			r6 = append(r6, append(matchTarget6(t), over(entryQuotaName(g, e.ID))...))
		}
	}
	if l.EgressBudget > 0 {
		r6 = append(r6, over(sessionQuotaName(g)))
	}
	return append(out, familyRules(nfproto6(), r6)...)
}

// grantRulesOf are grants_<guest>'s rules for this daemon.
func (f *Firewall) grantRulesOf(env ruleEnv, g netip.Addr, l SessionLimits, sets map[string]*nftables.Set) [][]expr.Any {
	if !f.dualStack() {
		return env.grantRules(g, l, sets)
	}
	l4, t6 := splitLimits(l)
	out := familyRules(nfprotoIs(true), env.grantRules(g, l4, sets))
	var r6 [][]expr.Any
	for _, pp := range resolverPorts {
		r6 = append(r6, append(append(l4protoIs(pp.Proto), loadDport(reg1)...), cmpEq(reg1, portKey(pp.Port)[:2]), &expr.Verdict{Kind: expr.VerdictReturn}))
	}
	for _, e := range l.Entries {
		if e.Connections == 0 {
			continue
		}
		s := sets[grantSetName(g, e.ID, e.Grant)]
		var matches [][]expr.Any
		if e.Name != nil {
			a := sets[addrs6SetName(addrsSetName(g, e.ID))]
			for _, t := range namedTargets(e) {
				matches = append(matches, matchNamed6(a, t))
			}
		} else {
			for _, t := range netpolicy.ExpandProto(t6[e.ID]) {
				matches = append(matches, matchTarget6(t))
			}
		}
		for _, m := range matches {
			add := append(ctStateIn(expr.CtStateBitNEW), m...)
			add = append(add, env.grantKey()...)
			add = append(add, &expr.Dynset{SrcRegKey: reg32(0), SetName: s.Name, SetID: s.ID, Operation: unix.NFT_DYNSET_OP_ADD},
				&expr.Verdict{Kind: expr.VerdictReturn})
			refuse := append(ctStateIn(expr.CtStateBitNEW), m...)
			r6 = append(r6, add, append(refuse, &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainDropGrantUsed6}))
		}
	}
	return append(out, familyRules(nfproto6(), r6)...)
}

// matchNamed6 is matchNamed for a v6 address set (ip6 daddr @set).
func matchNamed6(set *nftables.Set, t netpolicy.Target) []expr.Any {
	var ex []expr.Any
	if t.Port != 0 {
		ex = append(ex, l4protoIs(t.Proto)...)
		ex = append(ex, loadDport(reg1)...)
		ex = append(ex, cmpEq(reg1, portKey(t.Port)[:2]))
	}
	ex = append(ex, loadDaddr6(reg1)...)
	return append(ex, &expr.Lookup{SourceRegister: reg1, SetName: set.Name, SetID: set.ID})
}

// matchTarget6 matches packets to a v6 target: ip6 daddr in its prefix
// and, with a port, the protocol and destination port.
func matchTarget6(t netpolicy.Target) []expr.Any {
	ex := loadDaddr6(reg1)
	if t.Prefix.Bits() < 128 {
		mask := make([]byte, 16)
		for i := 0; i < t.Prefix.Bits(); i++ {
			mask[i/8] |= 1 << (7 - i%8)
		}
		ex = append(ex, &expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 16, Mask: mask, Xor: make([]byte, 16)})
	}
	ex = append(ex, cmpEq(reg1, ip6Key(t.Prefix.Masked().Addr())))
	if t.Port != 0 {
		ex = append(ex, l4protoIs(t.Proto)...)
		ex = append(ex, loadDport(reg1)...)
		ex = append(ex, cmpEq(reg1, portKey(t.Port)[:2]))
	}
	return ex
}

// limitElems6 is the guest6's element of a limit chain's v6 map (none on
// an IPv4-only daemon, or for a guest of no slot).
func (f *Firewall) limitElems6(g netip.Addr, chain string) []nftables.SetElement {
	g6 := f.guest6Of(g)
	if !g6.IsValid() {
		return nil
	}
	e := nftables.SetElement{Key: ip6Key(g6)}
	if chain != "" {
		e.VerdictData = &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}
	}
	return []nftables.SetElement{e}
}

// namedElements6 are the v6 address set elements of an answer for name:
// the twins of the sets namedElements fills.
func (f *Firewall) namedElements6(guest netip.Addr, name string, ips []netip.Addr, timeout time.Duration) []namedElems {
	if name == "" {
		return nil
	}
	sets := f.named.sets(guest, name)
	if len(sets) == 0 {
		return nil
	}
	var elems []nftables.SetElement
	for _, ip := range ips {
		if ip.Is6() && !ip.Is4In6() {
			elems = append(elems, nftables.SetElement{Key: ip6Key(ip), Timeout: f.addrsTimeout(timeout)})
		}
	}
	if len(elems) == 0 {
		return nil
	}
	out := make([]namedElems, 0, len(sets))
	for _, s := range sets {
		out = append(out, namedElems{set: addrs6SetName(s), elems: elems})
	}
	return out
}
