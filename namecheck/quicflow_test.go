package namecheck

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
)

// udpPacket is an IPv4 UDP packet from guest:40000 to dst:port.
func udpPacket(guest, dst netip.Addr, port uint16, payload []byte) []byte {
	p := make([]byte, 28+len(payload))
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	p[8], p[9] = 64, udpProto
	g, d := guest.As4(), dst.As4()
	copy(p[12:], g[:])
	copy(p[16:], d[:])
	binary.BigEndian.PutUint16(p[20:], 40000)
	binary.BigEndian.PutUint16(p[22:], port)
	binary.BigEndian.PutUint16(p[24:], uint16(8+len(payload)))
	copy(p[28:], payload)
	return p
}

// initials is sni's ClientHello over two Initial packets.
func initials(t testing.TB, sni string) [][]byte {
	hs := quicHello(t, sni)
	cut := len(hs) / 2
	return [][]byte{
		sealInitial(t, QUICv1, testDCID, 0, cryptoFrame(0, hs[:cut])),
		sealInitial(t, QUICv1, testDCID, 1, cryptoFrame(cut, hs[cut:])),
	}
}

// TestCheckerQUIC: a QUIC flow's datagrams are held until its hello is
// whole; then all pass (allowed) or the first is refused and the rest
// dropped (a fronting name, not QUIC); a flow that never completes its
// hello ends refused, by time and by datagrams.
func TestCheckerQUIC(t *testing.T) {
	now := time.Unix(100, 0)
	c := NewChecker(Config{Judge: judgeOnly("pkgs.example.org")})
	good := initials(t, "pkgs.example.org")
	if vs, d := c.Packet(now, 1, udpPacket(guest, cdn, 443, good[0]), true); len(vs) != 0 || d != nil {
		t.Fatalf("half a hello decided: %v %+v", vs, d)
	}
	vs, d := c.Packet(now, 2, udpPacket(guest, cdn, 443, good[1]), true)
	if d == nil || d.Result != ResultAllowed || !d.UDP || d.Via != ViaQUIC || d.Name != "pkgs.example.org" {
		t.Fatalf("decision %+v", d)
	}
	if len(vs) != 2 || vs[0] != (Verdict{1, Pass}) || vs[1] != (Verdict{2, Pass}) {
		t.Fatalf("verdicts %v, want both passed", vs)
	}
	if vs, _ := c.Packet(now, 3, udpPacket(guest, cdn, 443, []byte{0x40, 1, 2}), true); vs[0].Action != Pass {
		t.Fatalf("a later datagram of an allowed flow: %v", vs)
	}

	evil := initials(t, "evil.example")
	other := netip.MustParseAddr("198.18.3.11")
	c.Packet(now, 10, udpPacket(guest, other, 443, evil[0]), true)
	vs, d = c.Packet(now, 11, udpPacket(guest, other, 443, evil[1]), true)
	if d == nil || d.Result != ResultRefused || d.Cause != CauseNotAllowed || d.Name != "evil.example" || d.Lacked != "evil.example:443" {
		t.Fatalf("fronting decision %+v", d)
	}
	if len(vs) != 2 || vs[0] != (Verdict{10, Refuse}) || vs[1] != (Verdict{11, Drop}) {
		t.Fatalf("fronting verdicts %v", vs)
	}
	if vs, _ := c.Packet(now, 12, udpPacket(guest, other, 443, good[0]), true); vs[0].Action != Drop {
		t.Fatalf("a refused flow's next datagram: %v", vs)
	}

	third := netip.MustParseAddr("198.18.3.12")
	vs, d = c.Packet(now, 20, udpPacket(guest, third, 443, []byte("not quic at all")), true)
	if d == nil || d.Result != ResultRefused || d.Cause != CauseNotQUIC || vs[0] != (Verdict{20, Refuse}) {
		t.Fatalf("not QUIC: %v %+v", vs, d)
	}

	// Half a hello, then nothing: refused after HoldFor.
	fourth := netip.MustParseAddr("198.18.3.13")
	c.Packet(now, 30, udpPacket(guest, fourth, 443, good[0]), true)
	evs, eds := c.Expire(now.Add(11 * time.Second))
	if len(eds) != 1 || eds[0].Cause != CauseIncomplete || !eds[0].UDP || len(evs) != 1 || evs[0] != (Verdict{30, Refuse}) {
		t.Fatalf("expired: %v %+v", evs, eds)
	}

	// The same half again and again: refused at MaxQUICDatagrams.
	fifth := netip.MustParseAddr("198.18.3.14")
	for i := range MaxQUICDatagrams {
		vs, d = c.Packet(now, uint32(40+i), udpPacket(guest, fifth, 443, good[0]), true)
	}
	if d == nil || d.Cause != CauseIncomplete || len(vs) != MaxQUICDatagrams || vs[0].Action != Refuse {
		t.Fatalf("bounded by datagrams: %d verdicts, %+v", len(vs), d)
	}
	if n := c.guests[guest].holding; n != 0 {
		t.Fatalf("holding %d after every flow was decided", n)
	}
}

