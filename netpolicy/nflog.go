package netpolicy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// The drop log: a small NFNETLINK_LOG client (the kernel's nfnetlink_log,
// which nftables' "log group" statements feed) over mdlayher/netlink, in the
// firewall's netns. The constants are the kernel's
// (include/uapi/linux/netfilter/nfnetlink_log.h).
const (
	nfnlSubsysULOG  = 4
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1

	nfulaCfgCmd  = 1
	nfulaCfgMode = 2

	nfulnlCfgCmdBind = 1
	nfulnlCopyPacket = 2

	nfulaPacketHdr    = 1
	nfulaMark         = 2
	nfulaIfindexIndev = 4
	nfulaPayload      = 9
	nfulaPrefix       = 10
)

// DroppedFlow is one line of the drop log: the first packet of a flow the
// table dropped, and why.
type DroppedFlow struct {
	Reason  string // a Reason constant
	Proto   string // "tcp", "udp", "icmp", or the protocol number
	Src     netip.Addr
	Dst     netip.Addr
	SrcPort uint16 // TCP and UDP only
	DstPort uint16 // TCP and UDP only
	// Guest is the session's address: Src for the session's own packets,
	// Dst for inbound ones, and for spoofed ones the guest of the interface
	// they came in on (the table marks them with it).
	Guest netip.Addr
	// InIface is the host-side interface a spoofed packet came in on ("" if
	// it is gone by the time the line is read).
	InIface string
	inIndex uint32
}

// DropLog reads the table's drop log. Read is for one goroutine; Close may
// be called from another, and ends a blocked Read.
type DropLog struct {
	prefix string
	group  uint16
	conn   *netlink.Conn
	nsFd   int

	mu       sync.Mutex // protects rt
	rt       *netlink.Conn
	overruns atomic.Uint64 // receive buffer overruns (ENOBUFS): lines lost
}

// OpenDropLog binds the firewall's NFLOG group in its netns. A group takes
// one listener per netns: a second DropLog on the same group fails (EBUSY).
func (f *Firewall) OpenDropLog() (*DropLog, error) {
	group := f.cfg.LogGroup
	if f.nsFd < 0 {
		return nil, fmt.Errorf("open drop log: %w", ErrClosed)
	}
	// A handle of its own: the log may outlive the Firewall's Close, and
	// ifaceName dials with it later.
	nsFd, err := unix.FcntlInt(uintptr(f.nsFd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open drop log: duplicate netns handle: %w", err)
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: nsFd})
	if err != nil {
		unix.Close(nsFd)
		return nil, fmt.Errorf("open drop log: dial nfnetlink: %w", err)
	}
	l := &DropLog{prefix: f.cfg.Prefix, group: group, conn: conn, nsFd: nsFd}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, logSnaplen)
	mode[4] = nfulnlCopyPacket
	for _, a := range []netlink.Attribute{
		{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}},
		{Type: nfulaCfgMode, Data: mode},
	} {
		if err := l.config(a); err != nil {
			conn.Close()
			unix.Close(nsFd)
			return nil, fmt.Errorf("open drop log: nflog group %d: %w", group, err)
		}
	}
	// Bursts of drop lines (every session's budget at once) fit in the
	// buffer; a lost line is counted (Overruns), the drop itself is not.
	_ = conn.SetReadBuffer(1 << 20)
	return l, nil
}

func (l *DropLog) config(a netlink.Attribute) error {
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

// Group returns the NFLOG group the log is bound to.
func (l *DropLog) Group() uint16 { return l.group }

// Overruns counts the times the kernel could not queue lines for Read (a
// full receive buffer): those lines are lost.
func (l *DropLog) Overruns() uint64 { return l.overruns.Load() }

// Read blocks until the kernel delivers drop lines and returns them. Lines
// of other prefixes (another table on the group) are skipped. It returns an
// error once the log is closed.
func (l *DropLog) Read() ([]DroppedFlow, error) {
	for {
		msgs, err := l.conn.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				l.overruns.Add(1)
				continue
			}
			return nil, fmt.Errorf("read drop log: %w", err)
		}
		var out []DroppedFlow
		for _, m := range msgs {
			fl, ok := parseDropLine(l.prefix, m)
			if !ok {
				continue
			}
			if fl.Reason == ReasonSpoofed && fl.inIndex != 0 {
				fl.InIface = l.ifaceName(fl.inIndex)
			}
			out = append(out, fl)
		}
		if len(out) > 0 {
			return out, nil
		}
	}
}

