package nft

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// Counted limits (issue 24): a session's byte budgets and its connection
// grants, enforced by objects of the session's own, apart from the shared
// sets every session uses:
//
//	from_session (first rule)
//	  ip saddr vmap @budget_chains          # guest -> jump budget_<guest>
//	policy (after the resolver dispatch, before public mode and every accept)
//	  ip saddr vmap @grant_chains           # guest -> jump grants_<guest>
//	budget_<guest>                          # every packet the guest sends, new or established
//	  ip daddr TARGET [l4proto P th dport N] quota name "quota_<guest>_<entry>" goto drop_budget
//	  quota name "quota_<guest>" goto drop_budget
//	grants_<guest>                          # new flows only (policy sees no established packet)
//	  ct state new TARGET add @grant_<guest>_<entry>_<grant> { ip saddr . meta l4proto . th sport . ip daddr . th dport } goto accept_new
//	  ct state new TARGET goto drop_grant_used
//
// A name entry's TARGET is its address set, addrs_<guest>_<entry> (ip
// daddr @addrs_… [l4proto P th dport N]): the DNS proxy's answers for the
// name put the answered addresses there, in the batch that attests them,
// before the answer is released (AttestName, namedlimits.go). A name
// entry's grant does not accept: the flow it counts returns to the policy,
// whose attested elements (or the name check) decide, as for any name:
//
//	  ct state new ip daddr @addrs_… add @grant_… return
//	  ct state new ip daddr @addrs_… goto drop_grant_used
//	budget_<guest>: ip daddr @addrs_… update @addrs_… { ip daddr timeout 24h } quota name … goto drop_budget
//
// The budget's update keeps the address of a flow that still sends in the
// set as long as it sends (an established flow outlives its attestation).
//
// A session without limits has no element in either map: it pays one hash
// lookup per packet (from_session) and one per new flow (policy), nothing
// more. The quotas are named objects ("over BYTES"): each packet that
// reaches the rule adds its length, and the rule matches once the sum is
// past BYTES; an update replaces BYTES and keeps what was consumed, so a
// raised budget lets traffic flow again. A grant's set has no timeout and
// its size is the grant's count: the datapath's add of a new flow's 5-tuple
// fails once the set is full, the rule does not match, and the next rule
// refuses the flow (grant-used). A retransmitted SYN adds the same key: a
// flow is counted once. All of it lives in the kernel, so restarts and a
// kill -9 keep the counts; Ensure never touches these objects.

const (
	setBudgetChains    = "budget_chains" // map ipv4_addr : verdict: guest -> jump budget_<guest>
	setGrantChains     = "grant_chains"  // map ipv4_addr : verdict: guest -> jump grants_<guest>
	chainDropBudget    = "drop_budget"
	chainDropGrantUsed = "drop_grant_used"
)

// typeGrantFlow is a grant set's key: the new flow's 5-tuple.
var typeGrantFlow = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeIPAddr, nftables.TypeInetService)

// SessionLimits are a session's counted limits. The zero value has none.
type SessionLimits struct {
	// EgressBudget is the bytes the guest may send in all (IP packet
	// lengths, every forwarded packet); 0: no budget.
	EgressBudget uint64
	Entries      []EntryLimit
}

// EntryLimit limits what the guest sends to one allow entry's targets.
type EntryLimit struct {
	// ID names the entry's kernel objects: lower-case letters and digits,
	// unique in the session, the same across updates for the same entry.
	ID      string
	Targets []netpolicy.Target
	// Name, when set, makes the entry a name (KindHost or a wildcard,
	// with its port): its targets are the addresses the DNS proxy answers
	// for the names it matches, kept in the entry's address set (Targets
	// is then unused).
	Name *netpolicy.Entry
	// Budget is the bytes the guest may send to Targets; 0: no budget.
	Budget uint64
	// Connections is the number of new flows to Targets; 0: no grant.
	Connections uint32
	// Grant (with Connections) names the grant's count: a later grant of
	// the same entry names a fresh one. Lower-case letters and digits.
	Grant string
}

// Empty reports whether l limits nothing.
func (l SessionLimits) Empty() bool {
	return !l.hasBudget() && !l.hasGrant()
}

