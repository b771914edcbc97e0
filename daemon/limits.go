package daemon

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// Counted limits (issue 24): a grant's connections and byte budget per
// entry, and the session's egress budget. The kernel counts (nft's
// limits.go); the record holds what was granted, so a restart rebuilds the
// same kernel objects and finds their counts where they were.

// ReasonGrantUsed and ReasonBudget are session why's reasons (and the drop
// reasons) for a destination whose grant has no use left, or whose budget
// is spent.
const (
	ReasonGrantUsed = netpolicy.ReasonGrantUsed
	ReasonBudget    = netpolicy.ReasonBudget
)

// limitedEntry is one allow entry a grant limits: the grant (index in the
// record's Grants) whose count is in force, and the one whose budget is
// (-1: none). A later grant of the entry replaces an earlier one's.
type limitedEntry struct {
	entry       string // as the policy prints it
	limit       nft.EntryLimit
	connGrant   int
	budgetGrant int
}

// sessionLimits are a session's limits as the record gives them.
type sessionLimits struct {
	nft     nft.SessionLimits
	entries []limitedEntry
}

// limitsOf derives the session's limits from its record and policy: for
// each allow entry (an address, a CIDR or a name), the latest grant not
// ended that names it with connections, and the latest with a budget. A
// name's targets are the addresses the DNS proxy answers for it (the
// kernel's address set of the entry), a pinned host's its pinned
// addresses.
func (e *Engine) limitsOf(rec SessionRecord, p netpolicy.Policy) sessionLimits {
	out := sessionLimits{nft: nft.SessionLimits{EgressBudget: rec.Request.EgressBudget}}
	for _, ent := range p.Allow {
		le := limitedEntry{entry: ent.String(), connGrant: -1, budgetGrant: -1}
		for i, g := range rec.Grants {
			if g.Ended != nil || (g.Connections == 0 && g.Budget == 0) || !e.grantNames(g, le.entry) {
				continue
			}
			if g.Connections > 0 {
				le.connGrant, le.limit.Connections, le.limit.Grant = i, g.Connections, strconv.Itoa(i)
			}
			if g.Budget > 0 {
				le.budgetGrant, le.limit.Budget = i, g.Budget
			}
		}
		if le.connGrant < 0 && le.budgetGrant < 0 {
			continue
		}
		le.limit.ID = entryID(le.entry)
		switch pins, pinned := rec.Pinned[ent.Name]; {
		case ent.Kind == netpolicy.KindCIDR:
			le.limit.Targets = []netpolicy.Target{{Prefix: ent.Prefix, Port: ent.Port, Proto: ent.Proto}}
		case ent.Kind == netpolicy.KindHost && pinned:
			for _, a := range pins {
				le.limit.Targets = append(le.limit.Targets, netpolicy.Target{Prefix: netip.PrefixFrom(a, a.BitLen()), Port: ent.Port, Proto: ent.Proto})
			}
		default:
			name := ent
			le.limit.Name = &name
		}
		out.entries = append(out.entries, le)
		out.nft.Entries = append(out.nft.Entries, le.limit)
	}
	return out
}

// grantNames reports whether the grant names the entry (as printed).
func (e *Engine) grantNames(g GrantRecord, entry string) bool {
	for _, raw := range g.Entries {
		if x, err := netpolicy.ParseEntry(raw, e.guard); err == nil && x.String() == entry {
			return true
		}
	}
	return false
}

// entryID names an entry's kernel objects: 8 hex digits of its hash.
func entryID(entry string) string {
	h := fnv.New32a()
	h.Write([]byte(entry))
	return fmt.Sprintf("%08x", h.Sum32())
}

// checkGrantEntries refuses connections or a budget for an entry the
// kernel cannot count: a name in public mode (the DNS proxy attests no
// answer there, so the name's addresses are never known), a resolver port.
func (e *Engine) checkGrantEntries(allow []string, ask grantAsk, mode netpolicy.Mode) error {
	if ask.connections == 0 && ask.budget == 0 {
		return nil
	}
	for _, raw := range allow {
		ent, err := netpolicy.ParseEntry(raw, e.guard)
		if err != nil {
			continue // the policy's own check names it
		}
		if ent.Kind != netpolicy.KindCIDR && mode == netpolicy.ModePublic {
			return badRequest(fmt.Errorf("allow %q with connections or a budget in egress public: want egress allowlist (public mode attests no answer, so a name's flows cannot be told apart)", raw))
		}
		if ask.connections > 0 && netpolicy.IsResolverPort(ent.Port) {
			// The table sends DNS and DoT to the resolver chain before
			// the grants: such a flow would pass uncounted.
			return badRequest(fmt.Errorf("allow %q with connections: want a port other than 53 and 853 (DNS and DoT flows are not counted)", raw))
		}
	}
	return nil
}

