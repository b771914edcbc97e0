package netpolicy

// Reads of single set elements by key (NFT_MSG_GETSETELEM without
// NLM_F_DUMP), for what one session's inspect needs: its counters.
// google/nftables only dumps whole sets, and every session's counters live
// in the same few sets, so a dump made one session's inspect cost grow
// with the number of sessions (five sets of N elements parsed to read
// five of them).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfnlConn is a lazily dialed NETLINK_NETFILTER connection in the netns
// nsFd, replaced after any error; mu serialises its use. Once shut it
// dials nothing: nsFd belongs to the Firewall, which closes it, and the
// number may since name another file.
type nfnlConn struct {
	mu   sync.Mutex
	nsFd int
	shut bool
	conn *netlink.Conn
}

// do runs fn on the connection; after an error the connection is replaced.
func (n *nfnlConn) do(fn func(c *netlink.Conn) error) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.shut {
		return ErrClosed
	}
	if n.conn == nil {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: n.nsFd})
		if err != nil {
			return fmt.Errorf("open netfilter netlink socket: %w", err)
		}
		n.conn = c
	}
	if err := fn(n.conn); err != nil {
		n.conn.Close()
		n.conn = nil
		return err
	}
	return nil
}

func (n *nfnlConn) closeConn() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.shut = true
	if n.conn != nil {
		n.conn.Close()
		n.conn = nil
	}
}

// nf_tables netlink constants (linux/netfilter/nf_tables.h).
const (
	nfnlSubsysNFTables = 10
	nftMsgGetSetElem   = 13

	nftaSetElemListTable    = 1
	nftaSetElemListSet      = 2
	nftaSetElemListElements = 3
	nftaListElem            = 1
	nftaSetElemKey          = 1
	nftaSetElemExpr         = 7
	nftaSetElemExpressions  = 10
	nftaDataValue           = 1
	nftaExprName            = 1
	nftaExprData            = 2
	nftaCounterBytes        = 1
	nftaCounterPackets      = 2
)

// elemCounter is the counter of one set element.
type elemCounter struct {
	Packets, Bytes uint64
}

// getElemCounter reads the counter of set's element key in table (family
// inet). found is false when the set has no such element.
func getElemCounter(c *netlink.Conn, table, set string, key []byte) (ec elemCounter, found bool, err error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(nftaSetElemListTable, table)
	ae.String(nftaSetElemListSet, set)
	ae.Nested(nftaSetElemListElements, func(ae *netlink.AttributeEncoder) error {
		ae.Nested(nftaListElem, func(ae *netlink.AttributeEncoder) error {
			ae.Nested(nftaSetElemKey, func(ae *netlink.AttributeEncoder) error {
				ae.Bytes(nftaDataValue, key)
				return nil
			})
			return nil
		})
		return nil
	})
	attrs, err := ae.Encode()
	if err != nil {
		return ec, false, err
	}
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysNFTables<<8 | nftMsgGetSetElem), Flags: netlink.Request},
		Data:   append([]byte{unix.NFPROTO_INET, nfnetlinkV0, 0, 0}, attrs...),
	})
	if errors.Is(err, unix.ENOENT) {
		return ec, false, nil
	}
	if err != nil {
		return ec, false, fmt.Errorf("get element of set %s: %w", set, err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		if ec, found, err = parseElemCounter(m.Data[4:]); err != nil || found {
			return ec, found, err
		}
	}
	return ec, false, nil
}

// parseElemCounter finds the counter expression of the first element in a
// NEWSETELEM message's attributes.
func parseElemCounter(b []byte) (elemCounter, bool, error) {
	var ec elemCounter
	found := false
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return ec, false, err
	}
	for ad.Next() {
		if ad.Type() != nftaSetElemListElements {
			continue
		}
		ad.Nested(func(list *netlink.AttributeDecoder) error {
			for list.Next() {
				if list.Type() != nftaListElem || found {
					continue
				}
				list.Nested(func(elem *netlink.AttributeDecoder) error {
					for elem.Next() {
						switch elem.Type() {
						case nftaSetElemExpr:
							elem.Nested(func(expr *netlink.AttributeDecoder) error {
								ec, found = parseCounterExpr(expr)
								return nil
							})
						case nftaSetElemExpressions:
							elem.Nested(func(exprs *netlink.AttributeDecoder) error {
								for exprs.Next() && !found {
									exprs.Nested(func(expr *netlink.AttributeDecoder) error {
										ec, found = parseCounterExpr(expr)
										return nil
									})
								}
								return nil
							})
						}
					}
					return nil
				})
			}
			return nil
		})
	}
	return ec, found, ad.Err()
}

// parseCounterExpr reads a "counter" expression's packets and bytes.
func parseCounterExpr(ad *netlink.AttributeDecoder) (elemCounter, bool) {
	var ec elemCounter
	isCounter := false
	var data []byte
	for ad.Next() {
		switch ad.Type() {
		case nftaExprName:
			isCounter = ad.String() == "counter"
		case nftaExprData:
			data = ad.Bytes()
		}
	}
	if !isCounter || data == nil {
		return ec, false
	}
	d, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return ec, false
	}
	d.ByteOrder = binary.BigEndian
	for d.Next() {
		switch d.Type() {
		case nftaCounterBytes:
			ec.Bytes = d.Uint64()
		case nftaCounterPackets:
			ec.Packets = d.Uint64()
		}
	}
	return ec, d.Err() == nil
}

// guestCounters reads one guest's counters by key: its element in each
// accounting set and its @acct_reason elements, one request each, so the
// cost does not depend on how many sessions there are.
func (f *Firewall) guestCounters(guest netip.Addr) (Counters, error) {
	var c Counters
	g := guest.As4()
	table := f.cfg.Prefix
	err := f.reads.do(func(conn *netlink.Conn) error {
		for _, name := range []string{setAcctAccept, setAcctDrop, setAcctLimited, setAcctReturn} {
			ec, ok, err := getElemCounter(conn, table, name, g[:])
			if err != nil {
				return err
			}
			if !ok {
				continue
			}
			switch name {
			case setAcctAccept:
				c.AcceptedPackets, c.AcceptedBytes = ec.Packets, ec.Bytes
			case setAcctDrop:
				c.DroppedPackets, c.DroppedBytes = ec.Packets, ec.Bytes
			case setAcctReturn:
				c.ReceivedPackets, c.ReceivedBytes = ec.Packets, ec.Bytes
			default:
				c.LimitedPackets = ec.Packets
				if ec.Packets > 0 {
					c.addReason(ReasonRateLimit, ec.Packets) // rate-limit's count is @acct_limited's
				}
			}
		}
		for _, d := range dropCodes {
			ec, ok, err := getElemCounter(conn, table, setAcctReason, append(g[:], reasonKey(d.code)...))
			if err != nil {
				return err
			}
			switch {
			case !ok || ec.Packets == 0:
			case d.code == codeUnlogged:
				c.Unlogged = ec.Packets
			case d.reason != "":
				c.addReason(d.reason, ec.Packets)
			}
		}
		return nil
	})
	if err != nil {
		return Counters{}, fmt.Errorf("counters of guest %s: %w", guest, err)
	}
	return c, nil
}

func (c *Counters) addReason(reason string, n uint64) {
	if c.ByReason == nil {
		c.ByReason = map[string]uint64{}
	}
	c.ByReason[reason] += n
}