func (l SessionLimits) hasBudget() bool {
	if l.EgressBudget > 0 {
		return true
	}
	for _, e := range l.Entries {
		if e.Budget > 0 {
			return true
		}
	}
	return false
}

func (l SessionLimits) hasGrant() bool {
	for _, e := range l.Entries {
		if e.Connections > 0 {
			return true
		}
	}
	return false
}

// check checks l; only a dual-stack daemon's entries may have IPv6
// targets.
func (l SessionLimits) check(dualStack bool) error {
	seen := map[string]bool{}
	for _, e := range l.Entries {
		if !isObjectWord(e.ID) || (e.Connections > 0 && !isObjectWord(e.Grant)) {
			return fmt.Errorf("limit of entry %q (grant %q): want lower-case letters and digits", e.ID, e.Grant)
		}
		if seen[e.ID] {
			return fmt.Errorf("limit of entry %q given twice", e.ID)
		}
		seen[e.ID] = true
		if e.Name != nil {
			if e.Name.Kind == netpolicy.KindCIDR {
				return fmt.Errorf("limit of entry %q: a CIDR given as a name", e.ID)
			}
			continue
		}
		for _, t := range e.Targets {
			if a := t.Prefix.Addr(); !a.Is4() && !(dualStack && a.Is6() && !a.Is4In6()) {
				return fmt.Errorf("limit of entry %q: target %s is not IPv4", e.ID, t.Prefix)
			}
		}
	}
	return nil
}

