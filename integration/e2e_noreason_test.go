package integration

// dropped_packets exceeded the sum of dropped_by_reason with no
// explanation (issue 27 finding 11): the packets conntrack calls invalid
// are dropped before any policy looks at them, and no reason counts them.
// inspect now says how many (dropped_no_reason), and the identity
// dropped_packets = dropped_no_reason + the session's own reasons holds.

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// tcpRST returns a whole IPv4/TCP segment with only RST set.
func tcpRST(src, dst netip.AddrPort) []byte {
	h := make([]byte, 20)
	binary.BigEndian.PutUint16(h[0:], src.Port())
	binary.BigEndian.PutUint16(h[2:], dst.Port())
	binary.BigEndian.PutUint32(h[4:], 0x01020304)
	h[12] = 5 << 4
	h[13] = 0x04 // RST
	s, d := src.Addr().As4(), dst.Addr().As4()
	ph := append(append(append([]byte{}, s[:]...), d[:]...), 0, world.ProtoTCP, 0, 20)
	binary.BigEndian.PutUint16(h[16:], world.Checksum(append(ph, h...)))
	return append(world.IPv4Header(src.Addr(), dst.Addr(), world.ProtoTCP, len(h), 0x4d50), h...)
}

func ownReasons(c api.Counters) uint64 {
	var n uint64
	for r, v := range c.DroppedByReason {
		if r != "spoofed" && r != "inbound" {
			n += v
		}
	}
	return n
}

func TestE2EDroppedNoReason(t *testing.T) {
	e := newE2E(t)
	s := e.createNetOnly("s", "--allow", "api.e2e.test")
	ns, guest := e.nsPath("s"), netip.MustParseAddr(s.GuestIP)
	before := e.inspect("s").Counters
	// Five resets of no connection conntrack knows: invalid.
	for i := 0; i < 5; i++ {
		atkSendRaw(t, ns, tcpRST(netip.AddrPortFrom(guest, uint16(40000+i)), netip.MustParseAddrPort("198.18.1.10:80")))
	}
	// The control: one datagram the policy refuses is counted by its reason.
	atkSendRaw(t, ns, world.UDPPacket(netip.AddrPortFrom(guest, 41000), netip.MustParseAddrPort("198.18.2.10:7"), []byte("x")))
	var after api.Counters
	deadline := time.Now().Add(3 * time.Second)
	for {
		after = e.inspect("s").Counters
		if after.DroppedPackets >= before.DroppedPackets+6 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := after.DroppedNoReason - before.DroppedNoReason; got != 5 {
		t.Errorf("dropped_no_reason grew by %d for 5 invalid resets, want 5 (before %+v, after %+v)", got, before, after)
	}
	if got := after.DroppedByReason["not-allowed"] - before.DroppedByReason["not-allowed"]; got != 1 {
		t.Errorf("dropped_by_reason.not-allowed grew by %d for one refused datagram, want 1", got)
	}
	if after.DroppedPackets != after.DroppedNoReason+ownReasons(after) {
		t.Errorf("dropped_packets %d != dropped_no_reason %d + own reasons %d (%v)", after.DroppedPackets, after.DroppedNoReason, ownReasons(after), after.DroppedByReason)
	}
}
