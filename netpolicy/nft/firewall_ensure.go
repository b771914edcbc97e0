package nft

import (
	"fmt"
	"time"

	"github.com/google/nftables"
)

// chainDef describes one chain of the table.
type chainDef struct {
	name     string
	typ      nftables.ChainType
	hook     *nftables.ChainHook
	priority *nftables.ChainPriority
}

func chainDefs() []chainDef {
	return []chainDef{
		// Regular chains first: base chains' rules jump to them.
		{name: chainAccept},
		{name: chainAcceptReturn},
		{name: chainDrop},
		{name: chainReject},
		{name: chainDropPolicy},
		{name: chainDropLimited},
		{name: chainDropDenied},
		{name: chainDropBudget},
		{name: chainDropGrantUsed},
		{name: chainDropName},
		{name: chainDropQUIC},
		{name: chainNameQueue},
		{name: chainDropNotAllowed},
		{name: chainDropPort},
		{name: chainDropSpecial},
		{name: chainDropResolver},
		{name: chainDropSpoofed},
		{name: chainDropInbound},
		{name: chainFlowLimit},
		{name: chainAcceptNew},
		{name: chainAcceptNamed},
		{name: chainResolver},
		{name: chainPolicy},
		{name: chainRelated},
		{name: chainFromSession},
		{name: chainInputSession},
		{name: chainOutputSession},
		{chainRawPrerouting, nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityRaw},
		{chainRawOutput, nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityRaw},
		{chainForward, nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter},
		{chainInput, nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter},
		{chainOutput, nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter},
		{chainPostrouting, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource},
	}
}

// ruleEnv is what buildRules needs from the configuration.
func (f *Firewall) ruleEnv(set func(string) *nftables.Set) ruleEnv {
	return ruleEnv{prefix: f.cfg.Prefix, pool: f.cfg.Pool, dns: f.cfg.DNSAddr,
		maxFlows: uint32(f.cfg.MaxFlows), flowRate: uint32(f.cfg.FlowRate),
		logRate: uint32(f.cfg.LogRate), logGroup: f.cfg.LogGroup, queue: f.cfg.NameQueue, refresh: f.attested.refresh, set: set,
		pool6: f.cfg.Pool6, dns6: f.cfg.DNS6Addr}
}

// Ensure makes the table match this package's design in one atomic batch:
// it creates the table, every missing set and chain, replaces the rules of
// its own chains and the contents of the "blocked" set (both derived from
// configuration, not from sessions), and never touches session elements.
// A daemon calls it on every start; sessions enforced before a restart keep
// their elements and stay enforced throughout.
//
// An existing set whose type differs from the design (a table from another
// version) is an error: delete the table offline (DeleteTable) to upgrade.
func (f *Firewall) Ensure() error {
	// Whatever the table held before is not known to be there after.
	f.known.forget(everyGuest)
	defer f.known.forget(everyGuest)
	err := f.admin.do(func(c *nftables.Conn) error {
		t := f.schema.table
		exists, err := tableExists(c, t)
		if err != nil {
			return err
		}
		haveSets := map[string]*nftables.Set{}
		haveChains := map[string]bool{}
		if exists {
			sets, err := c.GetSets(t)
			if err != nil {
				return fmt.Errorf("list sets: %w", err)
			}
			for _, s := range sets {
				haveSets[s.Name] = s
			}
			chains, err := c.ListChainsOfTableFamily(t.Family)
			if err != nil {
				return fmt.Errorf("list chains: %w", err)
			}
			for _, ch := range chains {
				if ch.Table.Name == t.Name {
					haveChains[ch.Name] = true
				}
			}
		}
		c.AddTable(t)
		batchSets := map[string]*nftables.Set{}
		for _, name := range f.schema.order {
			want := f.schema.sets[name]
			if have, ok := haveSets[name]; ok {
				if err := compatible(have, want); err != nil {
					return err
				}
				batchSets[name] = want
				continue
			}
			s := f.schema.fresh(name)
			if err := c.AddSet(s, nil); err != nil {
				return fmt.Errorf("encode set %s: %w", name, err)
			}
			batchSets[name] = s
		}
		blocked := batchSets[setBlocked]
		if _, ok := haveSets[setBlocked]; ok {
			c.FlushSet(blocked)
		}
		if err := addElements(c, blocked, blockedElements(f.guard), false); err != nil {
			return err
		}
		// Without the refresh no live element is justified: a restart
		// that turns it off ends every refresh at once.
		if f.attested.maxLife == 0 {
			for _, name := range f.sweptLiveSets() {
				if _, ok := haveSets[name]; ok {
					c.FlushSet(batchSets[name])
				}
			}
		}
		if f.cfg.Pool6.IsValid() {
			blocked6 := batchSets[setBlocked6]
			if _, ok := haveSets[setBlocked6]; ok {
				c.FlushSet(blocked6)
			}
			if err := addElements(c, blocked6, blockedElements6(f.guard), false); err != nil {
				return err
			}
		}
		chains := map[string]*nftables.Chain{}
		for _, d := range f.chainDefs() {
			ch := &nftables.Chain{Name: d.name, Table: t, Type: d.typ, Hooknum: d.hook, Priority: d.priority}
			if d.hook != nil {
				accept := nftables.ChainPolicyAccept
				ch.Policy = &accept
			}
			chains[d.name] = ch
			if haveChains[d.name] {
				c.FlushChain(ch)
			} else {
				c.AddChain(ch)
			}
		}
		env := f.ruleEnv(func(n string) *nftables.Set { return batchSets[n] })
		for _, r := range buildRules(env) {
			c.AddRule(&nftables.Rule{Table: t, Chain: chains[r.chain], Exprs: r.exprs})
		}
		if err := c.Flush(); err != nil {
			return err
		}
		if exists {
			if err := f.seedAttested6Locked(c); err != nil {
				return err
			}
			return f.seedAttestedLocked(c)
		}
		return nil
	})
	if err != nil {
		f.attested.setSeeded(false)
		return fmt.Errorf("ensure table inet %s: %w", f.cfg.Prefix, err)
	}
	f.attested.setSeeded(true)
	if err := f.startMonitor(); err != nil {
		// Enforcement does not depend on it: without it every Attest
		// waits for the kernel. It is retried.
		f.monitorFailed(err)
	}
	return nil
}