func isObjectWord(s string) bool {
	if s == "" || len(s) > 16 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// guestTag is the guest address in the names of its limit objects.
func guestTag(g netip.Addr) string { return hex.EncodeToString(ipKey(g)) }

func budgetChainName(g netip.Addr) string { return "budget_" + guestTag(g) }
func grantChainName(g netip.Addr) string  { return "grants_" + guestTag(g) }
func sessionQuotaName(g netip.Addr) string {
	return "quota_" + guestTag(g)
}
func entryQuotaName(g netip.Addr, id string) string { return "quota_" + guestTag(g) + "_" + id }
func grantSetName(g netip.Addr, id, grant string) string {
	return "grant_" + guestTag(g) + "_" + id + "_" + grant
}
func addrsSetName(g netip.Addr, id string) string { return "addrs_" + guestTag(g) + "_" + id }

// limitGuest returns the guest a limit object's name belongs to.
func limitGuest(name string) (netip.Addr, bool) {
	for _, p := range []string{"budget_", "grants_", "quota_", "grant_", "addrs_"} {
		rest, ok := strings.CutPrefix(name, p)
		if !ok || len(rest) < 8 || (len(rest) > 8 && rest[8] != '_') {
			continue
		}
		b, err := hex.DecodeString(rest[:8])
		if err != nil {
			continue
		}
		return netip.AddrFrom4([4]byte(b)), true
	}
	return netip.Addr{}, false
}

// limitObjects are a guest's limit objects by name: its two chains (and
// with each, its element in the chain's map), quotas (bytes), grant sets
// (size) and the address sets of its name entries.
type limitObjects struct {
	budgetChain, grantChain bool
	quotas                  map[string]uint64
	sets                    map[string]uint32
	addrs                   map[string]bool
}

func newLimitObjects() limitObjects {
	return limitObjects{quotas: map[string]uint64{}, sets: map[string]uint32{}, addrs: map[string]bool{}}
}

func wantedLimits(g netip.Addr, l SessionLimits) limitObjects {
	o := newLimitObjects()
	o.budgetChain, o.grantChain = l.hasBudget(), l.hasGrant()
	if l.EgressBudget > 0 {
		o.quotas[sessionQuotaName(g)] = l.EgressBudget
	}
	for _, e := range l.Entries {
		if e.Budget > 0 {
			o.quotas[entryQuotaName(g, e.ID)] = e.Budget
		}
		if e.Connections > 0 {
			o.sets[grantSetName(g, e.ID, e.Grant)] = e.Connections
		}
		if e.Name != nil && (e.Connections > 0 || e.Budget > 0) {
			o.addrs[addrsSetName(g, e.ID)] = true
		}
	}
	return o
}

// addrsSet is a name entry's address set: the addresses answered for the
// name, each with a timeout (AttestName), refreshed by the datapath while
// a budgeted flow sends (budgetRules).
func (f *Firewall) addrsSet(name string) *nftables.Set {
	return &nftables.Set{Table: f.schema.table, Name: name, KeyType: nftables.TypeIPAddr, HasTimeout: true, Dynamic: true, Size: attestedSetSize}
}

func (f *Firewall) grantSet(name string, size uint32) *nftables.Set {
	key, concat := f.grantKeyType()
	return &nftables.Set{Table: f.schema.table, Name: name, KeyType: key, Concatenation: concat, Dynamic: true, Size: size}
}

// queueLimitsLocked queues what takes the guest's limit objects from have
// to what l wants: quotas are added or updated (an update keeps what was
// consumed), grant sets added (an existing one keeps its elements), the
// two chains added (a no-op when they exist) and rewritten, and what l no
// longer wants of have deleted after the rules that used it. Everything
// l wants is added whether or not it exists (an add without NLM_F_EXCL of
// an existing chain, set, quota or map element with the same value
// succeeds), so have only needs to hold what may have to go.
func (f *Firewall) queueLimitsLocked(c *nftables.Conn, g netip.Addr, l SessionLimits, have limitObjects) error {
	t := f.schema.table
	want := wantedLimits(g, l)
	for _, name := range sortedKeys(want.quotas) {
		c.AddObj(&nftables.QuotaObj{Table: t, Name: name, Bytes: want.quotas[name], Over: true})
	}
	sets := map[string]*nftables.Set{}
	for _, name := range sortedKeys(want.addrs) {
		s := f.addrsSet(name)
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("encode set %s: %w", name, err)
		}
		sets[name] = s
		if f.dualStack() {
			s6 := f.addrsSet6(addrs6SetName(name))
			if err := c.AddSet(s6, nil); err != nil {
				return fmt.Errorf("encode set %s: %w", s6.Name, err)
			}
			sets[s6.Name] = s6
		}
	}
	for _, name := range sortedKeys(want.sets) {
		s := f.grantSet(name, want.sets[name])
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("encode set %s: %w", name, err)
		}
		sets[name] = s
	}
	env := f.ruleEnv(func(n string) *nftables.Set { return f.schema.sets[n] })
	for _, ch := range []struct {
		name       string
		want, have bool
		vmap       string
		vmap6      string
		rules      [][]expr.Any
	}{
		{budgetChainName(g), want.budgetChain, have.budgetChain, setBudgetChains, setBudgetChains6, f.budgetRulesOf(g, l, sets)},
		{grantChainName(g), want.grantChain, have.grantChain, setGrantChains, setGrantChains6, f.grantRulesOf(env, g, l, sets)},
	} {
		chain := &nftables.Chain{Name: ch.name, Table: t}
		elem := []nftables.SetElement{{Key: ipKey(g), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.name}}}
		switch {
		case ch.want:
			c.AddChain(chain)
			c.FlushChain(chain)
			for _, r := range ch.rules {
				c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: r})
			}
			if err := addElements(c, f.schema.sets[ch.vmap], elem, false); err != nil {
				return err
			}
			if e6 := f.limitElems6(g, ch.name); len(e6) > 0 {
				if err := addElements(c, f.schema.sets[ch.vmap6], e6, false); err != nil {
					return err
				}
			}
		case ch.have:
			c.FlushChain(chain)
			if err := addElements(c, f.schema.sets[ch.vmap], []nftables.SetElement{{Key: ipKey(g)}}, true); err != nil {
				return err
			}
			if e6 := f.limitElems6(g, ""); len(e6) > 0 {
				if err := addElements(c, f.schema.sets[ch.vmap6], e6, true); err != nil {
					return err
				}
			}
			c.DelChain(chain)
		}
	}
	for _, name := range sortedKeys(have.sets) {
		if _, ok := want.sets[name]; !ok {
			c.DelSet(f.grantSet(name, have.sets[name]))
		}
	}
	for _, name := range sortedKeys(have.addrs) {
		if !want.addrs[name] {
			c.DelSet(f.addrsSet(name))
			if f.dualStack() {
				c.DelSet(f.addrsSet6(addrs6SetName(name)))
			}
		}
	}
	for _, name := range sortedKeys(have.quotas) {
		if _, ok := want.quotas[name]; !ok {
			c.DeleteObject(&nftables.QuotaObj{Table: t, Name: name})
		}
	}
	return nil
}

