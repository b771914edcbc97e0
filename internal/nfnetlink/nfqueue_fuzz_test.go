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

// The verdict message is the kernel's layout: nfgenmsg with the queue as
// resource id, NFQA_VERDICT_HDR {verdict, id}, NFQA_MARK when set.
func TestEncodeVerdict(t *testing.T) {
	m := EncodeVerdict(4242, 7, VerdictRepeat, 0x6e630003)
	want := []byte{0, 0, 0x10, 0x92, 12, 0, 2, 0, 0, 0, 0, 4, 0, 0, 0, 7, 8, 0, 3, 0, 0x6e, 0x63, 0, 3}
	if m.Header.Type != netlink.HeaderType(3<<8|1) || !bytes.Equal(m.Data, want) {
		t.Errorf("verdict = %v % x, want type 0x301 % x", m.Header.Type, m.Data, want)
	}
	if m := EncodeVerdict(1, 2, VerdictAccept, 0); len(m.Data) != 4+12 {
		t.Errorf("accept without mark: % x, want no NFQA_MARK", m.Data)
	}
}