// limitViews fills inspect's grants and egress budget from the kernel's
// counts.
func (e *Engine) limitViews(s *liveSession, in *api.SessionInfo) {
	lim := e.limitsOf(s.rec, s.policy)
	if lim.nft.Empty() {
		return
	}
	use, err := e.fw.LimitUsage(s.rec.Guest, lim.nft)
	if err != nil {
		e.log.Warn("read limits", "session", s.rec.Name, "err", err)
		return
	}
	in.Policy.Grants = grantViews(s.rec.Grants, lim, &use)
	if b := lim.nft.EgressBudget; b > 0 {
		in.Policy.EgressBudget = &api.BudgetView{Bytes: b, Spent: use.EgressSpent, Left: b - min(b, use.EgressSpent)}
	}
}

// limitVerdict is session why's answer for a destination the policy
// allows but a limit refuses: the session's budget spent (entry ""), or
// the entry whose grant is used up or whose budget is spent.
func (e *Engine) limitVerdict(s *liveSession, a netip.Addr, port uint16, proto netpolicy.Proto) (reason, entry, detail string, ok bool) {
	return e.limitVerdictOf(s, func(l nft.EntryLimit, u nft.EntryUsage) bool { return limitCovers(l, u, a, port, proto) })
}

// limitVerdictName is limitVerdict for a host name: the session's egress
// budget, or a name entry matching it (on port, 0: any) whose grant is used
// up or whose budget is spent.
func (e *Engine) limitVerdictName(s *liveSession, name string, port uint16, proto netpolicy.Proto) (reason, entry, detail string, ok bool) {
	return e.limitVerdictOf(s, func(l nft.EntryLimit, _ nft.EntryUsage) bool {
		return l.Name != nil && l.Name.MatchesName(name) && portCovers(l.Name.PortSpec, port, proto)
	})
}

// limitVerdictOf: the session's egress budget, then each entry limit
// covers.
func (e *Engine) limitVerdictOf(s *liveSession, covers func(nft.EntryLimit, nft.EntryUsage) bool) (reason, entry, detail string, ok bool) {
	lim := e.limitsOf(s.rec, s.policy)
	if lim.nft.Empty() {
		return "", "", "", false
	}
	use, err := e.fw.LimitUsage(s.rec.Guest, lim.nft)
	if err != nil {
		return "", "", "", false
	}
	if b := lim.nft.EgressBudget; b > 0 && use.EgressSpent >= b {
		return ReasonBudget, "", fmt.Sprintf("the session's egress budget of %d bytes is spent (%d counted): raise it with an update (--egress-budget SIZE)", b, use.EgressSpent), true
	}
	return entryLimitVerdict(lim, use, covers)
}

// entryLimitVerdict is the verdict of the first entry limit covers that is
// used up or spent.
func entryLimitVerdict(lim sessionLimits, use nft.LimitUsage, covers func(nft.EntryLimit, nft.EntryUsage) bool) (reason, entry, detail string, ok bool) {
	for _, le := range lim.entries {
		u := use.Entries[le.limit.ID]
		if !covers(le.limit, u) {
			continue
		}
		if le.limit.Connections > 0 && u.Used >= le.limit.Connections {
			return ReasonGrantUsed, le.entry, fmt.Sprintf("the grant of %q allowed %d connections and all are used: grant more with an update (--allow %s --connections N)", le.entry, le.limit.Connections, le.entry), true
		}
		if le.limit.Budget > 0 && u.Spent >= le.limit.Budget {
			return ReasonBudget, le.entry, fmt.Sprintf("the byte budget of %q (%d bytes) is spent (%d counted): raise it with an update (--allow %s --budget SIZE)", le.entry, le.limit.Budget, u.Spent, le.entry), true
		}
	}
	return "", "", "", false
}