// listLimitsLocked lists the limit objects in the kernel of every guest
// for which mine is true.
func (f *Firewall) listLimitsLocked(c *nftables.Conn, mine func(netip.Addr) bool) (map[netip.Addr]limitObjects, error) {
	t := f.schema.table
	out := map[netip.Addr]limitObjects{}
	at := func(name string) (limitObjects, netip.Addr, bool) {
		g, ok := limitGuest(name)
		if !ok || !mine(g) {
			return limitObjects{}, g, false
		}
		o, ok := out[g]
		if !ok {
			o = newLimitObjects()
		}
		return o, g, true
	}
	chains, err := c.ListChainsOfTableFamily(t.Family)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name != t.Name {
			continue
		}
		o, g, ok := at(ch.Name)
		if !ok {
			continue
		}
		switch ch.Name {
		case budgetChainName(g):
			o.budgetChain = true
		case grantChainName(g):
			o.grantChain = true
		default:
			continue
		}
		out[g] = o
	}
	sets, err := c.GetSets(t)
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	for _, s := range sets {
		isGrant, isAddrs := strings.HasPrefix(s.Name, "grant_"), strings.HasPrefix(s.Name, "addrs_")
		if !isGrant && !isAddrs {
			continue
		}
		if o, g, ok := at(s.Name); ok {
			if isAddrs {
				o.addrs[s.Name] = true
			} else {
				o.sets[s.Name] = s.Size
			}
			out[g] = o
		}
	}
	objs, err := c.GetObjects(t)
	if err != nil {
		return nil, fmt.Errorf("list objects: %w", err)
	}
	for _, ob := range objs {
		q, ok := ob.(*nftables.QuotaObj)
		if !ok || !strings.HasPrefix(q.Name, "quota_") {
			continue
		}
		if o, g, ok := at(q.Name); ok {
			o.quotas[q.Name] = q.Bytes
			out[g] = o
		}
	}
	return out, nil
}

func (o limitObjects) empty() bool {
	return !o.budgetChain && !o.grantChain && len(o.quotas) == 0 && len(o.sets) == 0 && len(o.addrs) == 0
}

// budgetRules are the rules of budget_<guest>: each entry budget, then the
// session's (a packet to a budgeted entry spends both).
func budgetRules(g netip.Addr, l SessionLimits, sets map[string]*nftables.Set) [][]expr.Any {
	var out [][]expr.Any
	over := func(quota string) []expr.Any {
		return []expr.Any{&expr.Objref{Type: int(nftables.ObjTypeQuota), Name: quota}, &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainDropBudget}}
	}
	for _, e := range l.Entries {
		if e.Budget == 0 {
			continue
		}
		if e.Name != nil {
			a := sets[addrsSetName(g, e.ID)]
			for _, t := range namedTargets(e) {
				r := append(matchNamed(a, t), &expr.Dynset{SrcRegKey: reg1, SetName: a.Name, SetID: a.ID,
					Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: namedBudgetRefresh})
				out = append(out, append(r, over(entryQuotaName(g, e.ID))...))
			}
			continue
		}
		for _, t := range netpolicy.ExpandProto(e.Targets) {
			out = append(out, append(matchTarget(t), over(entryQuotaName(g, e.ID))...))
		}
	}
	if l.EgressBudget > 0 {
		out = append(out, over(sessionQuotaName(g)))
	}
	return out
}

