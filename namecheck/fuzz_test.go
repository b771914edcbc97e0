package namecheck

import (
	"encoding/binary"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// FuzzInspect: no input panics, and a decision does not depend on how
// much came after it: once Inspect decides (anything but NeedMore), more
// bytes never change the decision. That is what makes the verdict
// independent of how the guest segments its first bytes.
func FuzzInspect(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"), []byte("GET / HTTP/1.1\r\nHost: b.example\r\n\r\n"))
	f.Add(clientHello(f, "a.example"), []byte{0x16, 3, 1})
	f.Add([]byte{0x16, 3, 1, 0, 5, 1, 0, 0, 1}, []byte{0})
	f.Add([]byte("SSH-2.0-x\r\n"), []byte("GET"))
	f.Fuzz(func(t *testing.T, b, more []byte) {
		r := Inspect(b)
		if r.Kind == NeedMore {
			return
		}
		if r2 := Inspect(append(b[:len(b):len(b)], more...)); !reflect.DeepEqual(r, r2) {
			t.Fatalf("Inspect(%q) = %+v, with %q after it %+v", b, r, more, r2)
		}
	})
}

// FuzzStream: a ClientHello cut at random points and sent in a random
// order, with random segments repeated, is read as the whole one is.
func FuzzStream(f *testing.F) {
	h := clientHello(f, "pkgs.example.org")
	f.Add(uint64(1), uint32(0), uint8(5))
	f.Add(uint64(7), uint32(0xffffff00), uint8(40))
	f.Fuzz(func(t *testing.T, seed uint64, start uint32, cuts uint8) {
		rng := rand.New(rand.NewPCG(seed, 3))
		pos := []int{0, len(h)}
		for range int(cuts) % 64 {
			pos = append(pos, rng.IntN(len(h)))
		}
		type seg struct{ a, b int }
		var segs []seg
		for i := range pos {
			for j := range pos {
				if pos[i] < pos[j] && rng.IntN(4) == 0 {
					segs = append(segs, seg{pos[i], pos[j]})
				}
			}
		}
		segs = append(segs, seg{0, len(h)})
		rng.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
		s := NewStream(start)
		for _, sg := range segs {
			if conflict, over := s.Add(start+uint32(sg.a), h[sg.a:sg.b]); conflict || over {
				t.Fatalf("segment %v: conflict %v over %v", sg, conflict, over)
			}
		}
		if r := Inspect(s.Prefix()); r.Kind != Named || r.Names[0] != "pkgs.example.org" {
			t.Fatalf("reassembled: %+v", r)
		}
	})
}

// FuzzChecker: whatever a guest sends (segments of an allowed or a
// refused hello at any sequence numbers, with any flags, its server's
// acknowledgements in between; over IPv4 or, when ops[0]&2, over IPv6
// with a destination options header on some of the guest's segments), a
// packet with payload never goes on before its flow was decided allowed
// or passed, a refused flow's never does, and every held packet is
// decided once.
func FuzzChecker(f *testing.F) {
	good, evil := clientHello(f, "pkgs.example.org"), clientHello(f, "evil.example")
	f.Add([]byte{0, 2, 1, 0, 0, 10, 1, 16, 0, 200})
	f.Add([]byte{1, 2, 1, 0, 0, 255, 3, 16, 1, 7, 2, 16, 0, 0})
	f.Add([]byte{2, 1, 0, 0, 0, 10, 1, 0x40, 0, 200, 2, 16, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		v6 := len(ops) > 0 && ops[0]&2 == 2
		// segment is a guest's (or, from the server, its) TCP packet in
		// the fuzzed family; ext puts a destination options header on a
		// v6 one.
		segment := func(fromGuest bool, seq, ack uint32, flags byte, payload []byte, ext bool) []byte {
			if !v6 {
				if !fromGuest {
					p := tcpPacket(cdn, guest, 40000, seq, flags, payload)
					p[20], p[21], p[22], p[23] = 443>>8, 443&0xff, 40000>>8, 40000&0xff
					binary.BigEndian.PutUint32(p[28:], ack)
					return p
				}
				return tcpPacket(guest, cdn, 443, seq, flags, payload)
			}
			var hdrs [][]byte
			if ext {
				hdrs = append(hdrs, destOpts)
			}
			if !fromGuest {
				return tcp6Packet(cdn6, guest6, 443, 40000, seq, ack, flags, payload, hdrs...)
			}
			return tcp6Packet(guest6, cdn6, 40000, 443, seq, 0, flags, payload, hdrs...)
		}
		c := NewChecker(Config{Judge: judgeOnly("pkgs.example.org")})
		now := time.Unix(1, 0)
		hello := good
		if len(ops) > 0 && ops[0]&1 == 1 {
			hello = evil
		}
		var id uint32
		decided := map[uint32]bool{}
		result := ""
		for i := 1; i+2 < len(ops); i += 3 {
			op, a, b := ops[i], int(ops[i+1]), int(ops[i+2])
			id++
			var pkt []byte
			fromGuest := true
			payload := false
			ext := op&0x40 != 0
			switch op % 4 {
			case 0: // a segment of the hello at its place
				off := a * len(hello) / 256
				end := min(len(hello), off+1+b*8)
				pkt = segment(true, isn+1+uint32(off), 0, tcpACK, hello[off:end], ext)
				payload = true
			case 1: // a SYN: a new flow on the same ports (port reuse)
				pkt = segment(true, isn, 0, tcpSYN, nil, ext)
				result = ""
			case 2: // the server's acknowledgement
				pkt = segment(false, 9, isn+1+uint32(b*16), byte(a)&tcpACK|tcpACK, nil, ext)
				fromGuest = false
			case 3: // a segment with other bytes, anywhere
				pkt = segment(true, isn+uint32(a), 0, byte(b)&^tcpSYN|tcpACK, []byte{byte(a), byte(b)}, ext)
				payload = byte(b)&tcpRST == 0
			}
			if op&0x80 != 0 {
				now = now.Add(11 * time.Second)
			}
			vs, d := c.Packet(now, id, pkt, fromGuest)
			if d != nil {
				result = d.Result
			}
			for _, v := range vs {
				if v.ID == id && payload && fromGuest && (v.Action == Accept || v.Action == Pass) &&
					result != ResultAllowed && result != ResultPassed {
					t.Fatalf("op %d: a payload packet went on (%v) while the flow's result is %q", i, v.Action, result)
				}
			}
			evs, eds := c.Expire(now)
			vs = append(vs, evs...)
			for _, d := range eds {
				result = d.Result
			}
			for _, v := range vs {
				if decided[v.ID] {
					t.Fatalf("packet %d decided twice", v.ID)
				}
				decided[v.ID] = true
			}
		}
	})
}

// FuzzParseIP: any bytes parse or not without a panic, and what parses
// keeps its transport header inside the packet, with its addresses of the
// packet's own family.
func FuzzParseIP(f *testing.F) {
	f.Add(tcpPacket(guest, cdn, 443, 1, tcpSYN, nil))
	f.Add(tcp6Packet(guest6, cdn6, 40000, 443, 1, 0, tcpSYN, nil, destOpts, destOpts))
	f.Fuzz(func(t *testing.T, p []byte) {
		ip, ok := parseIP(p)
		if !ok {
			return
		}
		if len(ip.l4) > len(p) || ip.src.Is4() != (p[0]>>4 == 4) || ip.ext && p[0]>>4 != 6 {
			t.Fatalf("parsed %+v from % x", ip, p)
		}
	})
}
