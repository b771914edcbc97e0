package nfnetlink

import (
	"encoding/binary"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// encodeFlowEvent is a DESTROY event's attributes as the kernel sends
// them: the original tuple, the id, the mark and both directions'
// 64-bit counters.
func encodeFlowEvent(t testing.TB, tuple []byte, id, mark uint32, orig, reply Counters) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(nestedAttribute|ctaTupleOrig, tuple)
	ae.Bytes(ctaID, binary.BigEndian.AppendUint32(nil, id))
	ae.Bytes(ctaMark, binary.BigEndian.AppendUint32(nil, mark))
	for typ, c := range map[uint16]Counters{ctaCountersOrig: orig, ctaCountersReply: reply} {
		ae.Nested(typ, func(ae *netlink.AttributeEncoder) error {
			ae.Bytes(ctaCountersPackets, binary.BigEndian.AppendUint64(nil, c.Packets))
			ae.Bytes(ctaCountersBytes, binary.BigEndian.AppendUint64(nil, c.Bytes))
			return nil
		})
	}
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzParseFlowEvent: an event the kernel could send reads back its tuple,
// id, mark and counters exactly, and no input panics.
func FuzzParseFlowEvent(f *testing.F) {
	f.Add(uint32(0x0a140002), uint16(40000), uint32(7), uint32(1), uint64(5), uint64(300), uint64(4), uint64(9000), []byte(nil))
	f.Add(uint32(0), uint16(0), uint32(0), uint32(0), uint64(0), uint64(0), uint64(0), uint64(0), []byte{8, 0, 9, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, src uint32, sport uint16, id, mark uint32, op, ob, rp, rb uint64, raw []byte) {
		_, _ = parseFlowEvent(FlowDestroy, raw) // must not panic
		_, _, _ = ParseFlowEventMessage(netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(ctMsgDelete)}, Data: raw})
		var s [4]byte
		binary.BigEndian.PutUint32(s[:], src)
		tuple := encodeTuple(t, s, [4]byte{198, 18, 2, 10}, 6, sport, 443)
		orig, reply := Counters{Packets: op, Bytes: ob}, Counters{Packets: rp, Bytes: rb}
		data := append([]byte{unix.AF_INET, NfnetlinkV0, 0, 0}, encodeFlowEvent(t, tuple, id, mark, orig, reply)...)
		ev, ok, err := ParseFlowEventMessage(netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(ctMsgDelete)}, Data: data})
		if err != nil || !ok {
			t.Fatalf("ParseFlowEventMessage = %v, %v: want an event", ok, err)
		}
		if ev.Type != FlowDestroy || ev.ID != id || ev.Mark != mark || !ev.HasCounters || ev.Orig != orig || ev.Reply != reply {
			t.Fatalf("event = %+v, want id %d mark %d counters %+v %+v", ev, id, mark, orig, reply)
		}
		if ev.Flow.Sport != sport || ev.Flow.Dport != 443 || ev.Flow.Src.As4() != s {
			t.Fatalf("event tuple = %+v, want source %v:%d", ev.Flow, s, sport)
		}
	})
}

// FuzzParseCounters: 32-bit and 64-bit counters read back, and no input
// panics.
func FuzzParseCounters(f *testing.F) {
	f.Add(uint32(3), uint32(180), []byte{12, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, p, b uint32, raw []byte) {
		parseCounters(raw)
		parseTimestamp(raw)
		ae := netlink.NewAttributeEncoder()
		ae.Bytes(ctaCounters32Packet, binary.BigEndian.AppendUint32(nil, p))
		ae.Bytes(ctaCounters32Bytes, binary.BigEndian.AppendUint32(nil, b))
		enc, err := ae.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if c := parseCounters(enc); c.Packets != uint64(p) || c.Bytes != uint64(b) {
			t.Fatalf("parseCounters = %+v, want %d packets %d bytes", c, p, b)
		}
	})
}