// grantRules are the rules of grants_<guest>: per target of each granted
// entry, a new flow whose 5-tuple the grant's set still takes is accepted
// (as the policy accepts: through the flow budget), any other is refused.
func (env ruleEnv) grantRules(g netip.Addr, l SessionLimits, sets map[string]*nftables.Set) [][]expr.Any {
	var out [][]expr.Any
	for _, e := range l.Entries {
		if e.Connections == 0 {
			continue
		}
		s := sets[grantSetName(g, e.ID, e.Grant)]
		if e.Name != nil {
			out = append(out, grantNamedRules(sets[addrsSetName(g, e.ID)], s, e, env.grantKey())...)
			continue
		}
		for _, t := range netpolicy.ExpandProto(e.Targets) {
			var add []expr.Any
			add = append(add, ctStateIn(expr.CtStateBitNEW)...)
			add = append(add, matchTarget(t)...)
			add = append(add, env.grantKey()...)
			add = append(add, &expr.Dynset{SrcRegKey: reg32(0), SetName: s.Name, SetID: s.ID, Operation: unix.NFT_DYNSET_OP_ADD},
				&expr.Verdict{Kind: expr.VerdictGoto, Chain: chainAcceptNew})
			// New flows only: an ICMP error the guest sends about a
			// flow (related, judged by the policy) is no connection.
			refuse := append(ctStateIn(expr.CtStateBitNEW), matchTarget(t)...)
			out = append(out, add, append(refuse, &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainDropGrantUsed}))
		}
	}
	return out
}

// grantNamedRules are a name entry's grant rules: a new flow to one of
// the name's addresses (on the entry's port) whose 5-tuple the grant's set
// still takes returns to the policy (which accepts it as it accepts the
// name's flows: attested, through the name check where there is one); any
// other is refused.
func grantNamedRules(addrs, grant *nftables.Set, e EntryLimit, key []expr.Any) [][]expr.Any {
	var out [][]expr.Any
	for _, t := range namedTargets(e) {
		add := append(ctStateIn(expr.CtStateBitNEW), matchNamed(addrs, t)...)
		add = append(add, key...)
		add = append(add, &expr.Dynset{SrcRegKey: reg32(0), SetName: grant.Name, SetID: grant.ID, Operation: unix.NFT_DYNSET_OP_ADD},
			&expr.Verdict{Kind: expr.VerdictReturn})
		refuse := append(ctStateIn(expr.CtStateBitNEW), matchNamed(addrs, t)...)
		out = append(out, add, append(refuse, &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainDropGrantUsed}))
	}
	return out
}

// loadFlowKey loads a grant set's key, the flow's 5-tuple, from register
// 32_00 on.
func loadFlowKey() []expr.Any {
	var ex []expr.Any
	ex = append(ex, loadSaddr(reg32(0))...)
	ex = append(ex, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32(1)})
	ex = append(ex, loadSport(reg32(2))...)
	ex = append(ex, loadDaddr(reg32(3))...)
	return append(ex, loadDport(reg32(4))...)
}

// namedBudgetRefresh is how long a name entry's address stays in its set
// after the last packet a budget counted to it (without a new answer): an
// established flow that sends keeps its address, and with it its count.
const namedBudgetRefresh = MaxAttestTimeout

// namedTargets are a name entry's port matches (Prefix unused): one per
// protocol of its port, or one port-less.
func namedTargets(e EntryLimit) []netpolicy.Target {
	if e.Name.Port == 0 {
		return []netpolicy.Target{{}}
	}
	var out []netpolicy.Target
	for _, proto := range protosOf(e.Name.Proto) {
		out = append(out, netpolicy.Target{Port: e.Name.Port, Proto: proto})
	}
	return out
}

// matchNamed matches packets to one of the addresses in set (ip daddr
// @set, left in register 1) and, with a port, t's protocol and port.
func matchNamed(set *nftables.Set, t netpolicy.Target) []expr.Any {
	var ex []expr.Any
	if t.Port != 0 {
		ex = append(ex, l4protoIs(t.Proto)...)
		ex = append(ex, loadDport(reg1)...)
		ex = append(ex, cmpEq(reg1, portKey(t.Port)[:2]))
	}
	ex = append(ex, loadDaddr(reg1)...)
	return append(ex, &expr.Lookup{SourceRegister: reg1, SetName: set.Name, SetID: set.ID})
}

