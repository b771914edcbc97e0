package daemon

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/netpolicy"
)

func TestParseWhyDest(t *testing.T) {
	for _, tc := range []struct {
		in    string
		want  whyDest
		error string
	}{
		{in: "api.example.com", want: whyDest{name: "api.example.com"}},
		{in: "API.Example.com:443", want: whyDest{name: "api.example.com", port: 443, proto: netpolicy.ProtoTCP}},
		{in: "198.18.1.10:53/udp", want: whyDest{addr: netip.MustParseAddr("198.18.1.10"), port: 53, proto: netpolicy.ProtoUDP}},
		{in: "198.18.1.10", want: whyDest{addr: netip.MustParseAddr("198.18.1.10")}},
		{in: "198.18.1.10:0", error: `destination "198.18.1.10:0": port "0": want 1 to 65535`},
		{in: "198.18.1.10/tcp", error: `destination "198.18.1.10/tcp": a protocol needs a port, e.g. 198.18.1.10:443/tcp`},
		{in: "a.test:80/icmp", error: `destination "a.test:80/icmp": protocol "icmp": want tcp or udp`},
		{in: "2001:db8::1", error: "want a name or an IPv4 address"},
		{in: "bad name!", error: "want a name or an IPv4 address"},
	} {
		got, err := parseWhyDest(tc.in)
		switch {
		case tc.error != "":
			if err == nil || !strings.Contains(err.Error(), tc.error) {
				t.Errorf("parseWhyDest(%q) = %+v, %v; want error %q", tc.in, got, err, tc.error)
			}
		case err != nil || got != tc.want:
			t.Errorf("parseWhyDest(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}
