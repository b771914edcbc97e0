package namecheck

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

var (
	guest = netip.MustParseAddr("10.20.0.2")
	cdn   = netip.MustParseAddr("198.18.1.10")
)

// judgeOnly allows name on port 443 and nothing else.
func judgeOnly(name string) Judge {
	return func(_ netip.Addr, n string, port uint16, _ bool) (string, bool) {
		if n == name && port == 443 {
			return "", true
		}
		return n + ":443", false
	}
}

type run struct {
	t    *testing.T
	c    *Checker
	now  time.Time
	id   uint32
	held map[uint32]bool
}

func newRun(t *testing.T, allowed string) *run {
	return &run{t: t, c: NewChecker(Config{Judge: judgeOnly(allowed)}), now: time.Unix(1000, 0), held: map[uint32]bool{}}
}

// send queues a packet and returns the verdicts and decision it made.
func (r *run) send(seq uint32, flags byte, payload []byte) ([]Verdict, *Decision) {
	r.id++
	vs, d := r.c.Packet(r.now, r.id, tcpPacket(guest, cdn, 443, seq, flags, payload), true)
	decided := map[uint32]bool{}
	for _, v := range vs {
		if decided[v.ID] {
			r.t.Fatalf("packet %d decided twice", v.ID)
		}
		decided[v.ID] = true
		delete(r.held, v.ID)
	}
	if !decided[r.id] {
		r.held[r.id] = true
	}
	return vs, d
}

// serverAck queues the server's acknowledgement of every byte up to ack
// and returns its verdicts.
func (r *run) serverAck(ack uint32) []Verdict {
	r.id++
	p := tcpPacket(cdn, guest, 40000, 7, tcpACK, nil)
	p[20], p[21], p[22], p[23] = 443>>8, 443&0xff, 40000>>8, 40000&0xff
	binary.BigEndian.PutUint32(p[28:], ack)
	vs, _ := r.c.Packet(r.now, r.id, p, false)
	return vs
}

var isn uint32 = 0xfffffff0 // the sequence numbers wrap inside the hello

// An allowed SNI passes, split in segments sent out of order and
// duplicated: every segment is held until the last, then all pass.
func TestCheckerSplitOutOfOrder(t *testing.T) {
	for _, tc := range []struct {
		sni    string
		result string
		action Action
	}{{"pkgs.example.org", ResultAllowed, Accept}, {"evil.example", ResultRefused, Refuse}} {
		r := newRun(t, "pkgs.example.org")
		if vs, _ := r.send(isn, tcpSYN, nil); len(vs) != 1 || vs[0].Action != Accept {
			t.Fatalf("SYN: %+v, want accept", vs)
		}
		r.send(isn+1, tcpACK, nil)
		h := clientHello(t, tc.sni)
		var segs [][2]int
		for off := 0; off < len(h); off += 300 {
			segs = append(segs, [2]int{off, min(off+300, len(h))})
		}
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
		// The first segment last, so nothing can be decided before it.
		for i, s := range segs {
			if s[0] == 0 {
				segs[i], segs[len(segs)-1] = segs[len(segs)-1], segs[i]
			}
		}
		var d *Decision
		var vs []Verdict
		for i, s := range segs {
			vs, d = r.send(isn+1+uint32(s[0]), tcpACK, h[s[0]:s[1]])
			if i < len(segs)-1 {
				if len(vs) != 0 || d != nil {
					t.Fatalf("%s: segment %d decided early: %+v %+v", tc.sni, i, vs, d)
				}
				r.send(isn+1+uint32(s[0]), tcpACK, h[s[0]:s[1]]) // a retransmission
			}
		}
		if d == nil || d.Result != tc.result || d.Via != ViaTLS || d.Name != tc.sni {
			t.Fatalf("%s: decision %+v, want %s via tls-sni name %s", tc.sni, d, tc.result, tc.sni)
		}
		if tc.result == ResultRefused && d.Lacked != "evil.example:443" {
			t.Errorf("lacked %q, want evil.example:443", d.Lacked)
		}
		if len(r.held) != 0 {
			t.Fatalf("%s: packets left held: %v", tc.sni, r.held)
		}
		answered := 0
		for _, v := range vs {
			switch {
			case v.Action == tc.action:
				answered++
			case tc.action == Refuse && v.Action == Drop:
			default:
				t.Errorf("%s: verdict %+v", tc.sni, v)
			}
		}
		if tc.action == Refuse && answered != 1 || tc.action == Accept && answered != len(vs) {
			t.Errorf("%s: %d %v verdicts of %d", tc.sni, answered, tc.action, len(vs))
		}
		if tc.action == Refuse {
			if vs, _ = r.send(isn+1, tcpACK, h[:10]); vs[0].Action != Drop {
				t.Errorf("late packet of a refused flow: %+v, want drop", vs[0])
			}
			continue
		}
		// Allowed: pending until the server acknowledges the checked
		// bytes; a retransmission of them goes on meanwhile, an ACK short
		// of them confirms nothing, the full one marks the flow (Pass).
		if vs, _ = r.send(isn+1, tcpACK, h[:10]); vs[0].Action != Accept {
			t.Errorf("retransmission while awaiting: %+v, want accept", vs[0])
		}
		if vs = r.serverAck(isn + 1 + uint32(len(h)) - 1); vs[0].Action != Accept {
			t.Errorf("partial ACK: %+v, want accept", vs)
		}
		if vs = r.serverAck(isn + 1 + uint32(len(h))); vs[0].Action != Pass {
			t.Errorf("full ACK: %+v, want pass", vs)
		}
		if vs, _ = r.send(isn+1+uint32(len(h)), tcpACK, []byte("more")); vs[0].Action != Pass {
			t.Errorf("late packet of a confirmed flow: %+v, want pass", vs[0])
		}
	}
}

