package nft

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// A session's inbound ports are guest . proto . port elements, both
// protocols for a bare port; none without any.
func TestInboundElements(t *testing.T) {
	g := netip.MustParseAddr("10.20.0.2")
	if got := inboundElements(SessionRules{Guest: g}); got != nil {
		t.Errorf("no ports: %v", got)
	}
	got := inboundElements(SessionRules{Guest: g, InboundFromHost: []netpolicy.PortSpec{{Port: 8080}, {Port: 53, Proto: netpolicy.ProtoUDP}}})
	if len(got) != 1 || got[0].set != setInboundHost || len(got[0].elems) != 3 {
		t.Fatalf("elements = %+v", got)
	}
	want := [][]byte{
		{10, 20, 0, 2, 17, 0, 0, 0, 0, 53, 0, 0},
		{10, 20, 0, 2, 6, 0, 0, 0, 0x1f, 0x90, 0, 0},
		{10, 20, 0, 2, 17, 0, 0, 0, 0x1f, 0x90, 0, 0},
	}
	for i, e := range got[0].elems {
		if !slices.Equal(e.Key, want[i]) {
			t.Errorf("element %d = %v, want %v", i, e.Key, want[i])
		}
	}
}
