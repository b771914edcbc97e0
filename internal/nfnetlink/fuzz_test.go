package nfnetlink

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
)

// encodeTuple encodes an IPv4 tuple as the kernel does (CTA_TUPLE_IP and
// CTA_TUPLE_PROTO, nested; ports in network order).
func encodeTuple(t testing.TB, src, dst [4]byte, proto uint8, sport, dport uint16) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.Nested(ctaTupleIP, func(ae *netlink.AttributeEncoder) error {
		ae.Bytes(ctaIPv4Src, src[:])
		ae.Bytes(ctaIPv4Dst, dst[:])
		return nil
	})
	ae.Nested(ctaTupleProto, func(ae *netlink.AttributeEncoder) error {
		ae.Uint8(ctaProtoNum, proto)
		ae.Bytes(ctaProtoSrcPort, binary.BigEndian.AppendUint16(nil, sport))
		ae.Bytes(ctaProtoDstPort, binary.BigEndian.AppendUint16(nil, dport))
		return nil
	})
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// encodeFlow is a dump message's attributes: the original tuple and a zone.
func encodeFlow(t testing.TB, tuple []byte, zone []byte) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(nestedAttribute|ctaTupleOrig, tuple)
	if zone != nil {
		ae.Bytes(ctaZone, zone)
	}
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzParseTuple: any tuple the kernel could send encodes back to its
// fields, and no input panics.
func FuzzParseTuple(f *testing.F) {
	f.Add(uint32(0x0a140002), uint32(0xc612020a), uint8(6), uint16(57134), uint16(80), []byte(nil))
	f.Add(uint32(0), uint32(0xffffffff), uint8(1), uint16(0), uint16(0), []byte{4, 0, 1, 0, 0})
	f.Fuzz(func(t *testing.T, src, dst uint32, proto uint8, sport, dport uint16, raw []byte) {
		parseTuple(raw) // must not panic
		var s, d [4]byte
		binary.BigEndian.PutUint32(s[:], src)
		binary.BigEndian.PutUint32(d[:], dst)
		gs, gd, gp, gsp, gdp := parseTuple(encodeTuple(t, s, d, proto, sport, dport))
		if gs != netip.AddrFrom4(s) || gd != netip.AddrFrom4(d) || gp != proto || gsp != sport || gdp != dport {
			t.Fatalf("parseTuple = %s %s %d %d %d, want %s %s %d %d %d", gs, gd, gp, gsp, gdp,
				netip.AddrFrom4(s), netip.AddrFrom4(d), proto, sport, dport)
		}
	})
}

// FuzzParseFlow: a dump message's entry keeps its tuple and zone byte for
// byte (DeleteFlow sends them back) and reads the tuple as parseTuple does;
// no input panics.
func FuzzParseFlow(f *testing.F) {
	tuple := encodeTuple(f, [4]byte{10, 20, 0, 2}, [4]byte{198, 18, 2, 10}, 17, 12345, 53)
	f.Add(encodeFlow(f, tuple, nil), false)
	f.Add(encodeFlow(f, tuple, []byte{0, 7}), true)
	f.Add([]byte{8, 0, 1, 0}, false)
	f.Fuzz(func(t *testing.T, b []byte, _ bool) {
		e, err := parseFlow(b)
		if err != nil || e.tuple == nil {
			return
		}
		s, d, p, sp, dp := parseTuple(e.tuple)
		if e.Src != s || e.Dst != d || e.Proto != p || e.Sport != sp || e.Dport != dp {
			t.Fatalf("parseFlow = %+v, its tuple reads %s %s %d %d %d", e, s, d, p, sp, dp)
		}
	})
}