// seedAttestedLocked records the attested elements already in the kernel
// (a restarted daemon's), so that the index is complete from now on.
func (f *Firewall) seedAttestedLocked(c *nftables.Conn) error {
	for _, name := range append(append([]string(nil), attestedSets...), liveSets...) {
		elems, err := c.GetSetElements(f.schema.sets[name])
		if err != nil {
			return fmt.Errorf("list set %s: %w", name, err)
		}
		// Now, not before the dump: each element's remaining life was read
		// before this instant, so now+remaining is never early.
		f.attested.seed(name, elems, time.Now())
	}
	return nil
}

// compatible checks that an existing set has the shape this version needs.
func compatible(have, want *nftables.Set) error {
	if want.IsMap && want.DataType.Name == nftables.TypeVerdict.Name && have.IsMap && have.KeyType.Name == nftables.TypeVerdict.Name {
		// google/nftables v0.3.0 decodes a verdict map's data type into
		// KeyType (set.go, NFTA_SET_DATA_TYPE 0xffffff00): the key type
		// is lost, the map and its verdicts are what can be checked.
		h := *have
		h.KeyType = want.KeyType
		have = &h
	}
	if have.KeyType.Name != want.KeyType.Name || have.Interval != want.Interval || have.HasTimeout != want.HasTimeout {
		return fmt.Errorf("set %s exists with type %q (interval %t, timeout %t), want %q (interval %t, timeout %t); delete the table to upgrade",
			have.Name, have.KeyType.Name, have.Interval, have.HasTimeout, want.KeyType.Name, want.Interval, want.HasTimeout)
	}
	return nil
}

// Check reports whether the table and its base chains are in the kernel (a
// health check: it changes nothing). A table deleted behind the daemon's
// back (nft flush ruleset) means nothing is enforced for new sessions and
// nothing is confined for existing ones.
func (f *Firewall) Check() error {
	return f.admin.do(func(c *nftables.Conn) error {
		ok, err := tableExists(c, f.schema.table)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("nftables table inet %s is missing", f.cfg.Prefix)
		}
		chains, err := c.ListChainsOfTableFamily(f.schema.table.Family)
		if err != nil {
			return fmt.Errorf("list chains: %w", err)
		}
		have := map[string]bool{}
		for _, ch := range chains {
			if ch.Table.Name == f.schema.table.Name {
				have[ch.Name] = true
			}
		}
		for _, d := range f.chainDefs() {
			if d.hook != nil && !have[d.name] {
				return fmt.Errorf("chain %s of table inet %s is missing", d.name, f.cfg.Prefix)
			}
		}
		return nil
	})
}