// FuzzQUICHello: any datagrams, read one after another, never panic,
// and a name is only ever read from a hello that decrypted.
func FuzzQUICHello(f *testing.F) {
	good := initials(f, "pkgs.example.org")
	f.Add(good[0], good[1])
	f.Add(good[1][:100], good[0])
	f.Add([]byte{0xc0, 0, 0, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0x41, 0}, []byte{})
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var h QUICHello
		h.Add(a)
		r := h.Add(b)
		if r.Kind == Named && r.Via != ViaQUIC {
			t.Fatalf("named via %q", r.Via)
		}
	})
}

// FuzzCheckerQUIC: whatever datagrams a guest sends on one flow (pieces
// of an allowed or a refused hello's Initials, bytes of its own, time
// passing), no datagram goes on before the flow was decided allowed or
// passed, a refused flow's never does, and every held one is decided
// once.
//
// fuzz.sh: 3000x
func FuzzCheckerQUIC(f *testing.F) {
	good, evil := initials(f, "pkgs.example.org"), initials(f, "evil.example")
	f.Add([]byte{0, 0, 0, 1, 0, 0})
	f.Add([]byte{1, 1, 0, 0, 0, 0, 2, 7, 9})
	f.Add([]byte{0, 0x80, 0, 0, 1, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		c := NewChecker(Config{Judge: judgeOnly("pkgs.example.org")})
		now := time.Unix(1, 0)
		pkts := good
		if len(ops) > 0 && ops[0]&1 == 1 {
			pkts = evil
		}
		var id uint32
		decided := map[uint32]bool{}
		result := ""
		for i := 1; i+2 < len(ops); i += 3 {
			op, a, b := ops[i], ops[i+1], ops[i+2]
			id++
			var payload []byte
			switch op % 3 {
			case 0:
				payload = pkts[a%2]
			case 1:
				payload = append([]byte{0xc0 | a&0x3f, 0, 0, 0, 1, 8}, pkts[a%2][6:min(len(pkts[a%2]), 6+int(b)*8)]...)
			case 2:
				payload = []byte{a, b}
			}
			if op&0x80 != 0 {
				now = now.Add(11 * time.Second)
			}
			vs, d := c.Packet(now, id, udpPacket(guest, cdn, 443, payload), true)
			if d != nil {
				result = d.Result
			}
			evs, eds := c.Expire(now)
			for _, d := range eds {
				result = d.Result
			}
			for _, v := range append(vs, evs...) {
				if (v.Action == Accept || v.Action == Pass) && result != ResultAllowed && result != ResultPassed {
					t.Fatalf("op %d: datagram %d went on (%v) while the flow's result is %q", i, v.ID, v.Action, result)
				}
				if decided[v.ID] {
					t.Fatalf("datagram %d decided twice", v.ID)
				}
				decided[v.ID] = true
			}
		}
	})
}
