package nft

import (
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"

	"github.com/enforcerd/enforcerd/internal/nfnetlink"
	"github.com/enforcerd/enforcerd/netpolicy"
)

// recordedLine is one NFULNL_MSG_PACKET message as the kernel (6.18) sent
// it for a TCP SYN from 10.20.0.2 to 198.18.2.10:80 dropped by table t183e
// as not-allowed: nfgenmsg, then the packet header, prefix, indev,
// physindev-less outdev, hardware fields, timestamp and the first 60 bytes
// of the packet.
const recordedLine = "02009502080001000800020016000a0074313833653a6e6f742d616c6c6f776564000000080004000000000408000500000000021000080000060000e2ca91880521000006000f000001000006001100000e0000120010001eb3b27536ede2ca918805210800000014000300000000006b0ed18b00000000000353c9400009004500003c58a040003f0610ea0a140002c612020adf2e0050c4c08b0a00000000a002faf0d2600000020405b40402080a7ba8a8c0000000000103030a"

func packetMsg(data []byte) netlink.Message {
	return netlink.Message{Header: netlink.Header{Type: nfnetlink.NfulnlMsgPacketType}, Data: data}
}

func TestParseDropLineRecorded(t *testing.T) {
	data, err := hex.DecodeString(recordedLine)
	if err != nil {
		t.Fatal(err)
	}
	fl, ok := parseDropLine("t183e", packetMsg(data))
	want := DroppedFlow{Reason: netpolicy.ReasonNotAllowed, Proto: "tcp",
		Src: netip.MustParseAddr("10.20.0.2"), Dst: netip.MustParseAddr("198.18.2.10"),
		SrcPort: 57134, DstPort: 80, Guest: netip.MustParseAddr("10.20.0.2"), inIndex: 4}
	if !ok || fl != want {
		t.Errorf("parse = %+v %v, want %+v", fl, ok, want)
	}
	// Another table's prefix on the same group, another message type, a
	// truncated message: not ours.
	if _, ok := parseDropLine("t183", packetMsg(data)); ok {
		t.Errorf("a line of prefix t183e parsed for prefix t183")
	}
	m := packetMsg(data)
	m.Header.Type++
	if _, ok := parseDropLine("t183e", m); ok {
		t.Errorf("a config message parsed as a line")
	}
	for _, n := range []int{0, 3, 40} {
		if _, ok := parseDropLine("t183e", packetMsg(data[:n])); ok {
			t.Errorf("%d bytes parsed as a line", n)
		}
	}
}

// line builds a message with the attributes the parser reads.
func line(t *testing.T, prefix string, mark uint32, payload []byte) netlink.Message {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.Bytes(nfnetlink.NfulaPacketHdr, []byte{0x08, 0x00, 0, 0})
	if mark != 0 {
		ae.Uint32(nfnetlink.NfulaMark, mark)
	}
	ae.Bytes(nfnetlink.NfulaPrefix, append([]byte(prefix), 0))
	ae.Uint32(nfnetlink.NfulaIfindexIndev, 7)
	ae.Bytes(nfnetlink.NfulaPayload, payload)
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return packetMsg(append([]byte{2, 0, 0x3, 0xe8}, b...))
}

