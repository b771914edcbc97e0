package integration

// The ClientHello as an attacker sends it (issue 22, PITFALLS 18 and 19):
// split across segments, trickled a byte at a time, never completed,
// without SNI, with a GREASE encrypted_client_hello, with a real ECH whose
// outer name is or is not allowed. Each is a real hello made by Go's
// crypto/tls (with its post-quantum key share, ~1.4 KB), sent as
// world.HelloPlan says; each refusal is checked against the captures.

import (
	"bytes"
	"crypto/tls"
	"strconv"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
)

// ncHoldBound bounds how long a hello that never completes (or trickles
// past the check's own bound) may be held before it ends refused.
const ncHoldBound = 30 * time.Second

// TestE2ENameCheckSplitHello: a hello split in two segments, the name in
// the second (and split in the middle of the name itself) is held until
// the name is known: another name is refused and not even the first
// segment reaches the server; the allowed name, split the same way, is
// served.
func TestE2ENameCheckSplitHello(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	n.attest(ns, ncAllowed)
	for _, plan := range []struct {
		what string
		plan func(name string) world.HelloPlan
	}{
		{"split after 40 bytes", func(string) world.HelloPlan {
			return world.HelloPlan{SplitAt: 40, Gap: 200 * time.Millisecond}
		}},
		{"split inside the name", func(name string) world.HelloPlan {
			return world.HelloPlan{SplitIn: name, Gap: 200 * time.Millisecond}
		}},
	} {
		body, _, err := n.tryTLS(ns, 443, n.tlsConf(ncAllowed), plan.plan(ncAllowed), 10*time.Second)
		n.served(plan.what+", the allowed name", body, err, ncAllowed)
		m := n.s.Mark()
		body, took, err := n.tryTLS(ns, 443, n.tlsConf(ncOther), plan.plan(ncOther), 20*time.Second)
		n.refused(plan.what+", another name", m, "", body, err, took, ncRefuseWithin)
	}
}

// TestE2ENameCheckTrickledHello: a hello trickled in 200-byte segments
// within the guest's retransmission timeout is read to its name: another
// name is refused with nothing at the server, the allowed name is served.
// A slower hello cannot complete: the check acknowledges nothing it holds,
// so a guest that waits past its retransmission timeout (200 ms at least)
// drops its congestion window to one segment and sends nothing new until
// the held one is acknowledged, and a byte-per-segment trickle stops at
// the initial window (10 segments) before its server_name. Such a hello
// ends refused at the check's bound (10 s; reason name-mismatch, cause
// incomplete) whatever its name, nothing delivered: held for a bounded
// time, never passed. (Clients write a hello in one write, whose segments
// arrive together.)
func TestE2ENameCheckTrickledHello(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	fe := n.followFlows("agent")
	n.attest(ns, ncAllowed)
	quick := world.HelloPlan{Trickle: 10 * time.Millisecond, Chunk: 200} // ~9 segments
	body, _, err := n.tryTLS(ns, 443, n.tlsConf(ncAllowed), quick, 20*time.Second)
	n.served("trickled in 200-byte segments, the allowed name", body, err, ncAllowed)
	m := n.s.Mark()
	body, took, err := n.tryTLS(ns, 443, n.tlsConf(ncOther), quick, 20*time.Second)
	n.refused("trickled in 200-byte segments, another name", m, "", body, err, took, ncRefuseWithin)
	fe.expect(t, "trickled, another name", map[string]any{"reason": "name-mismatch", "cause": "not-allowed", "name": ncOther})
	fe.drain(t, 200*time.Millisecond)

	for _, tc := range []struct {
		what, name string
		plan       world.HelloPlan
	}{
		{"one byte per segment, the allowed name", ncAllowed, world.HelloPlan{Trickle: 20 * time.Millisecond}},
		{"one byte per segment, another name", ncOther, world.HelloPlan{Trickle: 20 * time.Millisecond}},
		{"the name in the first segment, the rest 1 s later", ncAllowed, world.HelloPlan{SplitAt: 1000, Gap: time.Second}},
	} {
		m = n.s.Mark()
		body, took, err = n.tryTLS(ns, 443, n.tlsConf(tc.name), tc.plan, ncHoldBound+10*time.Second)
		n.refused("trickled slowly, "+tc.what, m, "", body, err, took, ncHoldBound)
		fe.expect(t, "trickled slowly, "+tc.what, map[string]any{"reason": "name-mismatch", "cause": "incomplete", "dst": ncShared})
		fe.drain(t, 200*time.Millisecond)
	}
}

