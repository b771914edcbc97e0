package netpolicy

import (
	"net/netip"
	"slices"
	"testing"
)

func TestParseInboundPort(t *testing.T) {
	for _, c := range []struct {
		in   string
		want PortSpec
		err  string
	}{
		{in: "8080", want: PortSpec{Port: 8080}},
		{in: "8080/tcp", want: PortSpec{Port: 8080, Proto: ProtoTCP}},
		{in: "53/UDP", want: PortSpec{Port: 53, Proto: ProtoUDP}},
		{in: "0", err: `inbound from host "0": port "0": want PORT or PORT/tcp or PORT/udp, PORT from 1 to 65535`},
		{in: "65536", err: `inbound from host "65536": port "65536": want PORT or PORT/tcp or PORT/udp, PORT from 1 to 65535`},
		{in: "http", err: `inbound from host "http": port "http": want PORT or PORT/tcp or PORT/udp, PORT from 1 to 65535`},
		{in: "80/icmp", err: `inbound from host "80/icmp": protocol "icmp": want tcp or udp`},
	} {
		got, err := ParseInboundPort(c.in)
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("ParseInboundPort(%q) = %v, %v; want error %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseInboundPort(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}

func TestNormalizeInbound(t *testing.T) {
	in := []PortSpec{{Port: 8080, Proto: ProtoTCP}, {Port: 80, Proto: ProtoTCP}, {Port: 80}, {Port: 8080, Proto: ProtoTCP}, {Port: 53, Proto: ProtoUDP}}
	want := []PortSpec{{Port: 53, Proto: ProtoUDP}, {Port: 80}, {Port: 8080, Proto: ProtoTCP}}
	if got := NormalizeInbound(in); !slices.Equal(got, want) {
		t.Errorf("NormalizeInbound = %v, want %v", got, want)
	}
	var strs []string
	for _, p := range want {
		strs = append(strs, InboundString(p))
	}
	if !slices.Equal(strs, []string{"53/udp", "80", "8080/tcp"}) {
		t.Errorf("InboundString = %v", strs)
	}
}

// A session's inbound ports are guest . proto . port elements, both
// protocols for a bare port; none without any.
func TestInboundElements(t *testing.T) {
	g := netip.MustParseAddr("10.20.0.2")
	if got := inboundElements(SessionRules{Guest: g}); got != nil {
		t.Errorf("no ports: %v", got)
	}
	got := inboundElements(SessionRules{Guest: g, InboundFromHost: []PortSpec{{Port: 8080}, {Port: 53, Proto: ProtoUDP}}})
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
