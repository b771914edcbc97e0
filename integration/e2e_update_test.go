package integration

// Changing a running session's policy (enforcerd session update), checked
// where it matters: names that resolve or not through the DNS proxy, the
// kernel's sets, connections that are made, refused or cut.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// update runs `session update NAME ARGS... --json` and returns the session.
func (e *e2eEnv) update(name string, args ...string) api.SessionInfo {
	e.t.Helper()
	out := e.cli(append([]string{"session", "update", name, "--json"}, args...)...)
	var info api.SessionInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		e.t.Fatalf("session update %s --json: %v\n%s", name, err, out)
	}
	return info
}

// why runs `session why NAME DEST --json`.
func (e *e2eEnv) why(name, dest string) api.WhyAnswer {
	e.t.Helper()
	out := e.cli("session", "why", name, dest, "--json")
	var a api.WhyAnswer
	if err := json.Unmarshal([]byte(out), &a); err != nil {
		e.t.Fatalf("why %s %s: %v\n%s", name, dest, err, out)
	}
	return a
}

// e2eCut checks that an open connection to an echo server no longer
// carries anything: the echo of a message does not come back (the write
// may be buffered, the read fails).
func e2eCut(t *testing.T, what string, c net.Conn) {
	t.Helper()
	msg := []byte("after the revoke " + what)
	c.SetDeadline(time.Now().Add(world.BlockTimeout))
	_, err := c.Write(msg)
	if err == nil {
		_, err = io.ReadFull(c, make([]byte, len(msg)))
	}
	if err == nil {
		t.Errorf("%s: the established connection still carries data after the update", what)
	}
}

// e2eLookupWant resolves name through the proxy and checks the rcode and
// the addresses (none for NXDOMAIN).
func e2eLookupWant(t *testing.T, ns, when, name string, rcode int, addrs ...string) {
	t.Helper()
	got, as := e2eLookup(t, ns, name)
	if got != rcode || !slices.Equal(as, addrs) {
		t.Errorf("%s: %s: %s %v, want %s %v", when, name, dns.RcodeToString[got], as, dns.RcodeToString[rcode], addrs)
	}
}

// A name the policy refused (NXDOMAIN, never asked upstream, unreachable)
// resolves and is reachable once an update allows it; what was allowed
// stays allowed, the generation counts the update and inspect says when.
func TestE2EUpdateWiden(t *testing.T) {
	e := newE2E(t)
	before := e.createNetOnly("agent", "--allow", "api.e2e.test")
	ns := e.nsPath("agent")
	if before.Policy.Generation != 1 || before.Policy.Updated != nil {
		t.Errorf("created: generation %d, updated %+v; want 1 and none", before.Policy.Generation, before.Policy.Updated)
	}
	// Positive control, and the refusal the update lifts.
	e2eLookupWant(t, ns, "before", "api.e2e.test", dns.RcodeSuccess, "198.18.1.10")
	e2eLookupWant(t, ns, "before", "docs.e2e.test", dns.RcodeNameError)
	if e.w.DNS.QueriedName("docs.e2e.test") {
		t.Error("before: docs.e2e.test, refused, was asked upstream")
	}
	e2eExpect(t, e2eTCP(ns, "198.18.1.10:7", e2eReach), e2eTCP(ns, "198.18.1.11:7", e2eRejected))

	t0 := time.Now().Add(-time.Second)
	info := e.update("agent", "--allow", "docs.e2e.test")
	if !slices.Equal(info.Policy.Allow, []string{"api.e2e.test", "docs.e2e.test"}) || info.Policy.Generation != 2 {
		t.Errorf("update: allow %v generation %d, want [api.e2e.test docs.e2e.test] 2", info.Policy.Allow, info.Policy.Generation)
	}
	got := e.inspect("agent")
	if got.Policy.Generation != 2 || got.Policy.Updated == nil || got.Policy.Updated.Time.Before(t0) {
		t.Fatalf("inspect after the update: generation %d updated %+v", got.Policy.Generation, got.Policy.Updated)
	}
	// Who: the CLI's process, as the socket's peer credentials say (the
	// test runs as root).
	if by := got.Policy.Updated.By; by == nil || by.UID != uint32(os.Geteuid()) || by.GID != uint32(os.Getegid()) || by.PID <= 0 || int(by.PID) == os.Getpid() {
		t.Errorf("inspect after the update: updated by %+v, want the CLI's uid %d, gid %d and pid", got.Policy.Updated.By, os.Geteuid(), os.Getegid())
	}
	e2eLookupWant(t, ns, "after", "docs.e2e.test", dns.RcodeSuccess, "198.18.1.11")
	e2eLookupWant(t, ns, "after", "api.e2e.test", dns.RcodeSuccess, "198.18.1.10")
	e2eLookupWant(t, ns, "after", "cdn.e2e.test", dns.RcodeNameError)
	e2eExpect(t,
		e2eTCP(ns, "198.18.1.11:7", e2eReach),
		e2eTCP(ns, "198.18.1.10:7", e2eReach),
		e2eTCP(ns, "198.18.2.10:7", e2eRejected),
	)
	if a := e.why("agent", "198.18.1.11:7"); a.Verdict != api.WhyAllowed || a.Reason != "attested" {
		t.Errorf("why 198.18.1.11:7 after the update: %+v", a)
	}
	evs := e2eParseEvents(t, "agent", e.cli("session", "events", "agent"))
	if !e2eHasEvent(evs, "lifecycle", "policy_updated", "") {
		t.Errorf("no policy_updated event: %+v", evs)
	}
}

