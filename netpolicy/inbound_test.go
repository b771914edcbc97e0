package netpolicy

import (
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
