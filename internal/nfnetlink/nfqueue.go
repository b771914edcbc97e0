package nfnetlink

// A small NFNETLINK_QUEUE client (the kernel's nfnetlink_queue, which the
// xt NFQUEUE target feeds): bind one queue in a netns, read its packet
// messages, send verdicts. The constants are the kernel's
// (include/uapi/linux/netfilter/nfnetlink_queue.h).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

const (
	nfnlSubsysQueue    = 3
	nfqnlMsgPacket     = 0
	nfqnlMsgVerdict    = 1
	nfqnlMsgConfig     = 2
	nfqaCfgCmd         = 1
	nfqaCfgParams      = 2
	nfqaCfgQueueMaxlen = 3
	nfqnlCfgCmdBind    = 1
	nfqnlCopyPacket    = 2
	nfqaVerdictHdr     = 2
	nfqaMarkAttr       = 3
)

// NFQUEUE packet message type and attributes (NFQNL_MSG_PACKET, NFQA_*),
// for tests that build the messages ParseQueued parses.
const (
	NfqnlMsgPacketType = netlink.HeaderType(nfnlSubsysQueue<<8 | nfqnlMsgPacket)

	NfqaPacketHdr = 1
	NfqaMark      = 3
	NfqaPayload   = 10
)

// Verdicts (the kernel's NF_DROP, NF_ACCEPT, NF_REPEAT).
const (
	VerdictDrop   = 0
	VerdictAccept = 1
	// VerdictRepeat re-enters the hook the packet was queued from: with a
	// mark set, the chain can read the verdict as the packet's mark.
	VerdictRepeat = 4
)

// Queued is one packet of a queue.
type Queued struct {
	ID      uint32 // the kernel's packet id, for the verdict
	Mark    uint32 // the packet's mark (0: none)
	Payload []byte // the packet from its network header
}

// NFQUEUE is a listener bound to one queue in one netns. Read is for one
// goroutine; Verdict may be called from any, concurrently with Read;
// Close ends a blocked Read. While nobody is bound, the kernel drops what
// the rules queue (the rules set no bypass flag).
type NFQUEUE struct {
	num      uint16
	conn     *netlink.Conn
	overruns atomic.Uint64
}

// OpenNFQUEUE binds queue num in the netns nsFd, copying whole packets, and
// lets the kernel hold up to maxLen packets for it (beyond them it drops).
// A queue takes one listener per netns: a second bind fails (EBUSY).
func OpenNFQUEUE(nsFd int, num uint16, maxLen uint32) (*NFQUEUE, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsFd})
	if err != nil {
		return nil, fmt.Errorf("dial nfnetlink: %w", err)
	}
	q := &NFQUEUE{num: num, conn: conn}
	params := make([]byte, 5)
	binary.BigEndian.PutUint32(params, 0xffff)
	params[4] = nfqnlCopyPacket
	maxlen := binary.BigEndian.AppendUint32(nil, maxLen)
	for _, a := range [][]netlink.Attribute{
		{{Type: nfqaCfgCmd, Data: []byte{nfqnlCfgCmdBind, 0, 0, unix.AF_INET}}},
		{{Type: nfqaCfgParams, Data: params}, {Type: nfqaCfgQueueMaxlen, Data: maxlen}},
	} {
		if err := q.config(a); err != nil {
			conn.Close()
			return nil, fmt.Errorf("nfqueue %d: %w", num, err)
		}
	}
	_ = conn.SetReadBuffer(4 << 20)
	// A verdict of a queue nobody reads fails; ENOBUFS on the reader's
	// side loses the message, and the kernel drops that packet.
	return q, nil
}

func (q *NFQUEUE) config(attrs []netlink.Attribute) error {
	b, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	_, err = q.conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysQueue<<8 | nfqnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(q.nfgen(), b...),
	})
	return err
}

// nfgen is the nfgenmsg of the queue's messages: family, version 0, the
// queue number as resource id.
func (q *NFQUEUE) nfgen() []byte {
	h := []byte{unix.AF_UNSPEC, 0, 0, 0}
	binary.BigEndian.PutUint16(h[2:], q.num)
	return h
}

// Num returns the queue's number.
func (q *NFQUEUE) Num() uint16 { return q.num }

// Overruns counts the times the kernel could not deliver messages to Read
// (a full receive buffer): their packets were dropped.
func (q *NFQUEUE) Overruns() uint64 { return q.overruns.Load() }

// Read blocks until the kernel delivers packet messages and returns them
// (messages that do not parse are skipped). It returns an error once the
// listener is closed.
func (q *NFQUEUE) Read() ([]Queued, error) {
	for {
		msgs, err := q.conn.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				q.overruns.Add(1)
				continue
			}
			return nil, err
		}
		var out []Queued
		for _, m := range msgs {
			if p, ok := ParseQueued(m); ok {
				out = append(out, p)
			}
		}
		if len(out) > 0 {
			return out, nil
		}
	}
}

// Verdict decides packet id: VerdictAccept, VerdictDrop, or VerdictRepeat
// (with mark != 0, the packet's mark is set to it first).
func (q *NFQUEUE) Verdict(id uint32, verdict uint32, mark uint32) error {
	_, err := q.conn.Send(EncodeVerdict(q.num, id, verdict, mark))
	return err
}

// EncodeVerdict is the NFQNL_MSG_VERDICT message for a packet of queue num.
func EncodeVerdict(num uint16, id, verdict, mark uint32) netlink.Message {
	hdr := make([]byte, 8)
	binary.BigEndian.PutUint32(hdr, verdict)
	binary.BigEndian.PutUint32(hdr[4:], id)
	attrs := []netlink.Attribute{{Type: nfqaVerdictHdr, Data: hdr}}
	if mark != 0 {
		attrs = append(attrs, netlink.Attribute{Type: nfqaMarkAttr, Data: binary.BigEndian.AppendUint32(nil, mark)})
	}
	b, _ := netlink.MarshalAttributes(attrs) // fixed-size attributes: cannot fail
	q := NFQUEUE{num: num}
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysQueue<<8 | nfqnlMsgVerdict), Flags: netlink.Request},
		Data:   append(q.nfgen(), b...),
	}
}

// Close unbinds the queue (closing the socket does: the kernel drops what
// it still holds for it) and ends Read.
func (q *NFQUEUE) Close() error { return q.conn.Close() }

// ParseQueued decodes one NFQNL_MSG_PACKET message: false for another
// message type or one that does not parse (no packet header).
func ParseQueued(m netlink.Message) (Queued, bool) {
	var p Queued
	if m.Header.Type != NfqnlMsgPacketType || len(m.Data) < 4 {
		return p, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return p, false
	}
	ad.ByteOrder = binary.BigEndian
	hdr := false
	for ad.Next() {
		switch ad.Type() {
		case NfqaPacketHdr:
			b := ad.Bytes()
			if len(b) < 4 {
				return p, false
			}
			p.ID, hdr = binary.BigEndian.Uint32(b), true
		case NfqaMark:
			p.Mark = ad.Uint32()
		case NfqaPayload:
			p.Payload = ad.Bytes()
		}
	}
	if ad.Err() != nil || !hdr {
		return p, false
	}
	return p, true
}
