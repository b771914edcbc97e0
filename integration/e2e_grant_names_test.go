package integration

// Counted limits on name entries (issue 24): --allow NAME --connections N
// and --allow NAME --budget SIZE count, in the kernel, the flows and bytes
// to the addresses the DNS proxy answered for the name (per session and
// entry), and hold across a kill -9.

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/enforcerd/enforcerd/api"
)

// grantRemaining is what inspect says is left of the count of entry, in
// whichever grant holds it.
func grantRemaining(t *testing.T, in api.SessionInfo, entry string) uint32 {
	t.Helper()
	for _, g := range in.Policy.Grants {
		if n, ok := g.Remaining[entry]; ok {
			return n
		}
	}
	t.Fatalf("%s: no grant has a remaining count for %s: %+v", in.Name, entry, in.Policy.Grants)
	return 0
}

// TestE2EGrantConnectionsName: a 3-connection grant on a NAME lets three
// new connections to the name's address through and refuses the fourth
// (grant-used: why by address and by name, the grant_used event, the flow
// event, inspect's 0 left). The controls: another session allowed the same
// name, whose answers and connections come first, neither spends the grant
// nor is limited by it; the session's own unlimited name keeps passing. The
// count is the kernel's: two used before a kill -9 leave one after it; a
// wildcard's grant whose only answer comes after the kill -9 counts too
// (its address set is filled by the restarted daemon's answers).
func TestE2EGrantConnectionsName(t *testing.T) {
	e := newE2E(t)
	const entry, wild = "api.grants.e2e.test:7", "*.cdn.grants.e2e.test:7"
	const addr, wildAddr = "198.18.1.10:7", "198.18.2.10:7"
	e.w.DNS.AddRR("api.grants.e2e.test. 300 IN A 198.18.1.10")
	e.w.DNS.AddRR("other.grants.e2e.test. 300 IN A 198.18.1.11")
	e.w.DNS.AddRR("x.cdn.grants.e2e.test. 300 IN A 198.18.2.10")
	e.createNetOnly("gn", "--allow", entry, "--connections", "3")
	e.update("gn", "--allow", "other.grants.e2e.test")
	e.update("gn", "--allow", wild, "--connections", "1")
	e.createNetOnly("gnc", "--allow", entry, "--allow", wild)
	ns, other := e.nsPath("gn"), e.nsPath("gnc")

	// The control session resolves and connects first: none of it is gn's.
	e.resolveTo("gnc", "api.grants.e2e.test", "198.18.1.10")
	e.resolveTo("gnc", "x.cdn.grants.e2e.test", "198.18.2.10")
	for i := range 2 {
		e2eEcho(t, "control "+string(rune('1'+i)), e2eDial(t, other, addr))
	}
	e2eEcho(t, "control wildcard", e2eDial(t, other, wildAddr))
	in := e.inspect("gn")
	if n := grantRemaining(t, in, entry); n != 3 {
		t.Fatalf("remaining after another session's answers and connections: %d, want 3", n)
	}
	if n := grantRemaining(t, in, wild); n != 1 {
		t.Fatalf("the wildcard's remaining after another session's answers and connections: %d, want 1", n)
	}

	e.resolveTo("gn", "api.grants.e2e.test", "198.18.1.10")
	e.resolveTo("gn", "other.grants.e2e.test", "198.18.1.11")
	for i := range 2 {
		e2eEcho(t, "name grant use "+string(rune('1'+i)), e2eDial(t, ns, addr))
	}
	if n := grantRemaining(t, e.inspect("gn"), entry); n != 1 {
		t.Fatalf("remaining after two connections: %d, want 1", n)
	}

	e.restartWith(syscall.SIGKILL)
	if n := grantRemaining(t, e.inspect("gn"), entry); n != 1 {
		t.Fatalf("remaining after a kill -9: %d, want 1", n)
	}
	e.resolveTo("gn", "api.grants.e2e.test", "198.18.1.10") // a fresh answer refreshes, never resets
	e2eEcho(t, "name grant use 3, after the kill -9", e2eDial(t, ns, addr))
	e2eExpect(t,
		e2eTCP(ns, addr, e2eRejected),
		e2eTCP(ns, "198.18.1.11:7", e2eReach), // the session's unlimited name
		e2eTCP(other, addr, e2eReach),         // another session, same name
		e2eTCP(other, addr, e2eReach),
		e2eTCP(other, addr, e2eReach),
	)
	if n := grantRemaining(t, e.inspect("gn"), entry); n != 0 {
		t.Errorf("remaining after the fourth: %d, want 0", n)
	}
	// The wildcard's first answer to gn comes after the kill -9.
	e.resolveTo("gn", "x.cdn.grants.e2e.test", "198.18.2.10")
	e2eEcho(t, "the wildcard's one use", e2eDial(t, ns, wildAddr))
	e2eExpect(t, e2eTCP(ns, wildAddr, e2eRejected), e2eTCP(other, wildAddr, e2eReach))
	if n := grantRemaining(t, e.inspect("gn"), wild); n != 0 {
		t.Errorf("the wildcard's remaining after its use: %d, want 0", n)
	}

	for _, dest := range []string{addr, entry} {
		if a := e.why("gn", dest); a.Reason != "grant-used" || a.Verdict == api.WhyAllowed || a.Entry != entry {
			t.Errorf("why gn %s: %+v, want grant-used naming %s", dest, a, entry)
		}
	}
	if a := e.why("gn", "x.cdn.grants.e2e.test:7"); a.Reason != "grant-used" || a.Entry != wild {
		t.Errorf("why gn x.cdn.grants.e2e.test:7: %+v, want grant-used naming %s", a, wild)
	}
	if a := e.why("gnc", addr); a.Verdict != api.WhyAllowed {
		t.Errorf("why %s for the control session: %+v", addr, a)
	}
	e.eventually("grant-used flow events and a grant_used event per entry", func() error {
		if n := len(e.eventLines("gn", "grant_used")); n != 2 {
			return errors.New("grant_used events: " + strings.Join(e.eventLines("gn", "grant_used"), "\n"))
		}
		if len(e.flowLines("gn", "grant-used")) < 2 {
			return errors.New("fewer than two flow events with reason grant-used")
		}
		return nil
	})
	if len(e.eventLines("gnc", "grant_used"))+len(e.flowLines("gnc", "grant-used")) != 0 {
		t.Errorf("the control session has grant-used events")
	}

	// Removing the session removes its chain and sets, address sets included.
	addrs := map[string]bool{}
	for _, o := range e.limitObjects(t) {
		if strings.HasPrefix(o, "addrs_") {
			addrs[o] = true
		}
	}
	if len(addrs) != 2 {
		t.Fatalf("positive control: %d address sets in the table before the removal, want 2: %v", len(addrs), e.limitObjects(t))
	}
	e.cli("session", "rm", "gn")
	if objs := e.limitObjects(t); len(objs) != 0 {
		t.Errorf("limit objects left after the session's removal: %v", objs)
	}
}

