package nft

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/enforcerd/enforcerd/netpolicy"
)

func TestLimitObjectNames(t *testing.T) {
	g := netip.MustParseAddr("10.20.0.6")
	for _, name := range []string{budgetChainName(g), grantChainName(g), sessionQuotaName(g), entryQuotaName(g, "1a2b3c4d"), grantSetName(g, "1a2b3c4d", "12"), addrsSetName(g, "1a2b3c4d")} {
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
		sets:   map[string]uint32{"grant_0a140006_aa_0": 3}, addrs: map[string]bool{}}
	if got := wantedLimits(g, l); !reflect.DeepEqual(got, want) {
		t.Errorf("wantedLimits:\n got  %+v\n want %+v", got, want)
	}
	if !(SessionLimits{}).Empty() || l.Empty() {
		t.Error("Empty")
	}
	if err := (SessionLimits{Entries: []EntryLimit{{ID: "A-1"}}}).check(false); err == nil {
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
	rules := append(budgetRules(g, l, sets), env.grantRules(g, l, sets)...)
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

// TestNamedLimitRules: a name entry's limits match its address set (and
// its port); the grant's counting rule returns to the policy (which
// decides as for any name) rather than accepting, the refusing rule goes
// to drop_grant_used, and the budget refreshes the address it counts.
func TestNamedLimitRules(t *testing.T) {
	g := netip.MustParseAddr("10.20.0.6")
	name, err := netpolicy.ParseEntry("api.example.com:443/tcp", nil)
	if err != nil {
		t.Fatal(err)
	}
	l := SessionLimits{Entries: []EntryLimit{{ID: "aa", Name: &name, Connections: 3, Grant: "0", Budget: 9}}}
	want := limitObjects{budgetChain: true, grantChain: true,
		quotas: map[string]uint64{"quota_0a140006_aa": 9}, sets: map[string]uint32{"grant_0a140006_aa_0": 3},
		addrs: map[string]bool{"addrs_0a140006_aa": true}}
	if got := wantedLimits(g, l); !reflect.DeepEqual(got, want) {
		t.Errorf("wantedLimits:\n got  %+v\n want %+v", got, want)
	}
	addrs, grant := addrsSetName(g, "aa"), grantSetName(g, "aa", "0")
	sets := map[string]*nftables.Set{addrs: {Name: addrs}, grant: {Name: grant}}
	grants := ruleEnv{}.grantRules(g, l, sets)
	if len(grants) != 2 {
		t.Fatalf("%d grant rules, want 2 (count, refuse; TCP only)", len(grants))
	}
	lookups := func(r []expr.Any) (n int) {
		for _, e := range r {
			if lk, ok := e.(*expr.Lookup); ok && lk.SetName == addrs {
				n++
			}
		}
		return n
	}
	last := func(r []expr.Any) *expr.Verdict { v, _ := r[len(r)-1].(*expr.Verdict); return v }
	if v := last(grants[0]); v == nil || v.Kind != expr.VerdictReturn || lookups(grants[0]) != 1 {
		t.Errorf("the counting rule: %v, want a lookup of %s and return", grants[0], addrs)
	}
	if v := last(grants[1]); v == nil || v.Chain != chainDropGrantUsed || lookups(grants[1]) != 1 {
		t.Errorf("the refusing rule: %v, want a lookup of %s and goto %s", grants[1], addrs, chainDropGrantUsed)
	}
	budget := budgetRules(g, l, sets)
	if len(budget) != 1 || lookups(budget[0]) != 1 {
		t.Fatalf("budget rules %v, want one looking up %s", budget, addrs)
	}
	refreshed := false
	for _, e := range budget[0] {
		if d, ok := e.(*expr.Dynset); ok && d.SetName == addrs && d.Timeout == namedBudgetRefresh {
			refreshed = true
		}
	}
	if !refreshed {
		t.Errorf("the budget rule does not refresh the address it counts: %v", budget[0])
	}
}

// TestNamedIndex: an answer's name matches the session's limited entries
// by the grammar (exact, wildcard), and no other session's.
func TestNamedIndex(t *testing.T) {
	g, other := netip.MustParseAddr("10.20.0.6"), netip.MustParseAddr("10.20.0.10")
	exact, _ := netpolicy.ParseEntry("api.example.com:443", nil)
	wild, _ := netpolicy.ParseEntry("*.cdn.example.com", nil)
	var x namedIndex
	x.set(g, namedOf(g, SessionLimits{Entries: []EntryLimit{
		{ID: "aa", Name: &exact, Connections: 1, Grant: "0"},
		{ID: "bb", Name: &wild, Budget: 10},
		{ID: "cc", Targets: []netpolicy.Target{{Prefix: netip.MustParsePrefix("198.18.1.10/32")}}, Budget: 10},
	}}))
	for _, c := range []struct {
		guest netip.Addr
		name  string
		want  []string
	}{
		{g, "api.example.com", []string{addrsSetName(g, "aa")}},
		{g, "API.example.com", []string{addrsSetName(g, "aa")}},
		{g, "x.cdn.example.com", []string{addrsSetName(g, "bb")}},
		{g, "cdn.example.com", nil},
		{g, "a.b.cdn.example.com", nil},
		{g, "other.example.com", nil},
		{other, "api.example.com", nil},
	} {
		if got := x.sets(c.guest, c.name); !reflect.DeepEqual(got, c.want) {
			t.Errorf("sets(%s, %s) = %v, want %v", c.guest, c.name, got, c.want)
		}
	}
	x.set(g, nil)
	if got := x.sets(g, "api.example.com"); got != nil {
		t.Errorf("after forgetting the guest: %v", got)
	}
}

func TestMergeNamed(t *testing.T) {
	k := func(s string) []byte { return ipKey(netip.MustParseAddr(s)) }
	reqs := []attestReq{
		{named: []namedElems{{set: "addrs_a", elems: []nftables.SetElement{{Key: k("1.1.1.1"), Timeout: time.Minute}}}}},
		{named: []namedElems{{set: "addrs_a", elems: []nftables.SetElement{{Key: k("1.1.1.1"), Timeout: time.Hour}, {Key: k("2.2.2.2"), Timeout: time.Minute}}}}},
		{named: []namedElems{{set: "addrs_b", elems: []nftables.SetElement{{Key: k("1.1.1.1"), Timeout: time.Second}}}}},
	}
	want := []namedElems{
		{set: "addrs_a", elems: []nftables.SetElement{{Key: k("1.1.1.1"), Timeout: time.Hour}, {Key: k("2.2.2.2"), Timeout: time.Minute}}},
		{set: "addrs_b", elems: []nftables.SetElement{{Key: k("1.1.1.1"), Timeout: time.Second}}},
	}
	if got := mergeNamed(reqs, false); !reflect.DeepEqual(got, want) {
		t.Errorf("mergeNamed:\n got  %+v\n want %+v", got, want)
	}
	// The v6 address sets' elements merge apart from the v4 ones.
	k6 := func(s string) []byte { return ip6Key(netip.MustParseAddr(s)) }
	reqs[0].named6 = []namedElems{{set: "addrs6_a", elems: []nftables.SetElement{{Key: k6("2001:db8::1"), Timeout: time.Minute}}}}
	reqs[2].named6 = []namedElems{{set: "addrs6_a", elems: []nftables.SetElement{{Key: k6("2001:db8::1"), Timeout: time.Hour}}}}
	want6 := []namedElems{{set: "addrs6_a", elems: []nftables.SetElement{{Key: k6("2001:db8::1"), Timeout: time.Hour}}}}
	if got := mergeNamed(reqs, true); !reflect.DeepEqual(got, want6) {
		t.Errorf("mergeNamed v6:\n got  %+v\n want %+v", got, want6)
	}
	if got := mergeNamed(reqs, false); !reflect.DeepEqual(got, want) {
		t.Errorf("mergeNamed v4 with v6 requests:\n got  %+v\n want %+v", got, want)
	}
}
