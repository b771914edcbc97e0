package nfnetlink

// A small NFNETLINK_QUEUE client (the kernel's nfnetlink_queue, which the
// xt NFQUEUE target feeds): bind one queue in a netns, read its packet
// messages, send verdicts. The constants are the kernel's
// (include/uapi/linux/netfilter/nfnetlink_queue.h).

import (
	"encoding/binary"
	"fmt"
	"net"
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

// NFQUEUE is a listener bound to one queue in one netns. Read and Poll
// are for one goroutine; Verdicts may be called from any, concurrently;
// Close ends a blocked Read. While nobody is bound, the kernel drops what
// the rules queue (the rules set no bypass flag).
type NFQUEUE struct {
	num      uint16
	conn     *netlink.Conn
	overruns atomic.Uint64
	closed   atomic.Bool
	buf      []byte // Read's and Poll's receive buffer
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

// readBatch is the most packet messages one Read or Poll returns.
const readBatch = 256

// recvBuf fits the largest message the queue sends: a packet copied up
// to 0xffff bytes with its attributes.
const recvBuf = 0x10000 + 4096

// Read blocks until the kernel delivers packet messages, then returns
// them with every other one already waiting (up to readBatch), read
// without blocking again: one wake-up drains what queued meanwhile.
// Messages that do not parse are skipped. It returns an error once the
// listener is closed.
//
// It waits in poll(2) on the calling thread, not in Go's network poller:
// a caller on a thread of its own (runtime.LockOSThread) is woken by the
// kernel directly, at that thread's scheduling priority, with no other
// thread of the runtime on the way.
func (q *NFQUEUE) Read() ([]Queued, error) {
	for {
		if err := q.wait(); err != nil {
			return nil, err
		}
		out, err := q.recv()
		if err != nil || len(out) > 0 {
			return out, err
		}
	}
}

// pollEvery is how often a waiting Read looks whether the listener was
// closed (Close cannot interrupt a poll(2) in another thread).
const pollEvery = 200 // milliseconds

// wait blocks until a message waits, or the listener is closed.
func (q *NFQUEUE) wait() error {
	rc, err := q.conn.SyscallConn()
	if err != nil {
		return err
	}
	for {
		if q.closed.Load() {
			return net.ErrClosed
		}
		var n int
		var perr error
		if err := rc.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, perr = unix.Poll(fds, pollEvery)
		}); err != nil {
			return err
		}
		switch {
		case perr != nil && perr != unix.EINTR:
			return fmt.Errorf("poll nfqueue %d: %w", q.num, perr)
		case n > 0:
			return nil
		}
	}
}

// Poll returns the packet messages waiting now (up to readBatch; none
// when nothing waits) without blocking.
func (q *NFQUEUE) Poll() ([]Queued, error) {
	if q.closed.Load() {
		return nil, net.ErrClosed
	}
	return q.recv()
}

// recv reads datagrams until none waits or readBatch packets were read,
// never blocking. Each packet's payload is its own copy (the caller may
// keep it while reading on).
func (q *NFQUEUE) recv() ([]Queued, error) {
	rc, err := q.conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	if q.buf == nil {
		q.buf = make([]byte, recvBuf)
	}
	var out []Queued
	for len(out) < readBatch {
		var n, flags int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			n, _, flags, _, rerr = unix.Recvmsg(int(fd), q.buf, nil, unix.MSG_DONTWAIT)
			return true
		})
		switch {
		case err != nil:
			return nil, err
		case rerr == unix.EAGAIN || rerr == unix.EINTR:
			return out, nil
		case rerr == unix.ENOBUFS:
			// The kernel could not deliver some messages: their packets
			// were dropped.
			q.overruns.Add(1)
			continue
		case rerr != nil:
			return nil, rerr
		case flags&unix.MSG_TRUNC != 0:
			continue
		}
		for _, m := range SplitMessages(q.buf[:n]) {
			if p, ok := ParseQueued(m); ok {
				p.Payload = append([]byte(nil), p.Payload...)
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// SplitMessages splits a netlink datagram into its messages (each
// header's length, aligned to 4 bytes); a truncated or malformed tail
// ends it. The messages' Data alias b.
func SplitMessages(b []byte) []netlink.Message {
	var out []netlink.Message
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b[0:4]))
		if l < nlmsgHdrLen || l > len(b) {
			break
		}
		out = append(out, netlink.Message{
			Header: netlink.Header{
				Length:   uint32(l),
				Type:     netlink.HeaderType(binary.NativeEndian.Uint16(b[4:6])),
				Flags:    netlink.HeaderFlags(binary.NativeEndian.Uint16(b[6:8])),
				Sequence: binary.NativeEndian.Uint32(b[8:12]),
				PID:      binary.NativeEndian.Uint32(b[12:16]),
			},
			Data: b[nlmsgHdrLen:l:l],
		})
		l = nlmsgAlign(l)
		if l > len(b) {
			break
		}
		b = b[l:]
	}
	return out
}