// encodeSetElem is a NEWSETELEM message's attributes with one element
// whose counter is given in one of the two forms the kernel uses
// (NFTA_SET_ELEM_EXPR, or NFTA_SET_ELEM_EXPRESSIONS since Linux 5.12).
func encodeSetElem(t testing.TB, packets, bytes uint64, list bool) []byte {
	counter := func(ae *netlink.AttributeEncoder) error {
		ae.String(nftaExprName, "counter")
		ae.Nested(nftaExprData, func(ae *netlink.AttributeEncoder) error {
			ae.ByteOrder = binary.BigEndian
			ae.Uint64(nftaCounterBytes, bytes)
			ae.Uint64(nftaCounterPackets, packets)
			return nil
		})
		return nil
	}
	ae := netlink.NewAttributeEncoder()
	ae.String(nftaSetElemListTable, "enf")
	ae.String(nftaSetElemListSet, "acct_drop")
	ae.Nested(nftaSetElemListElements, func(ae *netlink.AttributeEncoder) error {
		ae.Nested(nftaListElem, func(ae *netlink.AttributeEncoder) error {
			ae.Nested(nftaSetElemKey, func(ae *netlink.AttributeEncoder) error {
				ae.Bytes(nftaDataValue, []byte{10, 20, 0, 2})
				return nil
			})
			if list {
				ae.Nested(nftaSetElemExpressions, func(ae *netlink.AttributeEncoder) error {
					ae.Nested(nftaListElem, counter)
					return nil
				})
			} else {
				ae.Nested(nftaSetElemExpr, counter)
			}
			return nil
		})
		return nil
	})
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzParseElemCounter: an element's counter reads back in both forms, and
// no input panics.
func FuzzParseElemCounter(f *testing.F) {
	f.Add(uint64(5), uint64(300), false, []byte(nil))
	f.Add(uint64(1<<40), uint64(1<<50), true, []byte{12, 0, 3, 0, 8, 0, 1, 0})
	f.Fuzz(func(t *testing.T, packets, bytes uint64, list bool, raw []byte) {
		parseElemCounter(raw) // must not panic
		ec, found, err := parseElemCounter(encodeSetElem(t, packets, bytes, list))
		if err != nil || !found || ec.Packets != packets || ec.Bytes != bytes {
			t.Fatalf("parseElemCounter = %+v %v %v, want %d packets %d bytes", ec, found, err, packets, bytes)
		}
	})
}

// FuzzParsePacket: an NFLOG packet message reads back its prefix, input
// interface, mark and payload, and no input panics (nor does ParseIPv4 on
// any payload).
func FuzzParsePacket(f *testing.F) {
	f.Add("enf:not-allowed", uint32(4), uint32(0x0200140a), []byte{0x45, 0, 0, 20, 0, 0, 0, 0, 64, 6, 0, 0, 10, 20, 0, 2, 1, 2, 3, 4}, []byte(nil))
	f.Add("", uint32(0), uint32(0), []byte(nil), []byte{2, 0, 0, 0, 8, 0, 10, 0, 'x', 0, 0, 0})
	f.Fuzz(func(t *testing.T, prefix string, index, mark uint32, payload, raw []byte) {
		if p, ok := ParsePacket(netlink.Message{Header: netlink.Header{Type: NfulnlMsgPacketType}, Data: raw}); ok {
			ParseIPv4(p.Payload)
		}
		ParseIPv4(payload)
		if len(prefix) > 60 || len(payload) > 64 {
			return
		}
		for _, c := range []byte(prefix) {
			if c == 0 {
				return // the kernel's prefix is a C string
			}
		}
		ae := netlink.NewAttributeEncoder()
		ae.ByteOrder = binary.BigEndian
		ae.Bytes(NfulaPacketHdr, []byte{0x08, 0x00, 0, 0})
		if mark != 0 {
			ae.Uint32(NfulaMark, mark)
		}
		ae.Bytes(NfulaPrefix, append([]byte(prefix), 0))
		if index != 0 {
			ae.Uint32(NfulaIfindexIndev, index)
		}
		ae.Bytes(NfulaPayload, payload)
		b, err := ae.Encode()
		if err != nil {
			t.Fatal(err)
		}
		p, ok := ParsePacket(netlink.Message{Header: netlink.Header{Type: NfulnlMsgPacketType}, Data: append([]byte{2, 0, 0, 1}, b...)})
		if !ok || p.Prefix != prefix || p.InIndex != index || p.Mark != mark || string(p.Payload) != string(payload) {
			t.Fatalf("ParsePacket = %+v %v, want prefix %q index %d mark %#x payload %x", p, ok, prefix, index, mark, payload)
		}
	})
}