// A byte that changes on retransmission is a conflict: refused.
func TestCheckerConflict(t *testing.T) {
	r := newRun(t, "pkgs.example.org")
	r.send(isn, tcpSYN, nil)
	h := clientHello(t, "pkgs.example.org")
	r.send(isn+1+100, tcpACK, h[100:200])
	evil := append([]byte{}, h[100:200]...)
	evil[5] ^= 1
	vs, d := r.send(isn+1+100, tcpACK, evil)
	if d == nil || d.Result != ResultRefused || d.Cause != CauseUnreadable || len(vs) != 2 {
		t.Fatalf("conflict: %+v %+v, want refused unreadable, both packets answered", vs, d)
	}
}

// Non-TLS, non-HTTP first bytes pass; a flow whose SYN was not seen is
// refused; a SYN with data (TCP Fast Open) is dropped.
func TestCheckerPassAndUnknown(t *testing.T) {
	r := newRun(t, "pkgs.example.org")
	r.send(isn, tcpSYN, nil)
	vs, d := r.send(isn+1, tcpACK|0x08, []byte("SSH-2.0-OpenSSH_9.2\r\n"))
	if d == nil || d.Result != ResultPassed || vs[0].Action != Accept {
		t.Fatalf("ssh: %+v %+v, want passed", vs, d)
	}
	r2 := newRun(t, "pkgs.example.org")
	vs, d = r2.send(isn+1, tcpACK, []byte("GET / HTTP/1.1\r\nHost: pkgs.example.org\r\n\r\n"))
	if d == nil || d.Result != ResultRefused || d.Cause != CauseIncomplete || vs[0].Action != Refuse {
		t.Fatalf("unknown start: %+v %+v, want refused incomplete", vs, d)
	}
	if vs, _ := r2.send(isn, tcpSYN, []byte("GET")); vs[len(vs)-1].Action != Drop {
		t.Errorf("SYN with data: %+v, want drop", vs)
	}
}

// A hello that never completes is refused after HoldFor; one past
// MaxBytes at once.
func TestCheckerBounds(t *testing.T) {
	r := newRun(t, "pkgs.example.org")
	r.send(isn, tcpSYN, nil)
	h := clientHello(t, "pkgs.example.org")
	r.send(isn+1, tcpACK, h[:100])
	if vs, ds := r.c.Expire(r.now.Add(9 * time.Second)); len(vs)+len(ds) != 0 {
		t.Fatalf("expired early: %+v %+v", vs, ds)
	}
	vs, ds := r.c.Expire(r.now.Add(10 * time.Second))
	if len(ds) != 1 || ds[0].Cause != CauseIncomplete || len(vs) != 1 || vs[0].Action != Refuse {
		t.Fatalf("trickle: %+v %+v, want refused incomplete", vs, ds)
	}
	r = newRun(t, "pkgs.example.org")
	r.send(isn, tcpSYN, nil)
	_, d := r.send(isn+1+MaxBytes-10, tcpACK, make([]byte, 20))
	if d == nil || d.Cause != CauseIncomplete {
		t.Fatalf("past MaxBytes: %+v, want refused incomplete", d)
	}
}

// One guest's flows holding payload are bounded: beyond MaxHolding a
// new flow's payload is dropped (not held), and another guest is not
// affected.
func TestCheckerHoldingBound(t *testing.T) {
	c := NewChecker(Config{Judge: judgeOnly("x.example"), MaxHolding: 2})
	now := time.Unix(1, 0)
	other := netip.MustParseAddr("10.20.0.6")
	pkt := func(g netip.Addr, port uint16, flags byte, payload []byte) []byte {
		p := tcpPacket(g, cdn, 443, isn, flags, payload)
		p[20], p[21] = byte(port>>8), byte(port)
		if flags == tcpACK {
			p[24+3]++ // seq isn+1
		}
		return p
	}
	for port := uint16(1); port <= 3; port++ {
		c.Packet(now, 1, pkt(guest, port, tcpSYN, nil), true)
		vs, _ := c.Packet(now, uint32(port*10), pkt(guest, port, tcpACK, []byte{0x16}), true)
		if port <= 2 && len(vs) != 0 || port == 3 && (len(vs) != 1 || vs[0].Action != Drop) {
			t.Errorf("flow %d: %+v", port, vs)
		}
	}
	c.Packet(now, 1, pkt(other, 9, tcpSYN, nil), true)
	if vs, _ := c.Packet(now, 90, pkt(other, 9, tcpACK, []byte{0x16}), true); len(vs) != 0 {
		t.Errorf("another guest's flow was not held: %+v", vs)
	}
}