// Revocation bites: a connection open across the update to an address only
// a revoked name attested is cut, a new one is dropped and the name is
// NXDOMAIN; an address a still-allowed name attested too stays reachable,
// and the connection to it survives.
func TestE2EUpdateRevoke(t *testing.T) {
	e := newE2E(t)
	agent := e.createNetOnly("agent", "--allow", "api.e2e.test", "--allow", "docs.e2e.test", "--allow", "other.e2e.test")
	ns, guest := e.nsPath("agent"), netip.MustParseAddr(agent.GuestIP)
	e2eLookupWant(t, ns, "before", "api.e2e.test", dns.RcodeSuccess, "198.18.1.10")
	e2eLookupWant(t, ns, "before", "docs.e2e.test", dns.RcodeSuccess, "198.18.1.11")
	e2eLookupWant(t, ns, "before", "other.e2e.test", dns.RcodeSuccess, "198.18.1.11")
	revoked := e2eDial(t, ns, "198.18.1.10:7")
	kept := e2eDial(t, ns, "198.18.1.11:7")
	e2eEcho(t, "before the update (api)", revoked)
	e2eEcho(t, "before the update (docs/other)", kept)

	info := e.update("agent", "--revoke", "api.e2e.test", "--revoke", "docs.e2e.test")
	if !slices.Equal(info.Policy.Allow, []string{"other.e2e.test"}) {
		t.Errorf("update: allow %v, want [other.e2e.test]", info.Policy.Allow)
	}
	e2eCut(t, "api's 198.18.1.10:7", revoked)
	e2eEcho(t, "after the update, to an address other.e2e.test still attests", kept)
	e2eExpect(t,
		e2eTCP(ns, "198.18.1.10:7", e2eRejected),
		e2eTCP(ns, "198.18.1.11:7", e2eReach),
	)
	if got := e2eNftAttested(t, e.w, e.d.Prefix, guest); !slices.Equal(got, []string{"198.18.1.11"}) {
		t.Errorf("the kernel's attested set for agent after the revoke: %v, want [198.18.1.11]", got)
	}
	if a := e.why("agent", "198.18.1.10:7"); a.Verdict != api.WhyRejected || a.Reason != "not-allowed" {
		t.Errorf("why 198.18.1.10:7 after the revoke: %+v", a)
	}
	queried := len(e.w.DNS.Queries())
	e2eLookupWant(t, ns, "after", "api.e2e.test", dns.RcodeNameError)
	e2eLookupWant(t, ns, "after", "docs.e2e.test", dns.RcodeNameError)
	if q := e.w.DNS.Queries(); len(q) != queried {
		t.Errorf("revoked names were asked upstream: %v", q[queried:])
	}
	e2eLookupWant(t, ns, "after", "other.e2e.test", dns.RcodeSuccess, "198.18.1.11")
}

