package dnsproxy

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// TestUpdateSplitsAttestationsAndSwapsOnce: apply is handed the
// attestations of the names the new policy drops (stale) and keeps; a
// failed apply leaves the old policy answering; a successful one makes the
// new policy answer, and a name newly allowed resolves.
func TestUpdateSplitsAttestationsAndSwapsOnce(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{
		"a.test.": {"a.test. 60 IN A 198.18.1.10"},
		"b.test.": {"b.test. 60 IN A 198.18.1.10", "b.test. 60 IN A 198.18.1.11"},
		"c.test.": {"c.test. 60 IN A 198.18.1.12"},
	}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test", "b.test")
	for _, n := range []string{"a.test.", "b.test."} {
		if r := tp.ask(t, guest1, query(n, dns.TypeA), false); r.Rcode != dns.RcodeSuccess {
			t.Fatalf("%s before the update: %v", n, r)
		}
	}
	newPolicy := SessionPolicy{Name: "s", Guest: guest1, Mode: netpolicy.ModeAllowlist, Allow: entries("a.test", "c.test")}

	boom := errors.New("kernel said no")
	err := tp.Update(newPolicy, func(stale, keep []netpolicy.Attestation) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("failed apply: Update = %v, want its error", err)
	}
	if r := tp.ask(t, guest1, query("c.test.", dns.TypeA), false); r.Rcode != dns.RcodeNameError {
		t.Fatalf("after a failed update c.test answered %v: the old policy must hold", dns.RcodeToString[r.Rcode])
	}
	if r := tp.ask(t, guest1, query("b.test.", dns.TypeA), false); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("after a failed update b.test: %v", r)
	}

	var stale, keep []netpolicy.Attestation
	if err := tp.Update(newPolicy, func(s, k []netpolicy.Attestation) error { stale, keep = s, k; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(stale) != 1 || !slices.Equal(stale[0].Addrs, mustAddrs("198.18.1.10", "198.18.1.11")) {
		t.Errorf("stale = %+v, want b.test's two addresses", stale)
	}
	if len(keep) != 1 || !slices.Equal(keep[0].Addrs, mustAddrs("198.18.1.10")) {
		t.Errorf("keep = %+v, want a.test's address (it keeps 198.18.1.10 attested)", keep)
	}
	if r := tp.ask(t, guest1, query("b.test.", dns.TypeA), false); r.Rcode != dns.RcodeNameError {
		t.Errorf("b.test after its revoke: %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	if r := tp.ask(t, guest1, query("c.test.", dns.TypeA), false); r.Rcode != dns.RcodeSuccess {
		t.Errorf("c.test after the widen: %v", r)
	}
	// The kept log goes on: a second update that drops a.test names it stale.
	err = tp.Update(SessionPolicy{Name: "s", Guest: guest1, Mode: netpolicy.ModeAllowlist},
		func(s, k []netpolicy.Attestation) error { stale, keep = s, k; return nil })
	if err != nil || len(stale) != 2 || len(keep) != 0 {
		t.Errorf("second update: err %v, stale %+v, keep %+v: want a.test and c.test stale", err, stale, keep)
	}
	if err := tp.Update(SessionPolicy{Name: "s", Guest: guest2, Mode: netpolicy.ModeAllowlist},
		func(s, k []netpolicy.Attestation) error { t.Error("apply called for an unknown guest"); return nil }); err == nil {
		t.Error("update of an unregistered guest succeeded")
	}
}

// TestUpdateEndsQueriesInFlight: a query waiting for its upstream when its
// session's policy is updated attests nothing under the old policy: it
// gets SERVFAIL, and the attester sees no call for it.
func TestUpdateEndsQueriesInFlight(t *testing.T) {
	up, release := heldUpstream(t)
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.Timeout = 5 * time.Second })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	inFlight := goAsk(t, tp, guest1)
	waitQueries(t, up, 1)
	if err := tp.Update(SessionPolicy{Name: "s", Guest: guest1, Mode: netpolicy.ModeAllowlist},
		func(s, k []netpolicy.Attestation) error { return nil }); err != nil {
		t.Fatal(err)
	}
	close(release)
	if r := recv(t, inFlight, 5*time.Second); r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("query in flight across the revoke: %s, want SERVFAIL", dns.RcodeToString[r.Rcode])
	}
	if calls := tp.att.Calls(); len(calls) != 0 {
		t.Fatalf("attested %+v under a policy no longer in force", calls)
	}
}