// matchTarget matches packets to t: ip daddr in its prefix and, with a
// port, the protocol and destination port.
func matchTarget(t netpolicy.Target) []expr.Any {
	ex := loadDaddr(reg1)
	if t.Prefix.Bits() < 32 {
		ex = append(ex, &expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: prefixMask(t.Prefix.Bits()), Xor: []byte{0, 0, 0, 0}})
	}
	ex = append(ex, cmpEq(reg1, ipKey(t.Prefix.Masked().Addr())))
	if t.Port != 0 {
		ex = append(ex, l4protoIs(t.Proto)...)
		ex = append(ex, loadDport(reg1)...)
		ex = append(ex, cmpEq(reg1, portKey(t.Port)[:2]))
	}
	return ex
}

// prefixMask is the 4-byte netmask of an IPv4 prefix of length bits.
func prefixMask(bits int) []byte {
	mask := make([]byte, 4)
	for i := range mask {
		switch {
		case bits >= 8:
			mask[i] = 0xff
			bits -= 8
		case bits > 0:
			mask[i] = byte(0xff << (8 - bits))
			bits = 0
		}
	}
	return mask
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// LimitUsage is what a session has used of its limits, read from the
// kernel.
type LimitUsage struct {
	EgressSpent uint64                // bytes counted against EgressBudget
	Entries     map[string]EntryUsage // by EntryLimit.ID
}

// EntryUsage is what a session has used of one entry's limits.
type EntryUsage struct {
	Spent uint64 // bytes counted against Budget
	Used  uint32 // flows counted against Connections
	// Addrs are a name entry's addresses (its address set): those the
	// DNS proxy answered for the name and the limits count.
	Addrs []netip.Addr
}

// LimitUsage reads the guest's quotas and grant sets for l: one request
// per quota, one dump per grant set (each at most its grant's count) and
// one per name entry's address set.
func (f *Firewall) LimitUsage(guest netip.Addr, l SessionLimits) (LimitUsage, error) {
	u := LimitUsage{Entries: map[string]EntryUsage{}}
	if l.Empty() {
		return u, nil
	}
	t := f.schema.table
	spent := func(c *nftables.Conn, name string) (uint64, error) {
		o, err := c.GetObject(&nftables.QuotaObj{Table: t, Name: name})
		if err != nil {
			return 0, fmt.Errorf("get quota %s: %w", name, err)
		}
		q, ok := o.(*nftables.QuotaObj)
		if !ok {
			return 0, fmt.Errorf("get quota %s: not a quota", name)
		}
		return q.Consumed, nil
	}
	err := f.admin.do(func(c *nftables.Conn) error {
		var err error
		if l.EgressBudget > 0 {
			if u.EgressSpent, err = spent(c, sessionQuotaName(guest)); err != nil {
				return err
			}
		}
		for _, e := range l.Entries {
			var eu EntryUsage
			if e.Budget > 0 {
				if eu.Spent, err = spent(c, entryQuotaName(guest, e.ID)); err != nil {
					return err
				}
			}
			if e.Connections > 0 {
				name := grantSetName(guest, e.ID, e.Grant)
				elems, err := c.GetSetElements(f.grantSet(name, e.Connections))
				if err != nil {
					return fmt.Errorf("list set %s: %w", name, err)
				}
				eu.Used = uint32(len(elems))
			}
			if e.Name != nil {
				name := addrsSetName(guest, e.ID)
				elems, err := c.GetSetElements(f.addrsSet(name))
				if err != nil {
					return fmt.Errorf("list set %s: %w", name, err)
				}
				for _, el := range elems {
					if len(el.Key) == 4 {
						eu.Addrs = append(eu.Addrs, netip.AddrFrom4([4]byte(el.Key)))
					}
				}
				if f.dualStack() {
					name6 := addrs6SetName(name)
					elems, err := c.GetSetElements(f.addrsSet6(name6))
					if err != nil {
						return fmt.Errorf("list set %s: %w", name6, err)
					}
					for _, el := range elems {
						if len(el.Key) == 16 {
							eu.Addrs = append(eu.Addrs, netip.AddrFrom16([16]byte(el.Key)))
						}
					}
				}
			}
			u.Entries[e.ID] = eu
		}
		return nil
	})
	if err != nil {
		return LimitUsage{}, fmt.Errorf("read the limits of guest %s: %w", guest, err)
	}
	return u, nil
}
