package namecheck

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
)

var (
	guest6 = netip.MustParseAddr("fd00:20::2")
	cdn6   = netip.MustParseAddr("2001:2:0:3::10")
)

// ip6Packet is an IPv6 packet from src to dst carrying l4 (protocol
// proto) after the extension headers ext (each a whole header whose
// next-header byte this fills in).
func ip6Packet(src, dst netip.Addr, proto byte, l4 []byte, ext ...[]byte) []byte {
	p := make([]byte, 40)
	p[0] = 0x60
	p[7] = 64
	s, d := src.As16(), dst.As16()
	copy(p[8:], s[:])
	copy(p[24:], d[:])
	next := &p[6]
	for _, h := range ext {
		*next = ip6DestOpts
		h = append([]byte(nil), h...)
		p = append(p, h...)
		next = &p[len(p)-len(h)]
	}
	*next = proto
	p = append(p, l4...)
	binary.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
	return p
}

// tcp6Packet is tcpPacket over IPv6, with extension headers ext.
func tcp6Packet(src, dst netip.Addr, sport, dport uint16, seq, ack uint32, flags byte, payload []byte, ext ...[]byte) []byte {
	t := make([]byte, 20+len(payload))
	binary.BigEndian.PutUint16(t[0:], sport)
	binary.BigEndian.PutUint16(t[2:], dport)
	binary.BigEndian.PutUint32(t[4:], seq)
	binary.BigEndian.PutUint32(t[8:], ack)
	t[12], t[13] = 5<<4, flags
	copy(t[20:], payload)
	return ip6Packet(src, dst, tcpProto, t, ext...)
}

// destOpts is an empty destination options header (8 bytes: PadN).
var destOpts = []byte{0, 0, 1, 4, 0, 0, 0, 0}

// TestCheckerIPv6: the check reads IPv6 flows as it reads IPv4 ones: a
// fronting SNI over v6 is refused (keyed by the v6 5-tuple, the decision
// names the v6 destination), the allowed name split in two segments is
// held until whole and then allowed, and passes once the server
// acknowledges it.
func TestCheckerIPv6(t *testing.T) {
	c := NewChecker(Config{Judge: judgeOnly("pkgs.example.org")})
	now := time.Unix(1000, 0)
	good, evil := clientHello(t, "pkgs.example.org"), clientHello(t, "evil.example")

	if vs, _ := c.Packet(now, 1, tcp6Packet(guest6, cdn6, 40001, 443, isn, 0, tcpSYN, nil), true); len(vs) != 1 || vs[0].Action != Accept {
		t.Fatalf("v6 SYN: %+v, want accept", vs)
	}
	vs, d := c.Packet(now, 2, tcp6Packet(guest6, cdn6, 40001, 443, isn+1, 0, tcpACK, evil), true)
	if d == nil || d.Result != ResultRefused || d.Name != "evil.example" || d.Dst != cdn6 || d.Guest != guest6 || d.DstPort != 443 || len(vs) != 1 || vs[0].Action != Refuse {
		t.Fatalf("fronting over v6: %+v %+v, want refused evil.example at %s", vs, d, cdn6)
	}

	c.Packet(now, 3, tcp6Packet(guest6, cdn6, 40002, 443, isn, 0, tcpSYN, nil), true)
	cut := len(good) / 2
	if vs, d := c.Packet(now, 4, tcp6Packet(guest6, cdn6, 40002, 443, isn+1+uint32(cut), 0, tcpACK, good[cut:]), true); len(vs) != 0 || d != nil {
		t.Fatalf("second half first: %+v %+v, want held", vs, d)
	}
	vs, d = c.Packet(now, 5, tcp6Packet(guest6, cdn6, 40002, 443, isn+1, 0, tcpACK, good[:cut]), true)
	if d == nil || d.Result != ResultAllowed || len(vs) != 2 {
		t.Fatalf("whole hello over v6: %+v %+v, want allowed, both held packets released", vs, d)
	}
	ack := tcp6Packet(cdn6, guest6, 443, 40002, 7, isn+1+uint32(len(good)), tcpACK, nil)
	if vs, _ := c.Packet(now, 6, ack, false); len(vs) != 1 || vs[0].Action != Pass {
		t.Fatalf("the v6 server's ACK of the hello: %+v, want pass", vs)
	}
	// The same ports over IPv4 are another flow.
	if vs, d := c.Packet(now, 7, tcpPacket(guest, cdn, 443, isn+1, tcpACK, good), true); len(vs) != 1 || vs[0].Action != Refuse || d == nil || d.Cause != CauseIncomplete {
		t.Fatalf("v4 segment with no v4 SYN: %+v %+v, want refused incomplete", vs, d)
	}
}

