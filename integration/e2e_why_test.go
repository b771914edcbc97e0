package integration

// session why answers from the daemon's data and the kernel's sets, in the
// words the flow events use, and its verdicts agree with what a connection
// from the session really meets.

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

func TestE2ESessionWhy(t *testing.T) {
	e := newE2E(t)
	e.createNetOnly("agent", "--allow", "api.e2e.test", "--allow", "198.18.1.11/32:7")
	e.createNetOnly("open", "--egress", "public")
	e.createNetOnly("quiet", "--allow", "api.e2e.test", "--on-deny", "drop")
	e.create("sealed")
	why := func(session, dest string) api.WhyAnswer {
		t.Helper()
		out := e.cli("session", "why", session, dest, "--json")
		var a api.WhyAnswer
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("why %s %s: %v\n%s", session, dest, err, out)
		}
		return a
	}
	for _, tc := range []struct {
		session, dest   string
		verdict, reason string
		detailHas       string
	}{
		{"agent", "198.18.1.11:7", api.WhyAllowed, "static", "198.18.1.11:7"},
		// (agent answers its policy's drops: reject is the default on-deny)
		{"agent", "198.18.1.11:80", api.WhyRejected, "port", "198.18.1.11:7"},
		{"agent", "198.18.2.10:80", api.WhyRejected, "not-allowed", ""},
		{"agent", "169.254.169.254:80", api.WhyRejected, "special-purpose", "169.254.0.0/16"},
		{"agent", "198.18.0.53:53/udp", api.WhyRejected, "resolver", ""},
		// (quiet asked for silence: the same refusals are drops)
		{"quiet", "198.18.2.10:80", api.WhyDropped, "not-allowed", ""},
		{"quiet", "169.254.169.254:80", api.WhyDropped, "special-purpose", "169.254.0.0/16"},
		{"agent", "other.e2e.test", api.WhyNXDomain, "not-allowed", "never asks upstream"},
		{"open", "198.18.2.10:80", api.WhyAllowed, "public", ""},
		{"sealed", "198.18.1.10", api.WhyDropped, "no-network", ""},
	} {
		a := why(tc.session, tc.dest)
		if a.Verdict != tc.verdict || a.Reason != tc.reason || !strings.Contains(a.Detail, tc.detailHas) {
			t.Errorf("why %s %s: %s (%s) %q, want %s (%s) mentioning %q", tc.session, tc.dest, a.Verdict, a.Reason, a.Detail, tc.verdict, tc.reason, tc.detailHas)
		}
	}
	if e.w.DNS.QueriedName("other.e2e.test") {
		t.Error("why sent a name the policy refuses upstream")
	}

	// A name the policy allows: resolved, each address judged; after the
	// session's own lookup its address is attested, with an expiry.
	a := why("agent", "api.e2e.test:80")
	if a.Verdict != api.WhyAllowed || len(a.Addrs) != 1 || a.Addrs[0].IP != "198.18.1.10" {
		t.Fatalf("why agent api.e2e.test:80: %+v", a)
	}
	if rcode, addrs := e2eLookup(t, e.nsPath("agent"), "api.e2e.test"); rcode != 0 || !slices.Equal(addrs, []string{"198.18.1.10"}) {
		t.Fatalf("lookup: %d %v", rcode, addrs)
	}
	b := why("agent", "198.18.1.10:80")
	if b.Verdict != api.WhyAllowed || b.Reason != "attested" {
		t.Errorf("why 198.18.1.10:80 after the lookup: %+v", b)
	}

	// The verdicts agree with the datapath.
	ns := e.nsPath("agent")
	for _, tc := range []struct {
		dst   string
		reach bool
	}{{"198.18.1.11:7", true}, {"198.18.1.11:80", false}, {"198.18.2.10:80", false}, {"198.18.1.10:80", true}} {
		c, err := world.DialTCP(ns, netip.MustParseAddrPort(tc.dst), world.BlockTimeout)
		if c != nil {
			c.Close()
		}
		if (err == nil) != tc.reach {
			t.Errorf("connect %s: err %v, but why says reachable=%v", tc.dst, err, tc.reach)
		}
	}
	// The text form: one line for the answer, one per address.
	out := e.cli("session", "why", "agent", "api.e2e.test:80")
	if !strings.HasPrefix(out, "api.e2e.test:80: allowed") || !strings.Contains(out, "\n  198.18.1.10: allowed (attested)") {
		t.Errorf("why text:\n%s", out)
	}
	// Bad input: one line naming the value.
	if msg := e.expectFail(1, "session", "why", "agent", "198.18.1.11:99999"); !strings.Contains(msg, `"99999"`) {
		t.Errorf("bad port: %q", msg)
	}
}

