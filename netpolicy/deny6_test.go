package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
)

// TestParseDenyIPv6: a dual-stack daemon's guard takes IPv6 deny entries
// (any range, special-purpose ones too: a deny is never unsafe) without a
// port, and refuses one with a port (denied6 has no ports: it would be
// widened); an IPv4-only daemon's, and a nil guard's, refuse IPv6 as its
// allow entries do. IPv4 deny entries are the same on both.
func TestParseDenyIPv6(t *testing.T) {
	ds, err := DefaultGuard().DualStack(netip.MustParsePrefix("fd00:20::/112"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"2001:2:0:1::11", "2001:db8::/32", "fd99::10", "[2001:2:0:1::11]"} {
		e, err := ds.ParseDeny(s)
		if err != nil || e.Kind != KindCIDR || !e.Prefix.Addr().Is6() {
			t.Errorf("dual-stack ParseDeny(%q) = %+v, %v; want an IPv6 CIDR entry", s, e, err)
		}
	}
	for s, want := range map[string]string{
		"[2001:2:0:1::11]:443": `deny entry "[2001:2:0:1::11]:443": an IPv6 address or CIDR is denied on every port; want 2001:2:0:1::11 without the port`,
		"2001:2::/48 ":         "",
	} {
		_, err := ds.ParseDeny(s)
		if got := ""; err != nil {
			got = err.Error()
			if got != want {
				t.Errorf("dual-stack ParseDeny(%q): %q, want %q", s, got, want)
			}
		} else if want != "" {
			t.Errorf("dual-stack ParseDeny(%q) passed, want %q", s, want)
		}
	}
	for _, parse := range []func(string) (Entry, error){(*Guard)(nil).ParseDeny, DefaultGuard().ParseDeny} {
		if _, err := parse("2001:2:0:1::11"); err == nil || err.Error() != `deny entry "2001:2:0:1::11": IPv6 is not supported` {
			t.Errorf("IPv4-only deny of 2001:2:0:1::11: %v, want IPv6 is not supported", err)
		}
		if e, err := parse("10.0.0.0/8:22/tcp"); err != nil || e.Port != 22 {
			t.Errorf("IPv4-only deny of 10.0.0.0/8:22/tcp: %+v, %v", e, err)
		}
	}
	if _, err := ds.ParseDeny("::ffff:198.18.0.1"); err == nil || !strings.Contains(err.Error(), "IPv4-mapped") {
		t.Errorf("dual-stack deny of a v4-mapped address: %v, want refused as IPv4-mapped", err)
	}
	if e, err := ds.ParseDeny("10.0.0.0/8:22/tcp"); err != nil || e.Port != 22 {
		t.Errorf("dual-stack deny of 10.0.0.0/8:22/tcp: %+v, %v", e, err)
	}
}