// TestCheckerIPv6ExtensionHeaders: a guest's v6 packet with extension
// headers before TCP is refused, never read past: at the SYN (nothing to
// reset), holding the first bytes (the held ones dropped), and sent again
// before the server acknowledged the checked bytes; a server's packet
// with them is read (its ACK confirms). Without them, the control passes.
func TestCheckerIPv6ExtensionHeaders(t *testing.T) {
	now := time.Unix(1000, 0)
	good := clientHello(t, "pkgs.example.org")

	c := NewChecker(Config{Judge: judgeOnly("pkgs.example.org")})
	vs, d := c.Packet(now, 1, tcp6Packet(guest6, cdn6, 40001, 443, isn, 0, tcpSYN, nil, destOpts), true)
	if len(vs) != 1 || vs[0].Action != Refuse || d == nil || d.Cause != CauseUnreadable || !d.NoReset {
		t.Fatalf("SYN with a destination options header: %+v %+v, want refused unreadable, no reset", vs, d)
	}

	c.Packet(now, 2, tcp6Packet(guest6, cdn6, 40002, 443, isn, 0, tcpSYN, nil), true)
	c.Packet(now, 3, tcp6Packet(guest6, cdn6, 40002, 443, isn+1, 0, tcpACK, good[:100]), true)
	vs, d = c.Packet(now, 4, tcp6Packet(guest6, cdn6, 40002, 443, isn+101, 0, tcpACK, good[100:], destOpts, destOpts), true)
	if d == nil || d.Result != ResultRefused || d.Cause != CauseUnreadable || d.NoReset || d.Seq != isn+1 || len(vs) != 2 || vs[0].Action != Refuse || vs[1].Action != Drop {
		t.Fatalf("hello's second segment with extension headers: %+v %+v, want refused, the held segment answering", vs, d)
	}

	c.Packet(now, 5, tcp6Packet(guest6, cdn6, 40003, 443, isn, 0, tcpSYN, nil), true)
	if _, d := c.Packet(now, 6, tcp6Packet(guest6, cdn6, 40003, 443, isn+1, 0, tcpACK, good), true); d == nil || d.Result != ResultAllowed {
		t.Fatalf("control: the allowed hello without extension headers: %+v", d)
	}
	vs, d = c.Packet(now, 7, tcp6Packet(guest6, cdn6, 40003, 443, isn+1, 0, tcpACK, good, destOpts), true)
	if d == nil || d.Result != ResultRefused || d.Was != ResultAllowed || len(vs) != 1 || vs[0].Action != Refuse {
		t.Fatalf("the hello sent again with extension headers before the server's ACK: %+v %+v, want refused", vs, d)
	}

	c.Packet(now, 8, tcp6Packet(guest6, cdn6, 40004, 443, isn, 0, tcpSYN, nil), true)
	c.Packet(now, 9, tcp6Packet(guest6, cdn6, 40004, 443, isn+1, 0, tcpACK, good), true)
	ack := tcp6Packet(cdn6, guest6, 443, 40004, 7, isn+1+uint32(len(good)), tcpACK, nil, destOpts)
	if vs, _ := c.Packet(now, 10, ack, false); len(vs) != 1 || vs[0].Action != Pass {
		t.Fatalf("the server's ACK with a destination options header: %+v, want pass", vs)
	}

	// Malformed chains are dropped: a header running past the packet, a
	// fragment header, a jumbogram's zero length.
	long := append([]byte(nil), destOpts...)
	long[1] = 200
	frag := tcp6Packet(guest6, cdn6, 40005, 443, isn, 0, tcpSYN, nil, destOpts)
	frag[6] = ip6Fragment
	jumbo := tcp6Packet(guest6, cdn6, 40005, 443, isn, 0, tcpSYN, nil)
	jumbo[4], jumbo[5] = 0, 0
	for i, p := range [][]byte{tcp6Packet(guest6, cdn6, 40005, 443, isn, 0, tcpSYN, nil, long), frag, jumbo} {
		if vs, d := c.Packet(now, uint32(20+i), p, true); len(vs) != 1 || vs[0].Action != Drop || d != nil {
			t.Errorf("malformed v6 packet %d: %+v %+v, want dropped", i, vs, d)
		}
	}
}

// TestCheckerQUICIPv6: a QUIC flow over v6 is read like one over v4 (the
// fronting name refused, the allowed one passed), and a datagram with
// extension headers refuses its flow.
func TestCheckerQUICIPv6(t *testing.T) {
	c := NewChecker(Config{Judge: func(_ netip.Addr, n string, port uint16, udp bool) (string, bool) {
		return n + ":443/udp", n == "pkgs.example.org" && port == 443 && udp
	}})
	now := time.Unix(1000, 0)
	udp6 := func(sport uint16, payload []byte, ext ...[]byte) []byte {
		u := make([]byte, 8+len(payload))
		binary.BigEndian.PutUint16(u[0:], sport)
		binary.BigEndian.PutUint16(u[2:], 443)
		binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
		copy(u[8:], payload)
		return ip6Packet(guest6, cdn6, udpProto, u, ext...)
	}
	for _, tc := range []struct {
		sni    string
		sport  uint16
		ext    [][]byte
		result string
	}{
		{"pkgs.example.org", 50001, nil, ResultAllowed},
		{"evil.example", 50002, nil, ResultRefused},
		{"pkgs.example.org", 50003, [][]byte{destOpts}, ResultRefused},
	} {
		var d *Decision
		for i, dg := range initials(t, tc.sni) {
			_, d = c.Packet(now, uint32(tc.sport)*10+uint32(i), udp6(tc.sport, dg, tc.ext...), true)
			if d != nil {
				break
			}
		}
		if d == nil || d.Result != tc.result || !d.UDP || d.Dst != cdn6 {
			t.Errorf("QUIC over v6 for %s (%d extension headers): %+v, want %s", tc.sni, len(tc.ext), d, tc.result)
		}
	}
}