// --keep-established: the connection open across the revoke survives; a
// new one to the same address is dropped.
func TestE2EUpdateKeepEstablished(t *testing.T) {
	e := newE2E(t)
	e.createNetOnly("agent", "--allow", "api.e2e.test", "--allow", "198.18.2.10/32:7")
	ns := e.nsPath("agent")
	e2eLookupWant(t, ns, "before", "api.e2e.test", dns.RcodeSuccess, "198.18.1.10")
	byName := e2eDial(t, ns, "198.18.1.10:7")
	static := e2eDial(t, ns, "198.18.2.10:7")
	e2eEcho(t, "before the update (name)", byName)
	e2eEcho(t, "before the update (static)", static)

	e.update("agent", "--revoke", "api.e2e.test", "--revoke", "198.18.2.10/32:7", "--keep-established")
	e2eEcho(t, "after a --keep-established revoke (name)", byName)
	e2eEcho(t, "after a --keep-established revoke (static)", static)
	e2eExpect(t,
		e2eTCP(ns, "198.18.1.10:7", e2eRejected),
		e2eTCP(ns, "198.18.2.10:7", e2eRejected),
	)
	e2eEcho(t, "after new connections were dropped", byName)

	// The same revoke without --keep-established cuts: the control that
	// the connections above survived because of the flag.
	e.update("agent", "--allow", "198.18.1.11/32:7")
	cut := e2eDial(t, ns, "198.18.1.11:7")
	e2eEcho(t, "before the second revoke", cut)
	e.update("agent", "--revoke", "198.18.1.11/32:7")
	e2eCut(t, "198.18.1.11:7 without --keep-established", cut)
}

