package nfnetlink

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/mdlayher/netlink"
)

// encodeQueued is an NFQNL_MSG_PACKET message as the kernel sends it: the
// nfgenmsg, the packet header (id, hw protocol, hook), a mark, the payload.
func encodeQueued(t testing.TB, id, mark uint32, payload []byte) netlink.Message {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	hdr := binary.BigEndian.AppendUint32(nil, id)
	hdr = append(hdr, 0x08, 0x00, 2) // ETH_P_IP, NF_INET_FORWARD
	ae.Bytes(NfqaPacketHdr, hdr)
	if mark != 0 {
		ae.Uint32(NfqaMark, mark)
	}
	ae.Bytes(NfqaPayload, payload)
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return netlink.Message{Header: netlink.Header{Type: NfqnlMsgPacketType}, Data: append([]byte{2, 0, 0, 7}, b...)}
}

// FuzzParseQueued: a message the kernel could send reads back to its id,
// mark and payload; no input panics; a message without a packet header is
// refused (a verdict needs the id).
func FuzzParseQueued(f *testing.F) {
	f.Add(uint32(1), uint32(0), []byte{0x45, 0, 0, 20}, []byte(nil))
	f.Add(uint32(0xffffffff), uint32(0x6e630002), []byte(nil), []byte{0, 0, 0, 0, 8, 0, 1, 0})
	f.Fuzz(func(t *testing.T, id, mark uint32, payload, raw []byte) {
		ParseQueued(netlink.Message{Header: netlink.Header{Type: NfqnlMsgPacketType}, Data: raw}) // must not panic
		p, ok := ParseQueued(encodeQueued(t, id, mark, payload))
		if !ok || p.ID != id || p.Mark != mark || !bytes.Equal(p.Payload, payload) {
			t.Fatalf("ParseQueued = %+v %v, want id %d mark %#x payload %x", p, ok, id, mark, payload)
		}
		noHdr := encodeQueued(t, id, mark, payload)
		noHdr.Data = noHdr.Data[:4]
		if _, ok := ParseQueued(noHdr); ok {
			t.Fatal("a message without a packet header parsed")
		}
	})
}

// The verdicts of a batch are one datagram of the kernel's messages, in
// order: each a netlink header (type NFQNL_MSG_VERDICT, a request with
// no acknowledgement asked, its length), the nfgenmsg with the queue as
// resource id, NFQA_VERDICT_HDR {verdict, id}, and NFQA_MARK only when
// set; SplitMessages reads it back.
func TestEncodeVerdicts(t *testing.T) {
	b := EncodeVerdicts(4242, []Verdict{{ID: 7, Verdict: VerdictRepeat, Mark: 0x6e630003}, {ID: 8, Verdict: VerdictDrop}})
	if len(b) != 40+32 {
		t.Fatalf("two verdicts are %d bytes, want 72 (40 with a mark, 32 without)", len(b))
	}
	msgs := SplitMessages(b)
	if len(msgs) != 2 {
		t.Fatalf("SplitMessages read %d messages, want 2", len(msgs))
	}
	want := [][]byte{
		{0, 0, 0x10, 0x92, 12, 0, 2, 0, 0, 0, 0, 4, 0, 0, 0, 7, 8, 0, 3, 0, 0x6e, 0x63, 0, 3},
		{0, 0, 0x10, 0x92, 12, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 8},
	}
	for i, m := range msgs {
		if m.Header.Type != netlink.HeaderType(3<<8|1) || m.Header.Flags != netlink.Request ||
			int(m.Header.Length) != 16+len(want[i]) || !bytes.Equal(m.Data, want[i]) {
			t.Errorf("verdict %d = %+v % x, want type 0x301, flags request, data % x", i, m.Header, m.Data, want[i])
		}
	}
	// The header's fields are the host's byte order, as the kernel reads them.
	if l := binary.NativeEndian.Uint32(b[0:4]); l != 40 {
		t.Errorf("first message's length %d, want 40", l)
	}
	if len(EncodeVerdicts(1, nil)) != 0 {
		t.Error("no verdicts encode to bytes")
	}
}

// FuzzSplitMessages: no datagram panics SplitMessages or yields a message
// past its end; messages the kernel would send (queued packets, one
// datagram) read back in order.
func FuzzSplitMessages(f *testing.F) {
	f.Add([]byte{0x45, 0, 0, 20}, []byte{0x60}, []byte{20, 0, 0, 0, 1, 3, 0, 0})
	f.Fuzz(func(t *testing.T, p1, p2, raw []byte) {
		for _, m := range SplitMessages(raw) {
			if int(m.Header.Length) != 16+len(m.Data) || int(m.Header.Length) > len(raw) {
				t.Fatalf("message %+v of %d bytes from a %d-byte datagram", m.Header, len(m.Data), len(raw))
			}
		}
		var dgram []byte
		for i, p := range [][]byte{p1, p2} {
			m := encodeQueued(t, uint32(i+1), 0, p)
			m.Header.Length = uint32(16 + len(m.Data))
			b, err := m.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			dgram = append(dgram, b...)
		}
		msgs := SplitMessages(dgram)
		if len(msgs) != 2 {
			t.Fatalf("SplitMessages read %d messages, want 2", len(msgs))
		}
		for i, want := range [][]byte{p1, p2} {
			q, ok := ParseQueued(msgs[i])
			if !ok || q.ID != uint32(i+1) || !bytes.Equal(q.Payload, want) {
				t.Fatalf("message %d = %+v %v, want id %d payload %x", i, q, ok, i+1, want)
			}
		}
	})
}
