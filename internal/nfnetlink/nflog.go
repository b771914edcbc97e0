package nfnetlink

// A small NFNETLINK_LOG client (the kernel's nfnetlink_log, which nftables'
// "log group" statements feed): bind one group in a netns, read its packet
// messages. The constants are the kernel's
// (include/uapi/linux/netfilter/nfnetlink_log.h).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

const (
	nfnlSubsysULOG  = 4
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1

	nfulaCfgCmd  = 1
	nfulaCfgMode = 2

	nfulnlCfgCmdBind = 1
	nfulnlCopyPacket = 2
)

// NFLOG packet message type and attributes (NFULNL_MSG_PACKET, NFULA_*),
// for tests that build the messages Read parses.
const (
	NfulnlMsgPacketType = netlink.HeaderType(nfnlSubsysULOG<<8 | nfulnlMsgPacket)

	NfulaPacketHdr    = 1
	NfulaMark         = 2
	NfulaIfindexIndev = 4
	NfulaPayload      = 9
	NfulaPrefix       = 10
)

// Packet is one packet message of an NFLOG group.
type Packet struct {
	Prefix  string // the log statement's prefix, without its NUL
	InIndex uint32 // the input interface's index (0: none)
	Mark    uint32 // the packet's mark, as the host reads it (0: none)
	Payload []byte // the first bytes of the packet (the group's copy range)
}

// NFLOG is a listener bound to one NFLOG group in one netns. Read is for
// one goroutine; Close may be called from another, and ends a blocked Read.
type NFLOG struct {
	group    uint16
	conn     *netlink.Conn
	overruns atomic.Uint64 // receive buffer overruns (ENOBUFS): messages lost
}

// OpenNFLOG binds group in the netns nsFd, copying up to snaplen bytes of
// each packet. A group takes one listener per netns: a second bind of the
// same group fails (EBUSY).
func OpenNFLOG(nsFd int, group uint16, snaplen uint32) (*NFLOG, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsFd})
	if err != nil {
		return nil, fmt.Errorf("dial nfnetlink: %w", err)
	}
	l := &NFLOG{group: group, conn: conn}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, snaplen)
	mode[4] = nfulnlCopyPacket
	for _, a := range []netlink.Attribute{
		{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}},
		{Type: nfulaCfgMode, Data: mode},
	} {
		if err := l.config(a); err != nil {
			conn.Close()
			return nil, fmt.Errorf("nflog group %d: %w", group, err)
		}
	}
	// Bursts of messages fit in the buffer; a lost one is counted
	// (Overruns).
	_ = conn.SetReadBuffer(1 << 20)
	return l, nil
}

func (l *NFLOG) config(a netlink.Attribute) error {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{a})
	if err != nil {
		return err
	}
	hdr := []byte{unix.AF_INET, 0, 0, 0} // nfgenmsg: family, version 0, resource id (the group)
	binary.BigEndian.PutUint16(hdr[2:], l.group)
	_, err = l.conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(hdr, attrs...),
	})
	return err
}

// Group returns the NFLOG group the listener is bound to.
func (l *NFLOG) Group() uint16 { return l.group }

// Overruns counts the times the kernel could not queue messages for Read
// (a full receive buffer): those messages are lost.
func (l *NFLOG) Overruns() uint64 { return l.overruns.Load() }

// Read blocks until the kernel delivers packet messages and returns them
// (messages that do not parse are skipped). It returns an error once the
// listener is closed.
func (l *NFLOG) Read() ([]Packet, error) {
	for {
		msgs, err := l.conn.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				l.overruns.Add(1)
				continue
			}
			return nil, err
		}
		var out []Packet
		for _, m := range msgs {
			if p, ok := ParsePacket(m); ok {
				out = append(out, p)
			}
		}
		if len(out) > 0 {
			return out, nil
		}
	}
}

// Close unbinds the group (closing the socket does) and ends Read.
func (l *NFLOG) Close() error { return l.conn.Close() }

// ParsePacket decodes one NFULNL_MSG_PACKET message: false for another
// message type or one that does not parse.
func ParsePacket(m netlink.Message) (Packet, bool) {
	var p Packet
	if m.Header.Type != NfulnlMsgPacketType || len(m.Data) < 4 {
		return p, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return p, false
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case NfulaPrefix:
			p.Prefix = strings.TrimRight(string(ad.Bytes()), "\x00")
		case NfulaIfindexIndev:
			p.InIndex = ad.Uint32()
		case NfulaMark:
			p.Mark = ad.Uint32()
		case NfulaPayload:
			p.Payload = ad.Bytes()
		}
	}
	if ad.Err() != nil {
		return p, false
	}
	return p, true
}

// IPv4Header is what a packet's first bytes say of its flow.
type IPv4Header struct {
	Src, Dst netip.Addr
	Proto    uint8  // the protocol number
	SrcPort  uint16 // TCP and UDP, first fragment only
	DstPort  uint16 // TCP and UDP, first fragment only
}

// ParseIPv4 reads the addresses, protocol and ports of an IPv4 packet from
// its first bytes: false when they are not an IPv4 header.
func ParseIPv4(p []byte) (IPv4Header, bool) {
	var h IPv4Header
	if len(p) < 20 || p[0]>>4 != 4 {
		return h, false
	}
	ihl := int(p[0]&0x0f) * 4
	if ihl < 20 {
		return h, false
	}
	h.Src = netip.AddrFrom4([4]byte(p[12:16]))
	h.Dst = netip.AddrFrom4([4]byte(p[16:20]))
	h.Proto = p[9]
	if h.Proto == unix.IPPROTO_TCP || h.Proto == unix.IPPROTO_UDP {
		// A first fragment carries the ports; later ones (offset != 0) do not.
		if frag := binary.BigEndian.Uint16(p[6:8]) & 0x1fff; frag == 0 && len(p) >= ihl+4 {
			h.SrcPort = binary.BigEndian.Uint16(p[ihl:])
			h.DstPort = binary.BigEndian.Uint16(p[ihl+2:])
		}
	}
	return h, true
}

// ParseIPv6 reads the addresses, next header and ports of an IPv6 packet
// from its first bytes into an IPv4Header's fields: false when they are not
// an IPv6 header. The ports are read only when the fixed header's next
// header is TCP or UDP (no extension headers walked).
func ParseIPv6(p []byte) (IPv4Header, bool) {
	var h IPv4Header
	if len(p) < 40 || p[0]>>4 != 6 {
		return h, false
	}
	h.Src = netip.AddrFrom16([16]byte(p[8:24]))
	h.Dst = netip.AddrFrom16([16]byte(p[24:40]))
	h.Proto = p[6]
	if (h.Proto == unix.IPPROTO_TCP || h.Proto == unix.IPPROTO_UDP) && len(p) >= 44 {
		h.SrcPort = binary.BigEndian.Uint16(p[40:])
		h.DstPort = binary.BigEndian.Uint16(p[42:])
	}
	return h, true
}