const nlmsgHdrLen = 16

func nlmsgAlign(n int) int { return (n + 3) &^ 3 }

// Verdict is one packet's verdict: VerdictAccept, VerdictDrop, or
// VerdictRepeat (with Mark != 0, the packet's mark is set to it first).
type Verdict struct {
	ID, Verdict, Mark uint32
}

// verdictsPerSend bounds one sendmsg (40 bytes a verdict: well inside
// the socket's send buffer).
const verdictsPerSend = 1024

// Verdicts sends vs, as many as fit in one message buffer per sendmsg
// (the kernel reads every netlink message of a datagram in turn): one
// system call for a batch instead of one per packet. A verdict the
// kernel refuses (an unknown id) does not stop the ones after it.
func (q *NFQUEUE) Verdicts(vs []Verdict) error {
	if len(vs) == 0 {
		return nil
	}
	rc, err := q.conn.SyscallConn()
	if err != nil {
		return err
	}
	for len(vs) > 0 {
		k := min(len(vs), verdictsPerSend)
		buf := EncodeVerdicts(q.num, vs[:k])
		vs = vs[k:]
		var serr error
		if err := rc.Write(func(fd uintptr) bool {
			serr = unix.Sendto(int(fd), buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
			return serr != unix.EAGAIN
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("send %d verdicts: %w", k, serr)
		}
	}
	return nil
}

// EncodeVerdicts is one datagram of NFQNL_MSG_VERDICT messages for
// packets of queue num, one message each: the netlink header (no
// acknowledgement asked), the nfgenmsg with the queue as resource id,
// NFQA_VERDICT_HDR {verdict, id}, and NFQA_MARK when set.
func EncodeVerdicts(num uint16, vs []Verdict) []byte {
	buf := make([]byte, 0, len(vs)*verdictMsgLen)
	for i, v := range vs {
		l := verdictMsgLen
		if v.Mark == 0 {
			l -= 8
		}
		buf = binary.NativeEndian.AppendUint32(buf, uint32(l))
		buf = binary.NativeEndian.AppendUint16(buf, nfnlSubsysQueue<<8|nfqnlMsgVerdict)
		buf = binary.NativeEndian.AppendUint16(buf, uint16(netlink.Request))
		buf = binary.NativeEndian.AppendUint32(buf, uint32(i+1)) // sequence
		buf = binary.NativeEndian.AppendUint32(buf, 0)           // port id: the kernel fills it
		buf = append(buf, unix.AF_UNSPEC, 0)
		buf = binary.BigEndian.AppendUint16(buf, num)
		buf = binary.NativeEndian.AppendUint16(buf, 12) // NFQA_VERDICT_HDR
		buf = binary.NativeEndian.AppendUint16(buf, nfqaVerdictHdr)
		buf = binary.BigEndian.AppendUint32(buf, v.Verdict)
		buf = binary.BigEndian.AppendUint32(buf, v.ID)
		if v.Mark != 0 {
			buf = binary.NativeEndian.AppendUint16(buf, 8) // NFQA_MARK
			buf = binary.NativeEndian.AppendUint16(buf, nfqaMarkAttr)
			buf = binary.BigEndian.AppendUint32(buf, v.Mark)
		}
	}
	return buf
}

// verdictMsgLen is a verdict message's length with its mark: the netlink
// header, the nfgenmsg, NFQA_VERDICT_HDR, NFQA_MARK.
const verdictMsgLen = nlmsgHdrLen + 4 + 12 + 8

// Close unbinds the queue (closing the socket does: the kernel drops what
// it still holds for it) and ends Read. A Read waiting in poll(2) sees it
// within pollEvery, and the socket closes then (until it does, what the
// kernel queues is held, not passed).
func (q *NFQUEUE) Close() error {
	q.closed.Store(true)
	return q.conn.Close()
}

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
