package nft

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/enforcerd/enforcerd/netpolicy"
)

func TestLimitObjectNames(t *testing.T) {
	g := netip.MustParseAddr("10.20.0.6")
	for _, name := range []string{budgetChainName(g), grantChainName(g), sessionQuotaName(g), entryQuotaName(g, "1a2b3c4d"), grantSetName(g, "1a2b3c4d", "12")} {
		if got, ok := limitGuest(name); !ok || got != g {
			t.Errorf("limitGuest(%q) = %v, %t; want %v", name, got, ok, g)
		}
	}
	// The table's own sets and chains are no guest's.
	for _, name := range []string{setBudgetChains, setGrantChains, chainDropBudget, chainDropGrantUsed, "grant_0a14", "quota_0a1400zz"} {
		if got, ok := limitGuest(name); ok {
			t.Errorf("limitGuest(%q) = %v, want no guest", name, got)
		}
	}
}

func TestWantedLimits(t *testing.T) {
	g := netip.MustParseAddr("10.20.0.6")
	l := SessionLimits{EgressBudget: 100, Entries: []EntryLimit{
		{ID: "aa", Targets: []netpolicy.Target{{Prefix: netip.MustParsePrefix("198.18.1.10/32"), Port: 7}}, Connections: 3, Grant: "0"},
		{ID: "bb", Targets: []netpolicy.Target{{Prefix: netip.MustParsePrefix("198.18.2.0/24")}}, Budget: 50},
	}}
	want := limitObjects{budgetChain: true, grantChain: true,
		quotas: map[string]uint64{"quota_0a140006": 100, "quota_0a140006_bb": 50},
		sets:   map[string]uint32{"grant_0a140006_aa_0": 3}}
	if got := wantedLimits(g, l); !reflect.DeepEqual(got, want) {
		t.Errorf("wantedLimits:\n got  %+v\n want %+v", got, want)
	}
	if !(SessionLimits{}).Empty() || l.Empty() {
		t.Error("Empty")
	}
	if err := (SessionLimits{Entries: []EntryLimit{{ID: "A-1"}}}).check(); err == nil {
		t.Error("check accepted an ID nft names cannot carry")
	}
}

// TestLimitRulesReferenceTheTable: the limit chains' verdicts go to chains
// of the table, and their dynsets to the grant sets given.
func TestLimitRulesReferenceTheTable(t *testing.T) {
	g := netip.MustParseAddr("10.20.0.6")
	l := SessionLimits{EgressBudget: 100, Entries: []EntryLimit{
		{ID: "aa", Targets: []netpolicy.Target{{Prefix: netip.MustParsePrefix("198.18.1.10/32"), Port: 7}}, Connections: 3, Grant: "0", Budget: 9},
	}}
	chains := map[string]bool{}
	for _, d := range chainDefs() {
		chains[d.name] = true
	}
	sets := map[string]*nftables.Set{grantSetName(g, "aa", "0"): {Name: grantSetName(g, "aa", "0")}}
	env := ruleEnv{}
	rules := append(budgetRules(g, l), env.grantRules(g, l, sets)...)
	// A port entry is two targets (TCP and UDP): two budget rules and
	// four grant rules, then the session's budget.
	if len(rules) != 2+1+4 {
		t.Fatalf("%d rules, want 7", len(rules))
	}
	for _, r := range rules {
		for _, e := range r {
			switch e := e.(type) {
			case *expr.Verdict:
				if !chains[e.Chain] {
					t.Errorf("verdict to %q, not a chain of the table", e.Chain)
				}
			case *expr.Dynset:
				if sets[e.SetName] == nil {
					t.Errorf("dynset to %q, not a grant set", e.SetName)
				}
			}
		}
	}
}