// TestE2EBudgetName: --budget on a NAME stops an upload to the name's
// address at the budget, across a kill -9; the controls: another session
// uploading to the same name uploads in full, and the session's other
// name still echoes.
func TestE2EBudgetName(t *testing.T) {
	e := newE2E(t)
	const sinkAt, size, budget = "198.18.1.10:9000", 4 << 20, 1 << 20
	const entry = "up.budget.e2e.test:9000"
	sink := startByteSink(t, e, sinkAt)
	t.Cleanup(sink.closeAll)
	e.w.DNS.AddRR("up.budget.e2e.test. 300 IN A 198.18.1.10")
	e.w.DNS.AddRR("echo.budget.e2e.test. 300 IN A 198.18.1.11")
	e.createNetOnly("bn", "--allow", entry, "--budget", "1MiB")
	e.update("bn", "--allow", "echo.budget.e2e.test:7")
	e.createNetOnly("bnc", "--allow", entry)
	ns := e.nsPath("bn")
	e.resolveTo("bnc", "up.budget.e2e.test", "198.18.1.10")
	if _, ok := upload(t, e.nsPath("bnc"), sinkAt, size); !ok {
		t.Errorf("the control session's upload to the name (no budget) did not complete")
	}
	if g := e.inspect("bn").Policy.Grants; len(g) == 0 || g[0].Spent[entry] != 0 {
		t.Errorf("the budget after another session's upload: %+v, want untouched", g)
	}
	e.resolveTo("bn", "up.budget.e2e.test", "198.18.1.10")
	e.resolveTo("bn", "echo.budget.e2e.test", "198.18.1.11")
	from, ok := upload(t, ns, sinkAt, size)
	if ok {
		t.Fatalf("the upload of %d bytes under a name's budget of %d completed", size, budget)
	}
	if got := sink.received(from); got > budget || got < budget*3/4 {
		t.Errorf("the server received %d bytes under the name's budget, want at most %d and close to it", got, budget)
	}
	e2eExpect(t, e2eTCP(ns, sinkAt, e2eRejected), e2eTCP(ns, "198.18.1.11:7", e2eReach))
	if g := e.inspect("bn").Policy.Grants; len(g) == 0 || g[0].Spent[entry] < budget {
		t.Errorf("the name's budget after the upload: %+v", g)
	}
	for _, dest := range []string{sinkAt, entry} {
		if a := e.why("bn", dest); a.Reason != "budget" || a.Verdict == api.WhyAllowed || a.Entry != entry {
			t.Errorf("why bn %s: %+v, want budget naming %s", dest, a, entry)
		}
	}
	e.restartWith(syscall.SIGKILL)
	e.resolveTo("bn", "up.budget.e2e.test", "198.18.1.10")
	e2eExpect(t, e2eTCP(ns, sinkAt, e2eRejected), e2eTCP(ns, "198.18.1.11:7", e2eReach))
	if g := e.inspect("bn").Policy.Grants; len(g) == 0 || g[0].Spent[entry] < budget {
		t.Errorf("the name's budget after a kill -9: %+v, want spent", g)
	}
	e.eventually("one budget_spent event", func() error {
		if n := len(e.eventLines("bn", "budget_spent")); n != 1 {
			return errors.New("budget_spent events: " + strings.Join(e.eventLines("bn", "budget_spent"), "\n"))
		}
		return nil
	})
	// Raised: the name's uploads pass again.
	e.update("bn", "--allow", entry, "--budget", "3MiB")
	if _, ok := upload(t, ns, sinkAt, 1<<20); !ok {
		t.Errorf("the upload after the name's budget was raised did not complete")
	}
}