// A locked session refuses every update (409, one line) and nothing
// changes; a stale generation is refused the same way, the current one is
// accepted.
func TestE2EUpdateLockedAndStale(t *testing.T) {
	e := newE2E(t)
	e.createNetOnly("locked", "--allow", "api.e2e.test", "--locked")
	ns := e.nsPath("locked")
	e2eLookupWant(t, ns, "locked, before", "api.e2e.test", dns.RcodeSuccess, "198.18.1.10")
	before := e.inspect("locked")
	if !before.Policy.Locked {
		t.Errorf("inspect of a --locked session: locked false")
	}
	msg := e.expectFail(1, "session", "update", "locked", "--allow", "docs.e2e.test")
	if !strings.Contains(msg, "--locked") {
		t.Errorf("update of a locked session: %q", msg)
	}
	msg = e.expectFail(2, "session", "update", "locked", "--revoke", "api.e2e.test", "--replace")
	if !strings.Contains(msg, "--revoke") {
		t.Errorf("update --revoke --replace: %q", msg)
	}
	e.expectFail(1, "session", "update", "locked", "--replace", "--allow", "docs.e2e.test")
	_, err := e.d.Client().UpdatePolicy(t.Context(), "locked", api.PolicyUpdate{Allow: []string{"docs.e2e.test"}})
	e2eCoded(t, "PATCH of a locked session", err, 409, api.CodeLocked, api.ErrLocked)
	e2eCodedCLI(e, api.CodeLocked, "session", "update", "locked", "--allow", "docs.e2e.test", "--json")
	e2eSamePolicy(t, "locked, after the refused updates", before, e.inspect("locked"))
	e2eLookupWant(t, ns, "locked, after", "docs.e2e.test", dns.RcodeNameError)
	e2eExpect(t, e2eTCP(ns, "198.18.1.11:7", e2eRejected), e2eTCP(ns, "198.18.1.10:7", e2eReach))

	e.createNetOnly("agent", "--allow", "api.e2e.test")
	ns = e.nsPath("agent")
	e.update("agent", "--generation", "1", "--allow", "docs.e2e.test") // current: accepted
	before = e.inspect("agent")
	msg = e.expectFail(1, "session", "update", "agent", "--generation", "1", "--allow", "cdn.e2e.test")
	if !strings.Contains(msg, "generation 1 is stale") || !strings.Contains(msg, "current one is 2") {
		t.Errorf("stale update: %q", msg)
	}
	_, err = e.d.Client().UpdatePolicy(t.Context(), "agent", api.PolicyUpdate{Generation: 1, Allow: []string{"cdn.e2e.test"}})
	e2eCoded(t, "PATCH naming a stale generation", err, 409, api.CodeStaleGeneration, api.ErrStaleGeneration)
	e2eCodedCLI(e, api.CodeStaleGeneration, "session", "update", "agent", "--generation", "1", "--allow", "cdn.e2e.test", "--json")
	// The other codes a program branches on, from the same daemon: a taken
	// name, an unknown session, a bad value.
	_, err = e.d.Client().Create(t.Context(), api.CreateRequest{Name: "agent", NetworkOnly: true})
	e2eCoded(t, "create of a taken name", err, 409, api.CodeNameTaken, api.ErrNameTaken)
	_, err = e.d.Client().UpdatePolicy(t.Context(), "nope", api.PolicyUpdate{Allow: []string{"cdn.e2e.test"}})
	e2eCoded(t, "PATCH of an unknown session", err, 404, api.CodeNotFound, api.ErrNotFound)
	_, err = e.d.Client().UpdatePolicy(t.Context(), "agent", api.PolicyUpdate{Allow: []string{"10.0.0.0/8"}})
	e2eCoded(t, "PATCH with a private CIDR", err, 400, api.CodeBadRequest, api.ErrBadRequest)
	e2eSamePolicy(t, "after the stale updates", before, e.inspect("agent"))
	e2eLookupWant(t, ns, "after the stale updates", "cdn.e2e.test", dns.RcodeNameError)
	e2eLookupWant(t, ns, "after the stale updates", "docs.e2e.test", dns.RcodeSuccess, "198.18.1.11")
	e2eExpect(t, e2eTCP(ns, "198.18.2.10:7", e2eRejected), e2eTCP(ns, "198.18.1.11:7", e2eReach))
	// An invalid update changes nothing either.
	msg = e.expectFail(1, "session", "update", "agent", "--allow", "10.0.0.0/8")
	if !strings.Contains(msg, "10.0.0.0/8") {
		t.Errorf("invalid update: %q", msg)
	}
	e2eSamePolicy(t, "after an invalid update", before, e.inspect("agent"))
}

// e2eCoded checks that err is the daemon's refusal of that status and
// code, and that errors.Is finds its sentinel and none of the other 409s.
func e2eCoded(t *testing.T, what string, err error, status int, code string, sentinel error) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != status || ae.Code != code || !errors.Is(err, sentinel) {
		t.Errorf("%s: %#v, want status %d, code %s and errors.Is %v", what, err, status, code, sentinel)
		return
	}
	for _, other := range []error{api.ErrNameTaken, api.ErrStaleGeneration, api.ErrLocked, api.ErrBusy, api.ErrNoSandbox, api.ErrNotFound, api.ErrBadRequest} {
		if other != sentinel && errors.Is(err, other) {
			t.Errorf("%s: errors.Is(err, %v) holds too", what, other)
		}
	}
}

// e2eCodedCLI runs a command line the daemon refuses, with --json: the
// one line on stderr, and {"error": that line, "code": code} on stdout.
func e2eCodedCLI(e *e2eEnv, code string, args ...string) {
	e.t.Helper()
	out, errOut, status := e.run(args...)
	var body api.ErrorBody
	if status != 1 || json.Unmarshal([]byte(out), &body) != nil || body.Code != code || body.Error+"\n" != errOut {
		e.t.Errorf("enforcerd %s: exit %d, stdout %q, stderr %q; want exit 1 and code %s", strings.Join(args, " "), status, out, errOut, code)
	}
	e2eOneLine(e.t, "enforcerd "+strings.Join(args, " "), errOut)
}