func ipv4(proto byte, src, dst string, ihl int, l4 []byte) []byte {
	p := make([]byte, ihl)
	p[0] = 0x40 | byte(ihl/4)
	p[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	return append(p, l4...)
}

func ipv6(next byte, src, dst string, l4 []byte) []byte {
	p := make([]byte, 40)
	p[0], p[6] = 0x60, next
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(p[8:], s[:])
	copy(p[24:], d[:])
	return append(p, l4...)
}

func TestParseDropLine(t *testing.T) {
	udp := []byte{0x30, 0x39, 0x00, 0x35, 0, 8, 0, 0}
	guest := netip.MustParseAddr("10.20.0.6")
	g := guest.As4()
	cases := []struct {
		name string
		msg  netlink.Message
		want DroppedFlow
		ok   bool
	}{
		{"resolver", line(t, "enf:resolver", 0, ipv4(17, "10.20.0.6", "198.18.0.53", 20, udp)),
			DroppedFlow{Reason: netpolicy.ReasonResolver, Proto: "udp", Src: guest, Dst: netip.MustParseAddr("198.18.0.53"), SrcPort: 12345, DstPort: 53, Guest: guest}, true},
		{"ip options", line(t, "enf:port", 0, ipv4(6, "10.20.0.6", "1.2.3.4", 24, udp[:4])),
			DroppedFlow{Reason: netpolicy.ReasonPort, Proto: "tcp", Src: guest, Dst: netip.MustParseAddr("1.2.3.4"), SrcPort: 12345, DstPort: 53, Guest: guest}, true},
		{"icmp", line(t, "enf:special-purpose", 0, ipv4(1, "10.20.0.6", "169.254.169.254", 20, []byte{8, 0, 0, 0})),
			DroppedFlow{Reason: netpolicy.ReasonSpecialPurpose, Proto: "icmp", Src: guest, Dst: netip.MustParseAddr("169.254.169.254"), Guest: guest}, true},
		{"other protocol", line(t, "enf:not-allowed", 0, ipv4(47, "10.20.0.6", "1.2.3.4", 20, nil)),
			DroppedFlow{Reason: netpolicy.ReasonNotAllowed, Proto: "47", Src: guest, Dst: netip.MustParseAddr("1.2.3.4"), Guest: guest}, true},
		{"inbound: the guest is the destination", line(t, "enf:inbound", 0, ipv4(6, "198.18.1.1", "10.20.0.6", 20, udp[:4])),
			DroppedFlow{Reason: netpolicy.ReasonInbound, Proto: "tcp", Src: netip.MustParseAddr("198.18.1.1"), Dst: guest, SrcPort: 12345, DstPort: 53, Guest: guest}, true},
		{"spoofed: the guest is the mark", line(t, "enf:spoofed", binary.NativeEndian.Uint32(g[:]), ipv4(17, "10.20.0.2", "1.2.3.4", 20, udp)),
			DroppedFlow{Reason: netpolicy.ReasonSpoofed, Proto: "udp", Src: netip.MustParseAddr("10.20.0.2"), Dst: netip.MustParseAddr("1.2.3.4"), SrcPort: 12345, DstPort: 53, Guest: guest}, true},
		{"rate-limit", line(t, "enf:rate-limit", 0, ipv4(17, "10.20.0.6", "1.2.3.4", 20, udp)),
			DroppedFlow{Reason: netpolicy.ReasonRateLimit, Proto: "udp", Src: guest, Dst: netip.MustParseAddr("1.2.3.4"), SrcPort: 12345, DstPort: 53, Guest: guest}, true},
		{"unknown reason", line(t, "enf:whatever", 0, ipv4(17, "10.20.0.6", "1.2.3.4", 20, udp)), DroppedFlow{}, false},
		{"IPv6 without the mark", line(t, "enf:port", 0, append([]byte{0x60}, make([]byte, 39)...)), DroppedFlow{}, false},
		{"IPv6: the guest is the mark", line(t, "enf:budget", binary.NativeEndian.Uint32(g[:]), ipv6(6, "fd00:20::6", "2001:2::10", udp[:4])),
			DroppedFlow{Reason: netpolicy.ReasonBudget, Proto: "tcp", Src: netip.MustParseAddr("fd00:20::6"), Dst: netip.MustParseAddr("2001:2::10"), SrcPort: 12345, DstPort: 53, Guest: guest}, true},
		{"IPv6 ICMPv6", line(t, "enf:special-purpose", binary.NativeEndian.Uint32(g[:]), ipv6(58, "fd00:20::6", "fc00::1", []byte{128, 0, 0, 0})),
			DroppedFlow{Reason: netpolicy.ReasonSpecialPurpose, Proto: "icmpv6", Src: netip.MustParseAddr("fd00:20::6"), Dst: netip.MustParseAddr("fc00::1"), Guest: guest}, true},
		{"no payload", line(t, "enf:port", 0, nil), DroppedFlow{}, false},
	}
	for _, c := range cases {
		fl, ok := parseDropLine("enf", c.msg)
		fl.inIndex = 0
		if ok != c.ok || (ok && fl != c.want) {
			t.Errorf("%s: parse = %+v %v, want %+v %v", c.name, fl, ok, c.want, c.ok)
		}
	}
}

func TestLogPrefixFits(t *testing.T) {
	for _, d := range dropCodes {
		if p := logPrefix("abcdefgh", d.reason); len(p)+1 > 63 {
			t.Errorf("prefix %q is %d bytes with its NUL, nft's limit is 63", p, len(p)+1)
		}
	}
	if a, b := defaultLogGroup("enf"), defaultLogGroup("enf2"); a == b || a < 1000 || b < 1000 {
		t.Errorf("log groups of enf and enf2: %d, %d", a, b)
	}
}
