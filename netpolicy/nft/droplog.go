package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/internal/nfnetlink"
	"github.com/enforcerd/enforcerd/netpolicy"
)

// The drop log: the table's "log group" statements feed an NFLOG group
// (nfnetlink.NFLOG reads it); each line's prefix is "<prefix>:<reason>"
// (logPrefix) and its mark the guest's address (loadGuest).

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
	log    *nfnetlink.NFLOG
	nsFd   int

	mu sync.Mutex // protects rt
	rt *netlink.Conn
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
	log, err := nfnetlink.OpenNFLOG(nsFd, group, logSnaplen)
	if err != nil {
		unix.Close(nsFd)
		return nil, fmt.Errorf("open drop log: %w", err)
	}
	return &DropLog{prefix: f.cfg.Prefix, log: log, nsFd: nsFd}, nil
}

// Group returns the NFLOG group the log is bound to.
func (l *DropLog) Group() uint16 { return l.log.Group() }

// Overruns counts the times the kernel could not queue lines for Read (a
// full receive buffer): those lines are lost.
func (l *DropLog) Overruns() uint64 { return l.log.Overruns() }

// Read blocks until the kernel delivers drop lines and returns them. Lines
// of other prefixes (another table on the group) are skipped. It returns an
// error once the log is closed.
func (l *DropLog) Read() ([]DroppedFlow, error) {
	for {
		pkts, err := l.log.Read()
		if err != nil {
			return nil, fmt.Errorf("read drop log: %w", err)
		}
		var out []DroppedFlow
		for _, p := range pkts {
			fl, ok := dropLine(l.prefix, p)
			if !ok {
				continue
			}
			if fl.Reason == netpolicy.ReasonSpoofed && fl.inIndex != 0 {
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
	return l.log.Close()
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
	p, ok := nfnetlink.ParsePacket(m)
	if !ok {
		return DroppedFlow{}, false
	}
	return dropLine(prefix, p)
}

// dropLine is the drop line of one NFLOG packet of the table's group: its
// prefix names the reason, its payload the flow, and its mark, for a
// spoofed packet, the guest (see loadGuest).
func dropLine(prefix string, p nfnetlink.Packet) (DroppedFlow, bool) {
	var fl DroppedFlow
	reason, ok := strings.CutPrefix(p.Prefix, prefix+":")
	if !ok || !knownReason(reason) {
		return fl, false
	}
	h, ok := nfnetlink.ParseIPv4(p.Payload)
	v6 := false
	if !ok {
		// A dual-stack session's v6 packet (droprules6.go): its guest is
		// the mark, whatever the reason.
		if h, ok = nfnetlink.ParseIPv6(p.Payload); !ok {
			return fl, false
		}
		v6 = true
	}
	fl.Reason, fl.inIndex = reason, p.InIndex
	fl.Src, fl.Dst, fl.SrcPort, fl.DstPort = h.Src, h.Dst, h.SrcPort, h.DstPort
	switch h.Proto {
	case unix.IPPROTO_TCP:
		fl.Proto = "tcp"
	case unix.IPPROTO_UDP:
		fl.Proto = "udp"
	case unix.IPPROTO_ICMP:
		fl.Proto = "icmp"
	case unix.IPPROTO_ICMPV6:
		fl.Proto = "icmpv6"
	default:
		fl.Proto = strconv.Itoa(int(h.Proto))
	}
	switch {
	case v6:
		if fl.Guest = markGuest(p.Mark); !fl.Guest.IsValid() {
			return DroppedFlow{}, false // every v6 log rule tests the mark
		}
	case fl.Reason == netpolicy.ReasonInbound:
		fl.Guest = fl.Dst
	case fl.Reason == netpolicy.ReasonSpoofed:
		fl.Guest = markGuest(p.Mark)
	default:
		fl.Guest = fl.Src
	}
	return fl, true
}

// markGuest is the guest a drop line's mark names: the guest's address
// bytes as a host-order integer (see loadGuest); invalid for mark 0.
func markGuest(m uint32) netip.Addr {
	var g [4]byte
	binary.NativeEndian.PutUint32(g[:], m)
	if mark := netip.AddrFrom4(g); mark != netip.IPv4Unspecified() {
		return mark
	}
	return netip.Addr{}
}

func knownReason(r string) bool {
	if r == netpolicy.ReasonRateLimit {
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
