package daemon

import (
	"context"
	"net/netip"
	"reflect"
	"testing"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// TestLimitsFromGrants: the kernel limits come from the record: a grant's
// count and budget per address entry, a later grant of the entry
// replacing the earlier one's count with a fresh one (a new Grant name),
// an update's egress budget; a name entry's limit names the entry (its
// addresses are the answers'), refused in public mode with one line.
func TestLimitsFromGrants(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	_, err := w.d.Create(ctx, api.CreateRequest{Name: "l0", NetworkOnly: true, Egress: "public", Allow: []string{"a.example.com"}, Connections: 3})
	if want := `allow "a.example.com" with connections or a budget in egress public: want egress allowlist (public mode attests no answer, so a name's flows cannot be told apart)`; err == nil || err.Error() != want || api.StatusOf(err) != 400 {
		t.Errorf("connections for a name in public mode: %v, want %s", err, want)
	}
	// A name's limit: its entry, matched against the answers (the
	// firewall's address set), no targets.
	in, err := w.d.Create(ctx, api.CreateRequest{Name: "ln", NetworkOnly: true, Allow: []string{"api.example.com:443", "*.example.org"}, Connections: 2})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range w.fw.rules[netip.MustParseAddr(in.GuestIP)].Limits.Entries {
		if e.Name == nil || e.Targets != nil || e.Connections != 2 {
			t.Errorf("a name's limit: %+v", e)
			continue
		}
		names = append(names, e.Name.String())
	}
	if want := []string{"api.example.com:443", "*.example.org"}; !reflect.DeepEqual(names, want) {
		t.Errorf("limited names %v, want %v", names, want)
	}
	if _, err := w.d.UpdatePolicy(ctx, "ln", api.PolicyUpdate{Egress: "public"}, false); err == nil || api.StatusOf(err) != 400 {
		t.Errorf("a switch to public mode under a name's count: %v, want refused", err)
	}
	_, err = w.d.Create(ctx, api.CreateRequest{Name: "l0", NetworkOnly: true, Allow: []string{"93.184.216.1:53"}, Connections: 3})
	if want := `allow "93.184.216.1:53" with connections: want a port other than 53 and 853 (DNS and DoT flows are not counted)`; err == nil || err.Error() != want || api.StatusOf(err) != 400 {
		t.Errorf("connections for a resolver port: %v, want %s", err, want)
	}
	in, err = w.d.Create(ctx, api.CreateRequest{Name: "l1", NetworkOnly: true, Allow: []string{"93.184.216.1:443", "93.184.216.0/28"}, Connections: 3, Budget: 1000, EgressBudget: 5000})
	if err != nil {
		t.Fatal(err)
	}
	guest := netip.MustParseAddr(in.GuestIP)
	target := func(p string, port uint16) []netpolicy.Target {
		return []netpolicy.Target{{Prefix: netip.MustParsePrefix(p), Port: port}}
	}
	want := nft.SessionLimits{EgressBudget: 5000, Entries: []nft.EntryLimit{
		{ID: entryID("93.184.216.1:443"), Targets: target("93.184.216.1/32", 443), Budget: 1000, Connections: 3, Grant: "0"},
		{ID: entryID("93.184.216.0/28"), Targets: target("93.184.216.0/28", 0), Budget: 1000, Connections: 3, Grant: "0"},
	}}
	if got := w.fw.rules[guest].Limits; !reflect.DeepEqual(got, want) {
		t.Errorf("limits after create:\n got  %+v\n want %+v", got, want)
	}
	if _, err := w.d.UpdatePolicy(ctx, "l1", api.PolicyUpdate{Allow: []string{"93.184.216.1:443"}, Connections: 5, EgressBudget: 9000}, false); err != nil {
		t.Fatal(err)
	}
	want.EgressBudget = 9000
	want.Entries[0].Connections, want.Entries[0].Grant = 5, "1" // a fresh count; the budget stays the first grant's
	if got := w.fw.lastUpdate.New.Limits; !reflect.DeepEqual(got, want) {
		t.Errorf("limits after the update:\n got  %+v\n want %+v", got, want)
	}
	if _, err := w.d.UpdatePolicy(ctx, "l1", api.PolicyUpdate{Revoke: []string{"93.184.216.0/28"}}, false); err != nil {
		t.Fatal(err)
	}
	want.Entries = want.Entries[:1] // a revoked entry has no limit left
	if got := w.fw.lastUpdate.New.Limits; !reflect.DeepEqual(got, want) {
		t.Errorf("limits after the revoke:\n got  %+v\n want %+v", got, want)
	}
}
