package daemon

import (
	"testing"

	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// dropped_no_reason is what the session's own reasons leave of its dropped
// packets; spoofed and inbound are not its own drops; a reasons' sum read
// ahead of the total gives 0, never a wrapped count.
func TestDroppedNoReason(t *testing.T) {
	for _, c := range []struct {
		c    nft.Counters
		want uint64
	}{
		{nft.Counters{DroppedPackets: 10, ByReason: map[string]uint64{"not-allowed": 4, "rate-limit": 1, "spoofed": 7, "inbound": 9}}, 5},
		{nft.Counters{DroppedPackets: 3}, 3},
		{nft.Counters{DroppedPackets: 3, ByReason: map[string]uint64{"port": 4}}, 0},
	} {
		if got := droppedNoReason(c.c); got != c.want {
			t.Errorf("droppedNoReason(%+v) = %d, want %d", c.c, got, c.want)
		}
		if v := countersView(c.c); v.DroppedNoReason != c.want {
			t.Errorf("countersView: dropped_no_reason %d, want %d", v.DroppedNoReason, c.want)
		}
	}
}
