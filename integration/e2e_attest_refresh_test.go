package integration

// The refresh of attested addresses by new connections, through the
// daemon (--dns-min-ttl 5s in the test daemon): a name answered with TTL 1
// lives 5 s; each new connection to it keeps it alive 5 s more, up to
// --attest-max-lifetime after the answer; a connection after the
// attestation ran out is an event with reason expired naming the name.

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
)

// refreshDial opens (and closes) a TCP connection from the session's netns
// to the echo server on port 7 of ip, and reports whether it connected.
func (e *e2eEnv) refreshDial(name, ip string) bool {
	e.t.Helper()
	c, err := world.DialTCP(e.nsPath(name), netip.AddrPortFrom(netip.MustParseAddr(ip), 7), 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func (e *e2eEnv) resolveTo(name, host, want string) {
	e.t.Helper()
	rc, addrs := e2eLookup(e.t, e.nsPath(name), host)
	if rc != 0 || len(addrs) != 1 || addrs[0] != want {
		e.t.Fatalf("%s: look up %s: rcode %d, %v; want %s", name, host, rc, addrs, want)
	}
}

// TestE2EAttestRefresh: an address used every 1.5 s stays allowed for 12 s
// although its attestation lives 5 s; the control, attested at the same
// moment and left idle, is dropped with reason expired (event and why);
// a session whose update revokes the name is not refreshed back by its
// connections, while another session's use of the same address goes on.
func TestE2EAttestRefresh(t *testing.T) {
	e := newE2E(t)
	e.w.DNS.AddRR("used.refresh.e2e.test. 1 IN A 198.18.1.10")
	e.w.DNS.AddRR("idle.refresh.e2e.test. 1 IN A 198.18.1.11")
	e.createNetOnly("rf", "--allow", "used.refresh.e2e.test", "--allow", "idle.refresh.e2e.test")
	e.createNetOnly("rv", "--allow", "used.refresh.e2e.test")
	fe := e.followFlows("rf")
	fr := e.followFlows("rv")

	e.resolveTo("rf", "used.refresh.e2e.test", "198.18.1.10")
	e.resolveTo("rf", "idle.refresh.e2e.test", "198.18.1.11")
	e.resolveTo("rv", "used.refresh.e2e.test", "198.18.1.10")
	start := time.Now()
	for i := 0; time.Since(start) < 12*time.Second; i++ {
		if !e.refreshDial("rf", "198.18.1.10") {
			t.Fatalf("connection %d, %s after the answer: the used address is no longer allowed", i, time.Since(start).Round(time.Millisecond))
		}
		if i == 0 && !e.refreshDial("rf", "198.18.1.11") {
			t.Fatalf("control: the idle address is unreachable right after its answer")
		}
		if !e.refreshDial("rv", "198.18.1.10") {
			t.Fatalf("rv, connection %d: the used address is no longer allowed", i)
		}
		time.Sleep(1500 * time.Millisecond)
	}
	fe.drain(t, 200*time.Millisecond)
	// rf keeps using 198.18.1.10 (a connection at least every 5 s)
	// throughout what follows.
	used := func(when string) {
		t.Helper()
		if !e.refreshDial("rf", "198.18.1.10") {
			t.Fatalf("%s: the used address is no longer allowed", when)
		}
	}
	used("after the loop")
	if a := e.why("rf", "198.18.1.10:7"); a.Reason != "attested" {
		t.Errorf("why rf 198.18.1.10:7: %+v, want reason attested (refreshed)", a)
	}

	// The control: left idle for 12 s, its attestation (5 s) ran out.
	if e.refreshDial("rf", "198.18.1.11") {
		t.Fatalf("control: the idle address is still allowed 12 s after a 5 s attestation")
	}
	used("after the control")
	fe.expect(t, "idle address", map[string]any{"reason": "expired", "dst": "198.18.1.11", "name": "idle.refresh.e2e.test", "dport": float64(7)})
	if a := e.why("rf", "198.18.1.11:7"); a.Reason != "expired" || !strings.Contains(a.Detail, "idle.refresh.e2e.test") {
		t.Errorf("why rf 198.18.1.11:7: %+v, want reason expired naming idle.refresh.e2e.test", a)
	}
	used("after the event")

	// Revoked: rv's refreshed element goes with the update, and its own
	// connections do not bring it back; rf's use of the address goes on.
	e.update("rv", "--revoke", "used.refresh.e2e.test")
	fr.drain(t, 200*time.Millisecond)
	used("after the revoke")
	for i := 0; i < 4; i++ {
		if e.refreshDial("rv", "198.18.1.10") {
			t.Fatalf("rv, attempt %d after the revoke: the revoked address is reachable", i)
		}
		if !e.refreshDial("rf", "198.18.1.10") {
			t.Fatalf("rf, attempt %d after rv's revoke: its own refreshed address is no longer allowed", i)
		}
		time.Sleep(time.Second)
	}
	fr.expect(t, "revoked address", map[string]any{"reason": "not-allowed", "dst": "198.18.1.10"})

	// Deleting rf removes its refreshed element with it (rv's went with
	// the revoke): nothing in the live set names the address.
	list := func() string {
		return run(t, "ip", "netns", "exec", e.w.HostName, "nft", "list", "set", "inet", e.d.Prefix, "attested_live")
	}
	if out := list(); !strings.Contains(out, "198.18.1.10") {
		t.Fatalf("positive control: rf's refreshed element is not in attested_live:\n%s", out)
	}
	e.cli("session", "rm", "rf")
	if out := list(); strings.Contains(out, "198.18.1.10") {
		t.Errorf("after rm rf and rv's revoke, attested_live still lists 198.18.1.10:\n%s", out)
	}
}

// TestE2EAttestMaxLifetime: with --attest-max-lifetime 10s an address used
// every second stops being allowed within the maximum plus one sweep
// period (2.5 s) and one refresh (5 s), whatever the use; the drop says
// expired.
func TestE2EAttestMaxLifetime(t *testing.T) {
	e := newE2E(t, "--attest-max-lifetime", "10s")
	e.w.DNS.AddRR("max.refresh.e2e.test. 1 IN A 198.18.2.10")
	e.createNetOnly("mx", "--allow", "max.refresh.e2e.test")
	fe := e.followFlows("mx")
	e.resolveTo("mx", "max.refresh.e2e.test", "198.18.2.10")
	start := time.Now()
	var lastOK, firstFail time.Duration
	for time.Since(start) < 20*time.Second {
		at := time.Since(start)
		ok := e.refreshDial("mx", "198.18.2.10")
		switch {
		case ok && firstFail != 0:
			t.Fatalf("connected %s after the answer, after a failure at %s: the element came back", at.Round(time.Millisecond), firstFail.Round(time.Millisecond))
		case ok:
			lastOK = at
		case firstFail == 0:
			firstFail = at
		}
		time.Sleep(time.Second)
	}
	t.Logf("last connection %s, first refusal %s after the answer", lastOK.Round(time.Millisecond), firstFail.Round(time.Millisecond))
	if lastOK < 8*time.Second {
		t.Errorf("the used address stopped at %s, before the maximum lifetime (10 s)", firstFail)
	}
	if firstFail == 0 || firstFail > 18*time.Second {
		t.Errorf("the used address was still allowed %s after the answer (maximum 10 s, sweep 2.5 s, refresh 5 s)", lastOK)
	}
	fe.expect(t, "past the maximum", map[string]any{"reason": "expired", "dst": "198.18.2.10", "name": "max.refresh.e2e.test"})
}