// A removed session's flows are forgotten, their held packets dropped.
func TestCheckerForgetGuest(t *testing.T) {
	r := newRun(t, "pkgs.example.org")
	r.send(isn, tcpSYN, nil)
	r.send(isn+1, tcpACK, []byte{0x16, 3, 1})
	vs := r.c.ForgetGuest(guest)
	if len(vs) != 1 || vs[0].Action != Drop || r.c.Flows() != 0 {
		t.Fatalf("ForgetGuest: %+v, %d flows left; want the held packet dropped, none left", vs, r.c.Flows())
	}
}

// What the server discarded cannot pass for what it read: an allowed hello
// sent, not acknowledged, then a changed byte at the same place refuses
// the flow (both places of the server's window get a reset); one never
// acknowledged is refused after HoldFor, its next packet answered.
func TestCheckerAwaitsTheServer(t *testing.T) {
	r := newRun(t, "pkgs.example.org")
	r.send(isn, tcpSYN, nil)
	good, evil := clientHello(t, "pkgs.example.org"), clientHello(t, "evil.example")
	if vs, d := r.send(isn+1, tcpACK, good); d == nil || d.Result != ResultAllowed || vs[0].Action != Accept {
		t.Fatalf("allowed hello: %+v %+v", vs, d)
	}
	vs, d := r.send(isn+1, tcpACK, evil)
	if d == nil || d.Result != ResultRefused || d.Cause != CauseUnreadable || vs[0].Action != Refuse || d.SeqAlt != isn+1+uint32(len(good)) || d.Was != ResultAllowed {
		t.Fatalf("changed bytes before the server's ACK: %+v %+v, want refused unreadable", vs, d)
	}
	if vs := r.serverAck(isn + 1 + uint32(len(good))); vs[0].Action != Accept {
		t.Errorf("the server's ACK after the refusal: %+v, want accept (no mark)", vs)
	}

	r = newRun(t, "pkgs.example.org")
	r.send(isn, tcpSYN, nil)
	r.send(isn+1, tcpACK, good)
	_, ds := r.c.Expire(r.now.Add(10 * time.Second))
	if len(ds) != 1 || ds[0].Cause != CauseUnconfirmed {
		t.Fatalf("never acknowledged: %+v, want refused unconfirmed", ds)
	}
	if vs, _ := r.send(isn+1, tcpACK, good); vs[0].Action != Refuse {
		t.Errorf("next packet after the refusal: %+v, want refuse (it carries the answer)", vs)
	}
}

// A connection closed without a byte sent (a connect probe) is forgotten
// at its FIN: probes never use up the guest's MaxFlows.
func TestCheckerProbesDoNotAccumulate(t *testing.T) {
	c := NewChecker(Config{Judge: judgeOnly("x.example"), MaxFlows: 2})
	now := time.Unix(1, 0)
	for i := range 10 {
		syn := tcpPacket(guest, cdn, 443, isn, tcpSYN, nil)
		if vs, _ := c.Packet(now, uint32(2*i), syn, true); vs[len(vs)-1].Action != Accept {
			t.Fatalf("probe %d: SYN %+v, want accept", i, vs)
		}
		c.Packet(now, uint32(2*i+1), tcpPacket(guest, cdn, 443, isn+1, tcpFIN|tcpACK, nil), true)
	}
	if c.Flows() != 0 {
		t.Errorf("%d flows kept after closed probes, want 0", c.Flows())
	}
}

// Urgent data in the checked bytes refuses the flow: the server's TCP
// takes the urgent byte out of the stream, so it would read other bytes
// than the checked ones; after the server's acknowledgement it is the
// application's business.
func TestCheckerUrgentData(t *testing.T) {
	r := newRun(t, "pkgs.example.org")
	r.send(isn, tcpSYN, nil)
	req := []byte("GET / HTTP/1.1\r\nHosxt: evil.example\r\nHost: pkgs.example.org\r\n\r\n")
	vs, d := r.send(isn+1, tcpACK|tcpURG, req)
	if d == nil || d.Result != ResultRefused || d.Cause != CauseUnreadable || vs[0].Action != Refuse {
		t.Fatalf("urgent byte in the request: %+v %+v, want refused unreadable", vs, d)
	}
	r = newRun(t, "pkgs.example.org")
	r.send(isn, tcpSYN, nil)
	ok := []byte("GET / HTTP/1.1\r\nHost: pkgs.example.org\r\n\r\n")
	if _, d := r.send(isn+1, tcpACK, ok); d == nil || d.Result != ResultAllowed {
		t.Fatalf("control: %+v, want allowed", d)
	}
	if vs, d := r.send(isn+1+uint32(len(ok)), tcpACK|tcpURG, []byte("x")); d == nil || d.Result != ResultRefused || vs[0].Action != Refuse {
		t.Fatalf("urgent byte before the server's acknowledgement: %+v %+v, want refused", vs, d)
	}
}