// As found (issue 27 finding 8): `allowed.test:8080` with `--allow
// allowed.test:80` answered "verdict": "allowed" at the top while every
// address was dropped on 8080. The top is now the destination's verdict:
// dropped (the default's silence) or rejected (--on-deny reject), with the
// reason, and the datapath agrees; port 80 is the allowed control. An
// address opened by an HTTPS record's ipv4hint names that name and type.
func TestE2EWhyVerdictIsTheDestinations(t *testing.T) {
	e := newE2E(t)
	e.w.DNS.AddRR(`svc.e2e.test. 300 IN HTTPS 1 . alpn="h2" ipv4hint="198.18.1.11"`)
	for _, c := range []struct{ session, onDeny, refused string }{
		{"quiet", "drop", api.WhyDropped},
		{"loud", "reject", api.WhyRejected},
	} {
		e.createNetOnly(c.session, "--allow", "api.e2e.test:80", "--allow", "svc.e2e.test:443", "--on-deny", c.onDeny)
		ns := e.nsPath(c.session)
		if rcode, addrs := e2eLookup(t, ns, "api.e2e.test"); rcode != 0 || !slices.Equal(addrs, []string{"198.18.1.10"}) {
			t.Fatalf("%s: lookup: %d %v", c.session, rcode, addrs)
		}
		a := e.why(c.session, "api.e2e.test:8080")
		if a.Verdict != c.refused || a.Reason != "port" || len(a.Addrs) != 1 || a.Addrs[0].Verdict != c.refused {
			t.Errorf("%s: why api.e2e.test:8080 = %+v, want %s (port) at the top and in addrs", c.session, a, c.refused)
		}
		if ok := e.why(c.session, "api.e2e.test:80"); ok.Verdict != api.WhyAllowed {
			t.Errorf("%s: why api.e2e.test:80 = %+v, want allowed", c.session, ok)
		}
		conn, err := world.DialTCP(ns, netip.MustParseAddrPort("198.18.1.10:8080"), world.BlockTimeout)
		if conn != nil {
			conn.Close()
		}
		switch {
		case err == nil:
			t.Errorf("%s: connect 198.18.1.10:8080 succeeded, but why says %s", c.session, a.Verdict)
		case c.refused == api.WhyDropped && !world.IsTimeout(err):
			t.Errorf("%s: connect 198.18.1.10:8080: %v, want a silent drop (why says dropped)", c.session, err)
		case c.refused == api.WhyRejected && world.IsTimeout(err):
			t.Errorf("%s: connect 198.18.1.10:8080 timed out, but why says rejected", c.session)
		}
		e2eExpect(t, e2eHTTP(ns, "198.18.1.10", e2eReach))

		// The HTTPS record's ipv4hint opened 198.18.1.11:443.
		m, err := world.Lookup(ns, e2eAnycastDNS, "svc.e2e.test", dns.TypeHTTPS, false, world.ReachTimeout)
		if err != nil || m.Rcode != dns.RcodeSuccess {
			t.Fatalf("%s: look up svc.e2e.test HTTPS: %v %v", c.session, err, m)
		}
		h := e.why(c.session, "198.18.1.11:443")
		if h.Verdict != api.WhyAllowed || h.Reason != "attested" || h.AttestedName != "svc.e2e.test" || h.AttestedType != "HTTPS" {
			t.Errorf("%s: why 198.18.1.11:443 = %+v, want attested by svc.e2e.test's HTTPS answer", c.session, h)
		}
	}
	// The text form leads with the destination's verdict.
	if out := e.cli("session", "why", "quiet", "api.e2e.test:8080"); !strings.HasPrefix(out, "api.e2e.test:8080: dropped") {
		t.Errorf("why text:\n%s", out)
	}
}
