package netpolicy

import (
	"net/netip"
	"testing"
)

// TestMappedAddressesJudgedAsIPv4 pins the stated semantics: an
// IPv4-mapped IPv6 address (::ffff:A.B.C.D, RFC 4291 2.5.5.2) is judged by
// its IPv4 address; any other IPv6 address is not public (unsupported).
func TestMappedAddressesJudgedAsIPv4(t *testing.T) {
	tests := []struct {
		ip   string
		want bool
	}{
		{"::ffff:8.8.8.8", true},
		{"::ffff:10.0.0.1", false},
		{"::ffff:127.0.0.1", false},
		{"::ffff:169.254.169.254", false},
		{"::ffff:192.0.0.9", false}, // 192.0.0.0/24 is blocked whole, stricter than the registry
		{"64:ff9b::808:808", false}, // NAT64 is IPv6, not a mapped address
		{"2001:4860:4860::8888", false},
	}
	for _, tt := range tests {
		if got := IsPublicUnicast(netip.MustParseAddr(tt.ip)); got != tt.want {
			t.Errorf("IsPublicUnicast(%s) = %v, want %v", tt.ip, got, tt.want)
		}
	}
}
