package nfnetlink

// A small ctnetlink client: dump the IPv4 (or IPv6) entries of the netns the
// connection lives in, delete one by its original tuple.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// NfnetlinkV0 is the nfgenmsg version (NFNETLINK_V0).
const NfnetlinkV0 = 0

// ctnetlink message and attribute numbers (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctMsgGet        = unix.NFNL_SUBSYS_CTNETLINK<<8 | 1 // IPCTNL_MSG_CT_GET
	ctMsgDelete     = unix.NFNL_SUBSYS_CTNETLINK<<8 | 2 // IPCTNL_MSG_CT_DELETE
	ctaTupleOrig    = 1
	ctaZone         = 18
	ctaTupleIP      = 1
	ctaTupleProto   = 2
	ctaProtoNum     = 1
	ctaProtoSrcPort = 2
	ctaProtoDstPort = 3
	ctaIPv4Src      = 1
	ctaIPv4Dst      = 2
	ctaIPv6Src      = 3
	ctaIPv6Dst      = 4
	nestedAttribute = unix.NLA_F_NESTED
)

// Flow is one conntrack entry: what deleting it needs (its original tuple
// exactly as the kernel sent it, and its zone if it has one) and what the
// tuple says.
type Flow struct {
	family   uint8 // AF_INET or AF_INET6: the dump's, which a delete repeats
	tuple    []byte
	zone     []byte
	Src, Dst netip.Addr
	Proto    uint8  // the protocol number
	Sport    uint16 // the source port of a port protocol, else 0
	Dport    uint16 // the destination port of a port protocol (TCP, UDP, ...), else 0
}

func nfgenmsgOf(family uint8) []byte {
	if family == 0 {
		family = unix.AF_INET
	}
	return []byte{family, NfnetlinkV0, 0, 0}
}

// DumpFlows lists the IPv4 entries matching attrs (nil: all of them).
func DumpFlows(c *netlink.Conn, attrs []byte) ([]Flow, error) {
	return DumpFlowsOf(c, unix.AF_INET, attrs)
}

// DumpFlowsOf lists the entries of family (AF_INET or AF_INET6) matching
// attrs (nil: all of them).
func DumpFlowsOf(c *netlink.Conn, family uint8, attrs []byte) ([]Flow, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(ctMsgGet), Flags: netlink.Request | netlink.Dump},
		Data:   append(nfgenmsgOf(family), attrs...),
	})
	if err != nil {
		return nil, fmt.Errorf("dump conntrack table: %w", err)
	}
	out := make([]Flow, 0, len(msgs))
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		e, err := parseFlow(m.Data[4:])
		if err != nil {
			return nil, err
		}
		e.family = family
		if e.tuple != nil {
			out = append(out, e)
		}
	}
	return out, nil
}

// parseFlow reads one entry of a dump: its original tuple and zone.
func parseFlow(b []byte) (Flow, error) {
	var e Flow
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return e, fmt.Errorf("parse conntrack entry: %w", err)
	}
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleOrig:
			e.tuple = append([]byte(nil), ad.Bytes()...)
			e.Src, e.Dst, e.Proto, e.Sport, e.Dport = parseTuple(e.tuple)
		case ctaZone:
			e.zone = append([]byte(nil), ad.Bytes()...)
		}
	}
	return e, ad.Err()
}

// parseTuple reads an encoded tuple once: its IPv4 source and destination,
// its protocol number and, for a port protocol, its ports.
func parseTuple(tuple []byte) (src, dst netip.Addr, proto uint8, sport, dport uint16) {
	ad, err := netlink.NewAttributeDecoder(tuple)
	if err != nil {
		return
	}
	for ad.Next() {
		inner, err := netlink.NewAttributeDecoder(ad.Bytes())
		if err != nil {
			return
		}
		switch ad.Type() {
		case ctaTupleIP:
			for inner.Next() {
				v := inner.Bytes()
				switch {
				case inner.Type() == ctaIPv4Src && len(v) == 4:
					src = netip.AddrFrom4([4]byte(v))
				case inner.Type() == ctaIPv4Dst && len(v) == 4:
					dst = netip.AddrFrom4([4]byte(v))
				case inner.Type() == ctaIPv6Src && len(v) == 16:
					src = netip.AddrFrom16([16]byte(v))
				case inner.Type() == ctaIPv6Dst && len(v) == 16:
					dst = netip.AddrFrom16([16]byte(v))
				}
			}
		case ctaTupleProto:
			for inner.Next() {
				v := inner.Bytes()
				switch {
				case inner.Type() == ctaProtoNum && len(v) == 1:
					proto = v[0]
				case inner.Type() == ctaProtoSrcPort && len(v) == 2:
					sport = binary.BigEndian.Uint16(v)
				case inner.Type() == ctaProtoDstPort && len(v) == 2:
					dport = binary.BigEndian.Uint16(v)
				}
			}
		}
	}
	return
}

// DeleteFlow deletes one entry by its original tuple; an entry that went
// away meanwhile (it expired) counts as deleted.
func DeleteFlow(c *netlink.Conn, e Flow) error {
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(nestedAttribute|ctaTupleOrig, e.tuple)
	if e.zone != nil {
		ae.Bytes(ctaZone, e.zone)
	}
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	_, err = c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(ctMsgDelete), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(nfgenmsgOf(e.family), attrs...),
	})
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("delete conntrack entry %s -> %s: %w", e.Src, e.Dst, err)
	}
	return nil
}
