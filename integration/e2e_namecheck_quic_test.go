package integration

// QUIC under the name check, by the session's choice (issue 22, item
// 3): --quic check reads the ClientHello in the QUIC Initial packets
// (RFC 9001 5: anyone can decrypt them) and checks its server_name as a
// TLS flow's; --quic refuse (the default, TestE2ENameCheckQUICFallback)
// answers UDP/443 with an ICMP error so clients fall back to TCP. The
// shared address's UDP :443 sink records every datagram that arrives: a
// refused flow leaves none there.

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
)

// quicSplitHello is crypto/tls's QUIC ClientHello for sni (the
// post-quantum key share makes it larger than one packet) in two Initial
// packets.
func quicSplitHello(t *testing.T, sni string) [][]byte {
	t.Helper()
	hello, err := world.QUICClientHello(sni, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(hello) < 1200 {
		t.Fatalf("the QUIC ClientHello is %d bytes, want more than one packet holds", len(hello))
	}
	return world.QUICInitials(hello, len(hello)/2)
}

// TestE2ENameCheckQUICCheck: with --quic check, crypto/tls's QUIC
// ClientHello in an Initial packet (protected by the test as RFC 9001
// says) asking a shared address for the allowed name gets through (the
// sink has it); asking for another name, it never arrives, the client
// gets ICMP admin-prohibited and a flow event says name-mismatch via
// quic-sni; a hello split over two
// Initial packets sent apart is held whole and passes (allowed) or is
// refused with ICMP admin-prohibited (fronting); a datagram that is not
// a readable Initial is refused; an update to --quic refuse brings back
// the drop reason quic, and back to check the allowed name passes again.
func TestE2ENameCheckQUICCheck(t *testing.T) {
	n := newNameCheckE2E(t)
	info := n.createNetOnly("agent", "--allow", ncAllowed, "--quic", "check")
	if info.Policy.QUIC != "check" {
		t.Fatalf("create --quic check: policy.quic %q", info.Policy.QUIC)
	}
	ns := n.nsPath("agent")
	fe := n.followFlows("agent")
	n.attest(ns, ncAllowed)
	dst := n.at(world.SharedQUICPort)

	// crypto/tls's QUIC hello without the post-quantum share, in one
	// Initial: the allowed name's datagram arrives (the sink answers
	// nothing), the other tenant's is refused with ICMP and never does.
	for _, c := range []struct {
		sni     string
		allowed bool
	}{{ncAllowed, true}, {ncOther, false}} {
		hello, err := world.QUICClientHello(c.sni, false)
		if err != nil {
			t.Fatal(err)
		}
		m := n.s.Mark()
		err = world.SendDatagrams(ns, dst, 0, 2*time.Second, world.QUICInitials(hello)...)
		if c.allowed {
			if !world.IsTimeout(err) {
				t.Errorf("one initial, %s: %v, want sent and unanswered", c.sni, err)
			}
			if cs := n.s.Since(m, "udp:443"); len(cs) != 1 || len(cs[0].Bytes()) != 1200 {
				t.Errorf("one initial, %s: the sink got %v, want the 1200-byte datagram", c.sni, cs)
			}
			continue
		}
		if !errors.Is(err, syscall.EHOSTUNREACH) {
			t.Errorf("one initial, %s: %v, want EHOSTUNREACH (ICMP admin-prohibited)", c.sni, err)
		}
		n.noPayload("one initial, fronting", m, "udp:443")
		fe.expect(t, "one initial, fronting", map[string]any{"reason": "name-mismatch", "proto": "udp", "via": "quic-sni",
			"name": ncOther, "dst": ncShared, "dport": float64(443), "lacked": ncOther + ":443/udp", "answer": "icmp-admin-prohibited"})
		fe.drain(t, 200*time.Millisecond)
	}

	// The post-quantum hello split over two Initial packets, 300 ms
	// apart: held whole.
	m := n.s.Mark()
	err := world.SendDatagrams(ns, dst, 300*time.Millisecond, 2*time.Second, quicSplitHello(t, ncAllowed)...)
	if !world.IsTimeout(err) {
		t.Errorf("split hello, the allowed name: %v, want sent and unanswered", err)
	}
	if cs := n.s.Since(m, "udp:443"); len(cs) != 1 || len(cs[0].Bytes()) != 2400 {
		t.Errorf("split hello, the allowed name: the sink got %v, want both 1200-byte datagrams", cs)
	}
	m = n.s.Mark()
	err = world.SendDatagrams(ns, dst, 300*time.Millisecond, e2eRejectWait, quicSplitHello(t, ncOther)...)
	if !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Errorf("split hello, fronting: %v, want EHOSTUNREACH (ICMP admin-prohibited)", err)
	}
	n.noPayload("split hello, fronting", m, "udp:443")
	fe.expect(t, "split hello fronting", map[string]any{"reason": "name-mismatch", "via": "quic-sni", "name": ncOther})
	fe.drain(t, 200*time.Millisecond)

	// Not a readable Initial (random bytes behind a v1 long header): no
	// name to check, refused.
	m = n.s.Mark()
	if err := world.QUICInitial(ns, dst, e2eRejectWait); !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Errorf("an unreadable initial: %v, want EHOSTUNREACH", err)
	}
	n.noPayload("an unreadable initial", m, "udp:443")
	fe.expect(t, "unreadable initial", map[string]any{"reason": "name-mismatch", "proto": "udp", "cause": "unreadable"})
	fe.drain(t, 200*time.Millisecond)

	// The choice is the session's: refuse brings back the drop reason quic
	// (the allowed name refused too: clients fall back to TCP).
	if info := n.update("agent", "--quic", "refuse"); info.Policy.QUIC != "refuse" {
		t.Fatalf("update --quic refuse: policy.quic %q", info.Policy.QUIC)
	}
	m = n.s.Mark()
	err = world.SendDatagrams(ns, dst, 0, e2eRejectWait, quicSplitHello(t, ncAllowed)...)
	if !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Errorf("--quic refuse, the allowed name: %v, want EHOSTUNREACH", err)
	}
	n.noPayload("--quic refuse", m, "udp:443")
	fe.expect(t, "--quic refuse", map[string]any{"reason": "quic", "proto": "udp", "dst": ncShared, "dport": float64(443)})

	n.update("agent", "--quic", "check")
	m = n.s.Mark()
	if err := world.SendDatagrams(ns, dst, 0, 2*time.Second, quicSplitHello(t, ncAllowed)...); !world.IsTimeout(err) {
		t.Errorf("back to --quic check, the allowed name: %v, want sent and unanswered", err)
	}
	if cs := n.s.Since(m, "udp:443"); len(cs) != 1 || len(cs[0].Bytes()) != 2400 {
		t.Errorf("back to --quic check: the sink got %v, want both datagrams", cs)
	}
	if nc := n.inspect("agent").NameCheck; nc == nil || nc.Allowed < 3 || nc.Refused < 3 {
		t.Errorf("inspect name_check: %+v, want the QUIC flows counted (3 allowed, 3 refused)", nc)
	}
}
