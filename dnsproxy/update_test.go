package dnsproxy

import (
	"errors"
	"fmt"
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
	err := tp.Update(newPolicy, func(stale, keep []netpolicy.Attestation, _ bool) error { return boom })
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
	if err := tp.Update(newPolicy, func(s, k []netpolicy.Attestation, _ bool) error { stale, keep = s, k; return nil }); err != nil {
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
		func(s, k []netpolicy.Attestation, _ bool) error { stale, keep = s, k; return nil })
	if err != nil || len(stale) != 2 || len(keep) != 0 {
		t.Errorf("second update: err %v, stale %+v, keep %+v: want a.test and c.test stale", err, stale, keep)
	}
	if err := tp.Update(SessionPolicy{Name: "s", Guest: guest2, Mode: netpolicy.ModeAllowlist},
		func(s, k []netpolicy.Attestation, _ bool) error {
			t.Error("apply called for an unknown guest")
			return nil
		}); err == nil {
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
		func(s, k []netpolicy.Attestation, _ bool) error { return nil }); err != nil {
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

// TestAttestLogForgets: past attestLogMax addresses the log drops the
// names noted longest ago and says so at the next split, so that the
// update removes what it can no longer name; the kept log starts clean.
func TestAttestLogForgets(t *testing.T) {
	cs, err := compile(SessionPolicy{Name: "s", Guest: guest1, Mode: netpolicy.ModeAllowlist, Allow: entries("*.flood.test")})
	if err != nil {
		t.Fatal(err)
	}
	l := newAttestLog()
	l.note("old.test", mustAddrs("198.18.1.10"), nil)
	if _, _, _, forgot := l.split(cs); forgot {
		t.Fatal("a log within its bound says it forgot")
	}
	next := netip.MustParseAddr("198.19.0.1")
	for i := 0; l.size < attestLogMax; i++ {
		var as []netip.Addr
		for range min(32, attestLogMax-l.size) {
			as, next = append(as, next), next.Next()
		}
		l.note(fmt.Sprintf("n%d.flood.test", i), as, nil)
	}
	if l.byName["old.test"] == nil {
		t.Fatal("old.test forgotten before the bound was passed")
	}
	l.note("last.flood.test", []netip.Addr{next}, nil)
	if l.byName["old.test"] != nil || l.size > attestLogMax {
		t.Fatalf("past the bound: old.test kept %v, size %d", l.byName["old.test"] != nil, l.size)
	}
	kept, keep, stale, forgot := l.split(cs)
	if !forgot {
		t.Error("split does not say the log forgot old.test")
	}
	if len(stale) != 0 || len(keep) != len(l.byName) {
		t.Errorf("split: %d stale, %d kept of %d names", len(stale), len(keep), len(l.byName))
	}
	if _, _, _, again := kept.split(cs); again {
		t.Error("the kept log says it forgot")
	}
}