// Close unbinds the group (closing the socket does) and ends Read.
func (l *DropLog) Close() error {
	l.mu.Lock()
	if l.rt != nil {
		l.rt.Close()
		l.rt = nil
	}
	if l.nsFd >= 0 {
		unix.Close(l.nsFd)
		l.nsFd = -1
	}
	l.mu.Unlock()
	return l.conn.Close()
}

// ifaceName resolves an interface index of the firewall's netns over
// rtnetlink ("" if it is gone). Only spoofed lines need it, and they are
// rate-limited like the others.
func (l *DropLog) ifaceName(index uint32) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.rt == nil {
		if l.nsFd < 0 {
			return ""
		}
		c, err := netlink.Dial(unix.NETLINK_ROUTE, &netlink.Config{NetNS: l.nsFd})
		if err != nil {
			return ""
		}
		l.rt = c
	}
	ifi := make([]byte, unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint32(ifi[4:8], index)
	msgs, err := l.rt.Execute(netlink.Message{Header: netlink.Header{Type: unix.RTM_GETLINK, Flags: netlink.Request}, Data: ifi})
	if err != nil || len(msgs) == 0 || len(msgs[0].Data) < unix.SizeofIfInfomsg {
		return ""
	}
	ad, err := netlink.NewAttributeDecoder(msgs[0].Data[unix.SizeofIfInfomsg:])
	if err != nil {
		return ""
	}
	for ad.Next() {
		if ad.Type() == unix.IFLA_IFNAME {
			return ad.String()
		}
	}
	return ""
}

// parseDropLine decodes one NFULNL_MSG_PACKET message whose prefix is
// "<prefix>:<reason>" with a known reason and whose payload is an IPv4
// packet.
func parseDropLine(prefix string, m netlink.Message) (DroppedFlow, bool) {
	var fl DroppedFlow
	if m.Header.Type != netlink.HeaderType(nfnlSubsysULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
		return fl, false
	}
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return fl, false
	}
	ad.ByteOrder = binary.BigEndian
	var payload []byte
	var mark netip.Addr
	for ad.Next() {
		switch ad.Type() {
		case nfulaPrefix:
			p, ok := strings.CutPrefix(strings.TrimRight(string(ad.Bytes()), "\x00"), prefix+":")
			if !ok || !knownReason(p) {
				return fl, false
			}
			fl.Reason = p
		case nfulaIfindexIndev:
			fl.inIndex = ad.Uint32()
		case nfulaMark:
			// The mark is the guest's address bytes as a host-order
			// integer (see loadGuest); NFLOG sends it big endian.
			var g [4]byte
			binary.NativeEndian.PutUint32(g[:], ad.Uint32())
			mark = netip.AddrFrom4(g)
		case nfulaPayload:
			payload = ad.Bytes()
		}
	}
	if ad.Err() != nil || fl.Reason == "" || !parseIPv4(payload, &fl) {
		return fl, false
	}
	switch fl.Reason {
	case ReasonInbound:
		fl.Guest = fl.Dst
	case ReasonSpoofed:
		if mark.IsValid() && mark != netip.IPv4Unspecified() {
			fl.Guest = mark
		}
	default:
		fl.Guest = fl.Src
	}
	return fl, true
}

func knownReason(r string) bool {
	if r == ReasonRateLimit {
		return true
	}
	_, ok := codeOfReason(r)
	return ok
}

func codeOfReason(r string) (uint32, bool) {
	for _, d := range dropCodes {
		if d.reason == r && r != "" {
			return d.code, true
		}
	}
	return 0, false
}

// parseIPv4 fills the addresses, protocol and ports from an IPv4 packet's
// first bytes (the log copies logSnaplen of them).
func parseIPv4(p []byte, fl *DroppedFlow) bool {
	if len(p) < 20 || p[0]>>4 != 4 {
		return false
	}
	ihl := int(p[0]&0x0f) * 4
	if ihl < 20 {
		return false
	}
	fl.Src = netip.AddrFrom4([4]byte(p[12:16]))
	fl.Dst = netip.AddrFrom4([4]byte(p[16:20]))
	proto := p[9]
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP:
		fl.Proto = "tcp"
		if proto == unix.IPPROTO_UDP {
			fl.Proto = "udp"
		}
		// A first fragment carries the ports; later ones (offset != 0) do not.
		if frag := binary.BigEndian.Uint16(p[6:8]) & 0x1fff; frag == 0 && len(p) >= ihl+4 {
			fl.SrcPort = binary.BigEndian.Uint16(p[ihl:])
			fl.DstPort = binary.BigEndian.Uint16(p[ihl+2:])
		}
	case unix.IPPROTO_ICMP:
		fl.Proto = "icmp"
	default:
		fl.Proto = strconv.Itoa(int(proto))
	}
	return true
}