// TestE2ENameCheckIncompleteHello: a hello that stops before its name (and
// one that stops after it, short of its end) is never passed on: it ends
// refused within ncHoldBound and the server gets nothing, even for the
// allowed name.
func TestE2ENameCheckIncompleteHello(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	fe := n.followFlows("agent")
	n.attest(ns, ncAllowed)
	for _, stop := range []int{100, 600} {
		m := n.s.Mark()
		body, took, err := n.tryTLS(ns, 443, n.tlsConf(ncAllowed), world.HelloPlan{Stop: stop}, ncHoldBound+10*time.Second)
		n.refused("a hello stopped at "+strconv.Itoa(stop)+" bytes", m, "", body, err, took, ncHoldBound)
		fe.expect(t, "a hello stopped at "+strconv.Itoa(stop)+" bytes", map[string]any{"reason": "name-mismatch", "cause": "incomplete", "dst": ncShared})
	}
	// The control: the whole hello is served.
	body, _, err := n.tryTLS(ns, 443, n.tlsConf(ncAllowed), world.HelloPlan{}, 10*time.Second)
	n.served("the whole hello", body, err, ncAllowed)
}

// TestE2ENameCheckNoSNI: a hello without server_name passes (no front end
// can route it to another tenant: it gets the address's default) and is
// served the default certificate.
func TestE2ENameCheckNoSNI(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	n.attest(ns, ncAllowed)
	m := n.s.Mark()
	body, _, err := n.tryTLS(ns, 443, world.NoSNIConfig(n.s.CA, ncAllowed), world.HelloPlan{}, 10*time.Second)
	n.served("no sni", body, err, ncAllowed)
	if cs := n.s.Since(m, "tls:443"); len(cs) != 1 || cs[0].ServerName() != "" {
		t.Errorf("no sni: captures %v, want one whose hello named nothing", cs)
	}
}

// TestE2ENameCheckECH: the outer name of a hello is what is checked. A
// GREASE encrypted_client_hello (what browsers send holding no ECH
// config) with the allowed name passes (the server reads the whole
// hello), with another name is refused; a real ECH whose outer (public)
// name is not allowed is refused, nothing at the server. The limit,
// stated in the threat model: a real ECH whose outer name is allowed
// reaches whatever inner name the server decrypts, which the check
// cannot see; the proxy strips ech from HTTPS records so a guest gets no
// config from DNS.
func TestE2ENameCheckECH(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	n.attest(ns, ncAllowed)
	grease := world.HelloPlan{Rewrite: world.AddGreaseECH}

	m := n.s.Mark()
	n.tryTLS(ns, 443, n.tlsConf(ncAllowed), grease, 10*time.Second) // the handshake fails at its end: the transcript differs
	if cs := n.s.Since(m, "tls:443"); len(cs) != 1 || cs[0].ServerName() != ncAllowed {
		t.Errorf("grease ech, the allowed name: captures %v, want the server to have read the hello (sni %s)", cs, ncAllowed)
	}
	m = n.s.Mark()
	body, took, err := n.tryTLS(ns, 443, n.tlsConf(ncOther), grease, 20*time.Second)
	n.refused("grease ech, another name", m, "", body, err, took, ncRefuseWithin)

	echConf := func(outer, inner string) *tls.Config {
		list, err := n.s.ECHConfigList(outer)
		if err != nil {
			t.Fatal(err)
		}
		c := n.tlsConf(inner)
		c.EncryptedClientHelloConfigList = list
		return c
	}
	m = n.s.Mark()
	body, took, err = n.tryTLS(ns, 443, echConf(ncOther, ncAllowed), world.HelloPlan{}, 20*time.Second)
	n.refused("ech, outer name "+ncOther, m, "", body, err, took, ncRefuseWithin)

	m = n.s.Mark()
	body, _, err = n.tryTLS(ns, 443, echConf(ncAllowed, ncOther), world.HelloPlan{}, 10*time.Second)
	n.served("ech, outer name "+ncAllowed+", inner "+ncOther+" (the stated limit)", body, err, ncOther)
	for _, c := range n.s.Since(m, "tls:443") {
		if bytes.Contains(c.Bytes(), []byte(ncOther)) {
			t.Errorf("ech: the inner name %s went in the clear: not a real ECH", ncOther)
		}
	}
}