// e2eSamePolicy checks that two inspects show the same policy.
func e2eSamePolicy(t *testing.T, when string, a, b api.SessionInfo) {
	t.Helper()
	if !reflect.DeepEqual(a.Policy, b.Policy) || a.Egress != b.Egress {
		t.Errorf("%s: the policy changed:\n was %+v %s\n now %+v %s", when, a.Policy, a.Egress, b.Policy, b.Egress)
	}
}

// A CIDR entry replaced by an overlapping one in one update, both ways
// (widened and narrowed): the kernel's interval sets take the batch and
// the datapath follows.
func TestE2EUpdateOverlappingCIDR(t *testing.T) {
	e := newE2E(t)
	e.createNetOnly("agent", "--allow", "198.18.1.0/24")
	ns := e.nsPath("agent")
	e2eExpect(t, e2eTCP(ns, "198.18.1.10:7", e2eReach), e2eTCP(ns, "198.18.2.10:7", e2eRejected))

	info := e.update("agent", "--revoke", "198.18.1.0/24", "--allow", "198.18.0.0/16")
	if !slices.Equal(info.Policy.Allow, []string{"198.18.0.0/16"}) {
		t.Errorf("widened: allow %v", info.Policy.Allow)
	}
	e2eExpect(t, e2eTCP(ns, "198.18.1.10:7", e2eReach), e2eTCP(ns, "198.18.2.10:7", e2eReach))

	conn := e2eDial(t, ns, "198.18.2.10:7")
	e2eEcho(t, "inside the /16", conn)
	e.update("agent", "--replace", "--allow", "198.18.1.0/24", "--allow", "198.18.1.11/32:7")
	e2eExpect(t,
		e2eTCP(ns, "198.18.1.10:7", e2eReach),
		e2eTCP(ns, "198.18.1.11:7", e2eReach),
		e2eTCP(ns, "198.18.2.10:7", e2eRejected),
	)
	e2eCut(t, "198.18.2.10:7, outside the narrowed /24", conn)
	if a := e.why("agent", "198.18.2.10:7"); a.Verdict != api.WhyRejected {
		t.Errorf("why 198.18.2.10:7 after narrowing: %+v", a)
	}
}

