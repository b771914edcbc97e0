package integration

// The name check across a daemon restart (issue 22): the kernel holds the
// rule that sends a name-admitted flow's first payload to the check, so
// while the daemon is down such a flow is held, never passed unchecked;
// after a restart (SIGTERM or kill -9, mid-hello included) the check is
// back, and a hello held across the kill ends refused or is checked and
// passes, never reaching the server unchecked.

import (
	"syscall"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
)

// TestE2ENameCheckRestartFronting: before, while down and after a SIGTERM and a
// kill -9, fronting never reaches the server; after each restart the
// allowed name is served and fronting is refused again.
func TestE2ENameCheckRestartFronting(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	n.attest(ns, ncAllowed)
	check := func(when string) {
		t.Helper()
		body, _, err := n.tryTLS(ns, 443, n.tlsConf(ncAllowed), world.HelloPlan{}, 10*time.Second)
		n.served(when+": the allowed name", body, err, ncAllowed)
		m := n.s.Mark()
		body, took, err := n.tryTLS(ns, 443, n.tlsConf(ncOther), world.HelloPlan{}, 20*time.Second)
		n.refused(when+": fronting", m, "", body, err, took, ncRefuseWithin)
	}
	check("before the restart")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if err := n.d.Signal(sig); err != nil {
			t.Fatalf("%s: %v", sig, err)
		}
		m := n.s.Mark()
		body, _, err := n.tryTLS(ns, 443, n.tlsConf(ncOther), world.HelloPlan{}, 3*time.Second)
		if err == nil {
			t.Errorf("after %s, daemon down: fronting answered %q, want it held or refused (never unchecked)", sig, body)
		}
		n.noPayload("daemon down after "+sig.String()+": fronting", m, "")
		n.start()
		check("after " + sig.String() + " and a restart")
	}
}

// TestE2ENameCheckKillMidHello: a hello split in two, the daemon killed
// (-9) after its first segment and restarted before its second: another
// name never reaches the server (not even the first segment), the allowed
// name is served or refused, and a refused one leaves nothing at the
// server. A hello trickled across the kill likewise.
func TestE2ENameCheckKillMidHello(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	n.attest(ns, ncAllowed)
	for _, tc := range []struct {
		what string
		name string
		plan world.HelloPlan
	}{
		{"split, another name", ncOther, world.HelloPlan{SplitAt: 40, Gap: 4 * time.Second}},
		{"split, the allowed name", ncAllowed, world.HelloPlan{SplitAt: 40, Gap: 4 * time.Second}},
		{"trickled, another name", ncOther, world.HelloPlan{Trickle: 5 * time.Millisecond}},
	} {
		m := n.s.Mark()
		type result struct {
			body string
			err  error
		}
		done := make(chan result, 1)
		go func() {
			body, err := n.fetchTLS(ns, 443, n.tlsConf(tc.name), tc.plan, ncHoldBound+10*time.Second)
			done <- result{body, err}
		}()
		time.Sleep(time.Second)
		if err := n.d.Kill(); err != nil {
			t.Fatalf("%s: kill -9: %v", tc.what, err)
		}
		n.start()
		r := <-done
		switch {
		case tc.name == ncOther && r.err == nil:
			t.Errorf("%s, across a kill -9: answered %q, want refused", tc.what, r.body)
		case tc.name == ncOther:
			n.noPayload(tc.what+", across a kill -9", m, "")
		case r.err == nil:
			n.served(tc.what+", across a kill -9", r.body, r.err, ncAllowed)
		default:
			n.noPayload(tc.what+", refused across a kill -9", m, "")
		}
		// Whatever happened to the held flow, the check is back.
		mm := n.s.Mark()
		body, took, err := n.tryTLS(ns, 443, n.tlsConf(ncOther), world.HelloPlan{}, 20*time.Second)
		n.refused(tc.what+": fronting after the restart", mm, "", body, err, took, ncRefuseWithin)
	}
}
