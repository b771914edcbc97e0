package nfnetlink

// Reads of single set elements by key (NFT_MSG_GETSETELEM without
// NLM_F_DUMP): google/nftables only dumps whole sets, and a caller that
// wants one element's counter should not pay for parsing every element of
// a set shared by all sessions.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

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

// ElemCounter is the counter of one set element.
type ElemCounter struct {
	Packets, Bytes uint64
}

// GetElemCounter reads the counter of set's element key in table (family
// inet) with one NFT_MSG_GETSETELEM request (no dump). found is false when
// the set has no such element.
func GetElemCounter(c *netlink.Conn, table, set string, key []byte) (ec ElemCounter, found bool, err error) {
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
		Data:   append([]byte{unix.NFPROTO_INET, NfnetlinkV0, 0, 0}, attrs...),
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
func parseElemCounter(b []byte) (ElemCounter, bool, error) {
	var ec ElemCounter
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
func parseCounterExpr(ad *netlink.AttributeDecoder) (ElemCounter, bool) {
	var ec ElemCounter
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