// The daemon is killed (SIGKILL) while an update is in flight, at a random
// point, several times; after each restart the session's policy is the old
// or the new one, whole: the record (inspect), the kernel (why, the
// attested set) and the datapath agree, and an update the CLI confirmed is
// the one in force.
func TestE2EUpdateKillDuringUpdate(t *testing.T) {
	e := newE2E(t)
	// A and B share nothing: every probe tells them apart.
	policyA := []string{"--allow", "198.18.1.10/32:7", "--allow", "cdn.e2e.test"}
	policyB := []string{"--allow", "198.18.1.11/32:7"}
	agent := e.createNetOnly("agent", policyA...)
	ns, guest := e.nsPath("agent"), netip.MustParseAddr(agent.GuestIP)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 12))
	isA := func(when string) bool {
		t.Helper()
		info := e.inspect("agent")
		a := slices.Equal(info.Policy.Allow, []string{"198.18.1.10:7", "cdn.e2e.test"})
		if !a && !slices.Equal(info.Policy.Allow, []string{"198.18.1.11:7"}) {
			t.Fatalf("%s: the policy is neither A nor B: %v", when, info.Policy.Allow)
		}
		return a
	}
	// enforced checks that the kernel and the proxy enforce policy A (or
	// B), whole.
	enforced := func(when string, a bool) {
		t.Helper()
		static := map[bool]string{true: "198.18.1.10:7", false: "198.18.1.11:7"}
		if w := e.why("agent", static[a]); w.Verdict != api.WhyAllowed || w.Reason != "static" {
			t.Errorf("%s: why %s: %+v, want allowed (static)", when, static[a], w)
		}
		if w := e.why("agent", static[!a]); w.Verdict != api.WhyRejected {
			t.Errorf("%s: why %s: %+v, want rejected (the default on-deny)", when, static[!a], w)
		}
		if a {
			e2eLookupWant(t, ns, when, "cdn.e2e.test", dns.RcodeSuccess, "198.18.2.10")
		} else {
			e2eLookupWant(t, ns, when, "cdn.e2e.test", dns.RcodeNameError)
			if got := e2eNftAttested(t, e.w, e.d.Prefix, guest); len(got) != 0 {
				t.Errorf("%s: under policy B the kernel still holds attested %v", when, got)
			}
		}
		want := map[bool]e2eWant{true: e2eReach, false: e2eRejected}
		e2eExpect(t,
			e2eTCP(ns, "198.18.1.10:7", want[a]),
			e2eTCP(ns, "198.18.2.10:7", want[a]),
			e2eTCP(ns, "198.18.1.11:7", want[!a]),
		)
	}
	enforced("before", true)
	cur, old, neu := true, 0, 0
	for round := range 6 {
		next := policyB
		if !cur {
			next = policyA
		}
		cmd := append([]string{"session", "update", "agent", "--replace"}, next...)
		r := e.killMidway([][]string{cmd}, 0, 40*time.Millisecond, rng)[0]
		e.start()
		when := fmt.Sprintf("round %d, after the restart", round)
		got := isA(when)
		switch {
		case r.code == 0 && got == cur:
			t.Errorf("%s: the update was confirmed to the CLI but the old policy is in force", when)
		case r.code != 0 && r.code != 1:
			t.Errorf("%s: update exit %d: %s", when, r.code, r.stderr)
		}
		if got == cur {
			old++
		} else {
			neu++
		}
		enforced(when, got)
		e.expectConsistent(when)
		cur = got
	}
	t.Logf("after the kills: %d rounds kept the old policy, %d had the new one, %d restarts completed an interrupted update",
		old, neu, strings.Count(e.d.Log(), "completed a policy update interrupted by a restart"))
}

