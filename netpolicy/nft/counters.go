package nft

// One session's counters, read element by element
// (nfnetlink.GetElemCounter): every session's counters live in the same few
// sets, so a dump made one session's inspect cost grow with the number of
// sessions (five sets of N elements parsed to read five of them).

import (
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"

	"github.com/enforcerd/enforcerd/internal/nfnetlink"
	"github.com/enforcerd/enforcerd/netpolicy"
)

// guestCounters reads one guest's counters by key: its element in each
// accounting set and its @acct_reason elements, one request each, so the
// cost does not depend on how many sessions there are.
func (f *Firewall) guestCounters(guest netip.Addr) (Counters, error) {
	var c Counters
	g := guest.As4()
	table := f.cfg.Prefix
	err := f.reads.Do(func(conn *netlink.Conn) error {
		for _, name := range []string{setAcctAccept, setAcctDrop, setAcctLimited, setAcctReturn} {
			ec, ok, err := nfnetlink.GetElemCounter(conn, table, name, g[:])
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
					c.addReason(netpolicy.ReasonRateLimit, ec.Packets) // rate-limit's count is @acct_limited's
				}
			}
		}
		for _, d := range dropCodes {
			ec, ok, err := nfnetlink.GetElemCounter(conn, table, setAcctReason, append(g[:], reasonKey(d.code)...))
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
