package integration

// Deny entries and --on-deny, checked where they matter: the DNS proxy's
// answers and the upstream's query log, connections made, rejected, reset
// or dropped, the kernel's counters, the flow events, and why.

import (
	"cmp"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// In allowlist mode a deny wins over a wildcard allow (the name is
// NXDOMAIN and never asked upstream), over a static entry and over an
// allowed name's answer (the address is removed from it and dropped); an
// update that adds a deny cuts the established flow an attested name
// still allows, and one that revokes it opens the address again.
func TestE2EDenyAllowlist(t *testing.T) {
	e := newE2E(t)
	info := e.createNetOnly("agent", "--allow", "*.e2e.test", "--allow", "198.18.2.10:7",
		"--deny", "docs.e2e.test", "--deny", "198.18.2.10")
	ns := e.nsPath("agent")
	if !slices.Equal(info.Policy.Deny, []string{"198.18.2.10", "docs.e2e.test"}) || info.Policy.OnDeny != "reject" {
		t.Errorf("created: deny %v on_deny %q, want [198.18.2.10 docs.e2e.test] reject (the default)", info.Policy.Deny, info.Policy.OnDeny)
	}
	// Positive controls: the wildcard allows, and the proxy asks upstream.
	e2eLookupWant(t, ns, "allowed", "api.e2e.test", dns.RcodeSuccess, "198.18.1.10")
	e2eLookupWant(t, ns, "allowed, same address as the denied name", "other.e2e.test", dns.RcodeSuccess, "198.18.1.11")
	if !e.w.DNS.QueriedName("api.e2e.test") {
		t.Fatal("api.e2e.test was answered without the upstream: the query log is not a control")
	}
	e2eLookupWant(t, ns, "denied name", "docs.e2e.test", dns.RcodeNameError)
	if e.w.DNS.QueriedName("docs.e2e.test") {
		t.Error("docs.e2e.test, denied, was asked upstream")
	}
	// An allowed name whose answer is a denied address: the address is
	// removed from the answer and never attested.
	e2eLookupWant(t, ns, "allowed name, denied address", "cdn.e2e.test", dns.RcodeSuccess)
	e2eExpect(t,
		e2eTCP(ns, "198.18.1.10:7", e2eReach),
		e2eTCP(ns, "198.18.2.10:7", e2eRejected), // the static 198.18.2.10:7 loses to the deny
	)
	if a := e.why("agent", "docs.e2e.test"); a.Verdict != api.WhyNXDomain || a.Reason != "denied" || a.Entry != "docs.e2e.test" {
		t.Errorf("why docs.e2e.test: %+v, want nxdomain, denied, entry docs.e2e.test", a)
	}
	if a := e.why("agent", "198.18.2.10:7"); a.Verdict != api.WhyRejected || a.Reason != "denied" || a.Entry != "198.18.2.10" {
		t.Errorf("why 198.18.2.10:7: %+v, want rejected (the default on-deny), denied, entry 198.18.2.10", a)
	}
	if n := e.inspect("agent").Counters.DroppedByReason["denied"]; n == 0 {
		t.Error("no packet counted with reason denied")
	}

	// Added by an update: the established flow to an address an allowed
	// name attested is cut, a new one dropped.
	conn := e2eDial(t, ns, "198.18.1.10:7")
	e2eEcho(t, "before the deny", conn)
	info = e.update("agent", "--deny", "198.18.1.10", "--revoke-deny", "198.18.2.10")
	if !slices.Equal(info.Policy.Deny, []string{"198.18.1.10", "docs.e2e.test"}) {
		t.Errorf("update: deny %v, want [198.18.1.10 docs.e2e.test]", info.Policy.Deny)
	}
	e2eCut(t, "198.18.1.10:7, denied by the update", conn)
	e2eExpect(t,
		e2eTCP(ns, "198.18.1.10:7", e2eRejected),
		e2eTCP(ns, "198.18.2.10:7", e2eReach), // the deny revoked: the static entry allows again
	)
	e2eLookupWant(t, ns, "after the update", "api.e2e.test", dns.RcodeSuccess)
}

// In public mode a deny is "everything public except these": the denied
// name is NXDOMAIN and never asked upstream, the denied address is dropped
// and removed from answers; the rest of the public internet stays open.
func TestE2EDenyPublic(t *testing.T) {
	e := newE2E(t)
	e.createNetOnly("pub", "--egress", "public", "--deny", "api.e2e.test", "--deny", "198.18.1.11/32:7")
	ns := e.nsPath("pub")
	e2eLookupWant(t, ns, "public", "cdn.e2e.test", dns.RcodeSuccess, "198.18.2.10")
	e2eLookupWant(t, ns, "denied name", "api.e2e.test", dns.RcodeNameError)
	if e.w.DNS.QueriedName("api.e2e.test") {
		t.Error("api.e2e.test, denied, was asked upstream")
	}
	if !e.w.DNS.QueriedName("cdn.e2e.test") {
		t.Error("cdn.e2e.test was not asked upstream: the query log is not a control")
	}
	// A port deny keeps the address in answers (other ports are open).
	e2eLookupWant(t, ns, "address denied on a port", "docs.e2e.test", dns.RcodeSuccess, "198.18.1.11")
	e2eExpect(t,
		e2eTCP(ns, "198.18.2.10:7", e2eReach),
		e2eTCP(ns, "198.18.1.10:7", e2eReach), // a denied name denies the name, not its address
		e2eTCP(ns, "198.18.1.11:7", e2eRejected),
	)
	e.update("pub", "--deny", "198.18.2.0/24")
	e2eLookupWant(t, ns, "address denied by the update", "cdn.e2e.test", dns.RcodeSuccess)
	e2eExpect(t, e2eTCP(ns, "198.18.2.10:7", e2eRejected), e2eTCP(ns, "198.18.1.10:7", e2eReach))
}

// --on-deny, each mode next to an allowed control that connects:
//
//	reject (the default): a denied TCP connect fails with EHOSTUNREACH ("No
//	  route to host") within a second, a UDP exchange likewise; the flow
//	  event says rejected, answer icmp-admin-prohibited.
//	reset: a TCP connect fails with ECONNREFUSED (a TCP reset), UDP still
//	  gets EHOSTUNREACH; the event says rejected, answer tcp-reset.
//	drop: the connect times out; the event says dropped.
//
// For denied (a deny entry) and merely not-allowed destinations; the
// session changes mode with update, and an update --replace without
// --on-deny is back to the default.
func TestE2EOnDenyModes(t *testing.T) {
	e := newE2E(t)
	info := e.createNetOnly("agent", "--allow", "api.e2e.test", "--deny", "198.18.1.11")
	ns := e.nsPath("agent")
	if info.Policy.OnDeny != "reject" {
		t.Errorf("created without --on-deny: on_deny %q, want reject (the default)", info.Policy.OnDeny)
	}
	fe := e.followFlows("agent")
	e2eLookupWant(t, ns, "allowed", "api.e2e.test", dns.RcodeSuccess, "198.18.1.10")
	denied := []string{"198.18.1.11:7", "198.18.2.10:7"} // a deny entry; nothing allows it
	check := func(mode string, wantTCP error) {
		t.Helper()
		// The control: the allowed destination connects in every mode.
		e2eExpect(t, e2eTCP(ns, "198.18.1.10:7", e2eReach))
		for _, dst := range denied {
			start := time.Now()
			c, err := world.DialTCP(ns, netip.MustParseAddrPort(dst), world.BlockTimeout)
			took := time.Since(start)
			switch {
			case err == nil:
				c.Close()
				t.Errorf("%s: tcp %s: connected, want it refused", mode, dst)
			case wantTCP == nil && !world.IsTimeout(err):
				t.Errorf("%s: tcp %s: %v after %v, want a timeout (silence)", mode, dst, err, took)
			case wantTCP != nil && (!errors.Is(err, wantTCP) || took > time.Second):
				t.Errorf("%s: tcp %s: %v after %v, want %v within 1s", mode, dst, err, took, wantTCP)
			}
			start = time.Now()
			err = world.UDPEcho(ns, netip.MustParseAddrPort(dst), world.BlockTimeout)
			took = time.Since(start)
			switch {
			case err == nil:
				t.Errorf("%s: udp %s: answered, want it refused", mode, dst)
			case wantTCP == nil && !world.IsTimeout(err):
				t.Errorf("%s: udp %s: %v after %v, want a timeout (silence)", mode, dst, err, took)
			case wantTCP != nil && !errors.Is(err, syscall.EHOSTUNREACH):
				t.Errorf("%s: udp %s: %v after %v, want EHOSTUNREACH (ICMP admin-prohibited)", mode, dst, err, took)
			}
		}
	}

	check("reject", syscall.EHOSTUNREACH)
	fe.expect(t, "reject, denied", map[string]any{"reason": "denied", "proto": "tcp", "dst": "198.18.1.11", "answer": "icmp-admin-prohibited"})
	fe.expect(t, "reject, not allowed", map[string]any{"reason": "not-allowed", "proto": "tcp", "dst": "198.18.2.10", "answer": "icmp-admin-prohibited"})
	fe.drain(t, 500*time.Millisecond)
	if n := e.inspect("agent").Counters.DroppedByReason["denied"]; n == 0 {
		t.Error("reject: no packet counted with reason denied")
	}
	if a := e.why("agent", "198.18.1.11:7"); a.Reason != "denied" {
		t.Errorf("why 198.18.1.11:7: %+v, want reason denied", a)
	}

	if info := e.update("agent", "--on-deny", "reset"); info.Policy.OnDeny != "reset" {
		t.Errorf("update: on_deny %q, want reset", info.Policy.OnDeny)
	}
	check("reset", syscall.ECONNREFUSED)
	fe.expect(t, "reset, not allowed", map[string]any{"reason": "not-allowed", "proto": "tcp", "dst": "198.18.2.10", "answer": "tcp-reset"})
	fe.expect(t, "reset, udp", map[string]any{"reason": "not-allowed", "proto": "udp", "dst": "198.18.2.10", "answer": "icmp-admin-prohibited"})
	fe.drain(t, 500*time.Millisecond)

	if info := e.update("agent", "--on-deny", "drop"); info.Policy.OnDeny != "drop" {
		t.Errorf("update: on_deny %q, want drop", info.Policy.OnDeny)
	}
	check("drop", nil)
	fe.expect(t, "drop, not allowed", map[string]any{"action": "dropped", "reason": "not-allowed", "proto": "tcp", "dst": "198.18.2.10"})
	fe.drain(t, 500*time.Millisecond)

	// --replace gives the whole policy: without --on-deny, the default.
	if info := e.update("agent", "--replace", "--allow", "api.e2e.test"); info.Policy.OnDeny != "reject" {
		t.Errorf("update --replace: on_deny %q, want reject (the default)", info.Policy.OnDeny)
	}
	e2eExpect(t, e2eTCP(ns, "198.18.1.10:7", e2eReach), e2eTCP(ns, "198.18.2.10:7", e2eRejected))
}

// TestE2EOnDenyToolsInSandbox: what busybox's nc and wget in a sandbox
// print for a destination the policy does not allow, under each
// --on-deny, next to an allowed fetch that works: "No route to host"
// within 3 s (reject, the default: a blocking connect fails at its first
// SYN retry, 1 s), "Connection refused" at once (reset), and nc's own
// timeout (drop).
func TestE2EOnDenyToolsInSandbox(t *testing.T) {
	e := newE2E(t)
	for _, tc := range []struct {
		mode, want string
		within     time.Duration
	}{
		{"", "No route to host", 3 * time.Second},
		{"reset", "Connection refused", time.Second},
		{"drop", "timed out", 5 * time.Second},
	} {
		name := "tools-" + cmp.Or(tc.mode, "default")
		args := []string{"--allow", "198.18.1.10:80"}
		if tc.mode != "" {
			args = append(args, "--on-deny", tc.mode)
		}
		e.create(name, args...)
		if out := e.mustSh(name, "timeout 5 wget -q -O - http://198.18.1.10/"); out != "hello from 198.18.1.10\n" {
			t.Errorf("%s: the allowed fetch: %q", name, out)
		}
		for _, script := range []string{"nc -w 2 198.18.1.20 80 </dev/null", "timeout 5 wget -q -O - http://198.18.1.20/"} {
			if tc.mode == "drop" && strings.Contains(script, "wget") {
				continue // busybox wget has no connect timeout of its own: timeout kills it, silently
			}
			start := time.Now()
			_, errOut, code := e.sh(name, script)
			took := time.Since(start)
			if code == 0 || !strings.Contains(errOut, tc.want) || took > tc.within {
				t.Errorf("%s: %s: exit %d after %v, stderr %q; want %q within %v", name, script, code, took.Round(time.Millisecond), errOut, tc.want, tc.within)
			}
		}
	}
}
