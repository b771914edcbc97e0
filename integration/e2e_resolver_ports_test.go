package integration

// The resolver ports (53 and 853) of an allowed or scoped host: a
// port-less --scope or --allow opens every port of its host but these
// two, which only an entry naming the port opens (finding 9 of issue 27).

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/integration/world"
)

// TestE2EResolverPortsOfScopedHosts: the world's resolver, 198.18.0.53,
// scoped without a port: another of its ports is reached (the host answers
// a reset: ECONNREFUSED, where the table's reject is EHOSTUNREACH), its
// port 53 is rejected (reason resolver, in why too); an --allow
// 198.18.0.53:53 beside the scope opens it, over UDP and TCP. By name
// (the scope's name resolves to the resolver): the port-less scope alone
// keeps 53 closed (the control), a scope with --allow NAME:53 beside it
// opens it once the name is resolved, and why says so for each.
func TestE2EResolverPortsOfScopedHosts(t *testing.T) {
	e := newE2E(t)
	resolver := e.w.DNS.Addr() // 198.18.0.53:53
	other := netip.AddrPortFrom(resolver.Addr(), 9)

	e.createNetOnly("byaddr", "--scope", resolver.Addr().String())
	ns := e.nsPath("byaddr")
	c, err := world.DialTCP(ns, other, world.ReachTimeout)
	if err == nil {
		c.Close()
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("scoped host, port 9: %v, want the host's own refusal (ECONNREFUSED): the scope opens every other port", err)
	}
	e2eExpect(t,
		e2eDNS(ns, resolver, "api.e2e.test", e2eRejected),
		e2eDNS(ns, e2eAnycastDNS, "api.e2e.test", e2eReach), // the proxy answers (NXDOMAIN: not allowed)
	)
	if a := e.why("byaddr", resolver.String()); a.Reason != "resolver" {
		t.Errorf("why %s: %+v, want reason resolver", resolver, a)
	}
	e.update("byaddr", "--allow", resolver.String())
	if m, err := world.Lookup(ns, resolver, "api.e2e.test", dns.TypeA, false, world.ReachTimeout); err != nil || m.Rcode != dns.RcodeSuccess {
		t.Errorf("direct DNS over UDP with --allow %s beside the scope: %v", resolver, err)
	}
	if m, err := world.Lookup(ns, resolver, "api.e2e.test", dns.TypeA, true, world.ReachTimeout); err != nil || m.Rcode != dns.RcodeSuccess {
		t.Errorf("direct DNS over TCP with --allow %s beside the scope: %v", resolver, err)
	}
	if a := e.why("byaddr", resolver.String()); a.Reason != "static" {
		t.Errorf("why %s after --allow %s: %+v, want reason static", resolver, resolver, a)
	}

	e.w.DNS.AddRR("ns.e2e.test. 300 IN A " + resolver.Addr().String())
	e.createNetOnly("byname", "--scope", "https://ns.e2e.test/")
	e.createNetOnly("byname53", "--scope", "https://ns.e2e.test/", "--allow", "ns.e2e.test:53")
	for _, s := range []string{"byname", "byname53"} {
		e2eLookupWant(t, e.nsPath(s), s, "ns.e2e.test", dns.RcodeSuccess, resolver.Addr().String())
	}
	e2eExpect(t,
		e2eDNS(e.nsPath("byname"), resolver, "api.e2e.test", e2eRejected),
		e2eDNS(e.nsPath("byname53"), resolver, "api.e2e.test", e2eReach),
	)
	// why says what the table does: the name's port-53 entry opens it
	// (attested, naming the answer), the port-less scope alone does not.
	if a := e.why("byname53", resolver.String()); a.Verdict != "allowed" || a.Reason != "attested" {
		t.Errorf("why %s in byname53: %+v, want allowed, attested (--allow ns.e2e.test:53)", resolver, a)
	}
	if a := e.why("byname", resolver.String()); a.Verdict != "rejected" || a.Reason != "resolver" {
		t.Errorf("why %s in byname: %+v, want rejected, resolver (control)", resolver, a)
	}
}