// limitCovers reports whether the entry's limit counts flows to a on port
// (0: any) and proto: a's in one of its targets or, for a name, in the
// addresses answered for it (u.Addrs).
func limitCovers(l nft.EntryLimit, u nft.EntryUsage, a netip.Addr, port uint16, proto netpolicy.Proto) bool {
	if l.Name != nil {
		return portCovers(l.Name.PortSpec, port, proto) && slices.Contains(u.Addrs, a)
	}
	for _, t := range l.Targets {
		if t.Prefix.Contains(a) && portCovers(netpolicy.PortSpec{Port: t.Port, Proto: t.Proto}, port, proto) {
			return true
		}
	}
	return false
}

// portCovers reports whether an entry's port p covers port (0: any) and
// proto.
func portCovers(p netpolicy.PortSpec, port uint16, proto netpolicy.Proto) bool {
	return p.Port == 0 || (port != 0 && p.Port == port && (p.Proto == netpolicy.ProtoAny || proto == netpolicy.ProtoAny || p.Proto == proto))
}

// limitEvents dedupes the operator events of limits reached: one per
// session and limit until the limit changes (an update).
type limitEvents struct {
	mu   sync.Mutex
	seen map[string]bool // session \x00 reason \x00 destination entry
}

// first reports whether key is seen for the first time.
func (l *limitEvents) first(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	if l.seen[key] {
		return false
	}
	l.seen[key] = true
	return true
}

// forget clears a session's keys (its limits changed).
func (l *limitEvents) forget(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.seen {
		if len(k) > len(name) && k[:len(name)] == name && k[len(name)] == 0 {
			delete(l.seen, k)
		}
	}
}

// seedLimitsReached marks the limits an adopted session had already
// reached before the restart (the kernel's counts say so): their event was
// recorded then, and a restart does not make a second.
func (e *Engine) seedLimitsReached(rec SessionRecord, p netpolicy.Policy) {
	lim := e.limitsOf(rec, p)
	if lim.nft.Empty() {
		return
	}
	use, err := e.fw.LimitUsage(rec.Guest, lim.nft)
	if err != nil {
		e.log.Warn("read limits", "session", rec.Name, "err", err)
		return
	}
	if b := lim.nft.EgressBudget; b > 0 && use.EgressSpent >= b {
		e.limitsReached.first(rec.Name + "\x00" + ReasonBudget + "\x00")
	}
	for _, le := range lim.entries {
		u := use.Entries[le.limit.ID]
		if le.limit.Connections > 0 && u.Used >= le.limit.Connections {
			e.limitsReached.first(rec.Name + "\x00" + ReasonGrantUsed + "\x00" + le.entry)
		}
		if le.limit.Budget > 0 && u.Spent >= le.limit.Budget {
			e.limitsReached.first(rec.Name + "\x00" + ReasonBudget + "\x00" + le.entry)
		}
	}
}

// limitReached records, once per session and limit until an update
// changes its limits, the operator event of a limit reached (grant_used,
// budget_spent), and reports whether the drop line makes a flow event:
// every grant-used refusal does (each is a new flow); of a spent budget's
// lines only the first (the budget cuts established packets too, a flood
// of them).
func (e *Engine) limitReached(name string, fl nft.DroppedFlow) bool {
	e.mu.Lock()
	s, ok := e.sessions[name]
	e.mu.Unlock()
	entry := ""
	if ok {
		// The kernel's counts say which limit refused it (a line's
		// reason is budget for the session's budget and an entry's).
		if reason, ent, _, ok := e.limitVerdict(s, fl.Dst, fl.DstPort, netpolicy.Proto(fl.Proto)); ok && reason == fl.Reason {
			entry = ent
		}
	}
	first := e.limitsReached.first(name + "\x00" + fl.Reason + "\x00" + entry)
	if first {
		action := "grant_used"
		d := map[string]any{"reason": fl.Reason, "dst": fl.Dst.String()}
		if entry != "" {
			d["entry"] = entry
		}
		if fl.Reason == ReasonBudget {
			action = "budget_spent"
			if entry == "" {
				d["budget"] = "egress"
			}
		}
		e.recordCall(context.Background(), name, action, d, nil)
	}
	return first || fl.Reason == ReasonGrantUsed
}