// e2eDial opens a TCP connection from ns to dst or fails the test; it is
// aborted (a reset, no linger) when the test ends: a cut connection's
// unacknowledged data would otherwise keep its socket, and with it the
// session's netns and host veth, alive past the leak check.
func e2eDial(t *testing.T, ns, dst string) net.Conn {
	t.Helper()
	c, err := world.DialTCP(ns, netip.MustParseAddrPort(dst), world.ReachTimeout)
	if err != nil {
		t.Fatalf("connect to %s from %s: %v", dst, ns, err)
	}
	t.Cleanup(func() {
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	return c
}

// With --pin, an update that adds or revokes a name rewrites the
// sandbox's /etc/hosts (the file the sandbox sees through its bind mount)
// with the added name's pinned addresses, and without the revoked one;
// the sandbox reaches the added name by it and no longer the revoked one.
func TestE2EUpdatePinnedHosts(t *testing.T) {
	e := newE2E(t)
	e.create("agent", "--allow", "api.e2e.test", "--pin")
	hosts := func() string {
		t.Helper()
		return e.mustSh("agent", "cat /etc/hosts")
	}
	const api10, docs11 = "198.18.1.10\tapi.e2e.test\n", "198.18.1.11\tdocs.e2e.test\n"
	if h := hosts(); !strings.Contains(h, api10) || strings.Contains(h, "docs.e2e.test") {
		t.Fatalf("created: /etc/hosts\n%s", h)
	}
	if out := e.mustSh("agent", "timeout 2 wget -q -O - http://api.e2e.test/"); out != "hello from 198.18.1.10\n" {
		t.Fatalf("wget http://api.e2e.test/ before the update: %q", out)
	}

	info := e.update("agent", "--allow", "docs.e2e.test")
	if got := info.Policy.Pinned["docs.e2e.test"]; !slices.Equal(got, []string{"198.18.1.11"}) {
		t.Errorf("update: pinned %v", info.Policy.Pinned)
	}
	if h := hosts(); !strings.Contains(h, api10) || !strings.Contains(h, docs11) {
		t.Errorf("after adding docs.e2e.test: /etc/hosts\n%s", h)
	}
	if out := e.mustSh("agent", "timeout 2 wget -q -O - http://docs.e2e.test/"); out != "hello from 198.18.1.11\n" {
		t.Errorf("wget http://docs.e2e.test/ after the update: %q", out)
	}

	e.update("agent", "--revoke", "api.e2e.test")
	h := hosts()
	if strings.Contains(h, "api.e2e.test") || !strings.Contains(h, docs11) || !strings.HasPrefix(h, "# written by enforcerd\n127.0.0.1\tlocalhost\n") {
		t.Errorf("after revoking api.e2e.test: /etc/hosts\n%q", h)
	}
	if e.wget("agent", "198.18.1.10") {
		t.Error("the sandbox still reaches the revoked pinned address 198.18.1.10")
	}
	if _, _, code := e.sh("agent", "echo x >> /etc/hosts"); code == 0 {
		t.Error("the sandbox could write its /etc/hosts")
	}
}

// A session that resolved more names than the proxy remembers (8192
// addresses) cannot keep a name it resolved long before past its revoke:
// the update removes every attested element no still-allowed name it
// remembers holds, so the revoked name's address leaves the kernel and
// its open connection is cut.
func TestE2EUpdateRevokeForgottenName(t *testing.T) {
	e := newE2E(t, "--max-attested", "10000")
	const names, per = 420, 20 // 8400 addresses: past the proxy's 8192 (20 fit a plain UDP answer)
	next := netip.MustParseAddr("198.19.0.1")
	for i := range names {
		for range per {
			e.w.DNS.AddRR(fmt.Sprintf("n%d.flood.e2e.test. 300 IN A %s", i, next))
			next = next.Next()
		}
	}
	agent := e.createNetOnly("agent", "--allow", "api.e2e.test", "--allow", "*.flood.e2e.test")
	ns, guest := e.nsPath("agent"), netip.MustParseAddr(agent.GuestIP)
	e2eLookupWant(t, ns, "first", "api.e2e.test", dns.RcodeSuccess, "198.18.1.10")
	conn := e2eDial(t, ns, "198.18.1.10:7")
	e2eEcho(t, "before the flood", conn)
	for i := range names {
		if rcode, addrs := e2eLookup(t, ns, fmt.Sprintf("n%d.flood.e2e.test", i)); rcode != dns.RcodeSuccess || len(addrs) != per {
			t.Fatalf("n%d.flood.e2e.test: %s, %d addresses", i, dns.RcodeToString[rcode], len(addrs))
		}
	}
	if got := e2eNftAttested(t, e.w, e.d.Prefix, guest); !slices.Contains(got, "198.18.1.10") || len(got) != names*per+1 {
		t.Fatalf("after the flood the kernel holds %d attested addresses (198.18.1.10 among them: %v), want %d",
			len(got), slices.Contains(got, "198.18.1.10"), names*per+1)
	}
	e2eEcho(t, "after the flood", conn) // positive control: still allowed

	e.update("agent", "--revoke", "api.e2e.test")
	e2eCut(t, "the forgotten name's 198.18.1.10:7", conn)
	e2eExpect(t, e2eTCP(ns, "198.18.1.10:7", e2eRejected))
	got := e2eNftAttested(t, e.w, e.d.Prefix, guest)
	if slices.Contains(got, "198.18.1.10") {
		t.Errorf("the revoked name's 198.18.1.10 is still attested after the update")
	}
	// The still-allowed names it remembers keep their addresses.
	if !slices.Contains(got, next.Prev().String()) {
		t.Errorf("the last flood name's %s, still allowed and remembered, lost its attestation", next.Prev())
	}
	e2eLookupWant(t, ns, "after", "api.e2e.test", dns.RcodeNameError)
}
