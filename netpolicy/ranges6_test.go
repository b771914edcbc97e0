package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
)

// TestGuard6Registry: every row of SpecialPurpose6 is blocked at its first
// and last address, named by its most specific row, and the global unicast
// addresses just outside the rows' edges pass (the controls).
func TestGuard6Registry(t *testing.T) {
	pool6 := netip.MustParsePrefix("fd00:20::/112")
	g, err := DefaultGuard().DualStack(pool6, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range SpecialPurpose6 {
		iv := prefixInterval6(r.Prefix)
		for _, a := range []netip.Addr{iv.first, iv.last} {
			got, ok := g.BlockedBy6(a)
			if !ok {
				t.Errorf("%s (%s) not blocked", a, r.Name)
				continue
			}
			if want, _ := special6Containing(netip.PrefixFrom(a, 128)); got != want {
				t.Errorf("%s blocked by %s, want %s", a, got, want)
			}
			if g.IsPublicUnicast6(a) || g.IsPublicUnicast(a) {
				t.Errorf("%s (%s) public", a, r.Name)
			}
		}
	}
	for _, tc := range []struct{ addr, name string }{
		{"::", "unspecified"}, {"::1", "loopback"}, {"::ffff:8.8.8.8", "ipv4-mapped"},
		{"64:ff9b::808:808", "nat64"}, {"64:ff9b:1::1", "nat64-local-use"}, {"100::1", "discard-only"},
		{"2001::1", "teredo"}, {"2001:1::1", "ietf-protocol-assignments"}, {"2001:2::10", "benchmarking"},
		{"2001:10::1", "orchid"}, {"2001:20::1", "orchid-v2"}, {"2001:db8::1", "documentation"},
		{"2002:c000:204::1", "6to4"}, {"3fff::1", "documentation"}, {"5f00::1", "srv6-sids"},
		{"fd12::1", "unique-local"}, {"fe80::1", "link-local"}, {"ff02::1", "multicast"},
		{"1000::1", "not-global-unicast"}, {"4000::1", "not-global-unicast"}, {"fec0::1", "not-global-unicast"},
		{"fd00:20::2", poolRangeName}, {"fd00:20::fffe", poolRangeName},
	} {
		got, ok := g.BlockedBy6(netip.MustParseAddr(tc.addr))
		if !ok || got.Name != tc.name {
			t.Errorf("%s: blocked by %v %v, want %s", tc.addr, got, ok, tc.name)
		}
	}
	for _, a := range []string{
		"2000::", "2001:200::1", "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db9::",
		"2001:1ff::1" /* inside 2001::/23 */, "2003::", "2606:4700::1111", "3ffe:ffff::1", "3fff:1000::",
	} {
		ip := netip.MustParseAddr(a)
		want := a != "2001:1ff::1"
		if g.IsPublicUnicast6(ip) != want {
			t.Errorf("%s public = %v, want %v", a, !want, want)
		}
	}
	if g.IsPublicUnicast6(netip.MustParseAddr("8.8.8.8")) {
		t.Error("an IPv4 address passes the v6 guard")
	}
}

// TestGuard6Overrides: an override opens exactly its range (the world's
// 2001:2::/48), never the pool; a guard that is not dual-stack blocks all
// of IPv6 as before.
func TestGuard6Overrides(t *testing.T) {
	pool6 := netip.MustParsePrefix("fd00:20::/112")
	g, err := DefaultGuard().DualStack(pool6, []netip.Prefix{netip.MustParsePrefix("2001:2::/48")})
	if err != nil {
		t.Fatal(err)
	}
	if !g.IsPublicUnicast6(netip.MustParseAddr("2001:2:0:1::10")) {
		t.Error("override 2001:2::/48 not public")
	}
	for _, a := range []string{"2001:1:ffff:ffff:ffff:ffff:ffff:ffff", "2001:3::", "fd00:20::1"} {
		if g.IsPublicUnicast6(netip.MustParseAddr(a)) {
			t.Errorf("%s public beside the override", a)
		}
	}
	if DefaultGuard().IsPublicUnicast(netip.MustParseAddr("2606:4700::1111")) {
		t.Error("a guard that is not dual-stack passes IPv6")
	}
	for _, tc := range []struct {
		o    string
		want string
	}{
		{"2606:4700::/32", "not inside a special-purpose range"},
		{"fd00::/16", "overlaps the session pool6"},
		{"2001:2::1/48", "host bits set"},
		{"10.0.0.0/8", "want an IPv6 prefix"},
	} {
		_, err := DefaultGuard().DualStack(pool6, []netip.Prefix{netip.MustParsePrefix(tc.o)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("override %s: %v, want %q", tc.o, err, tc.want)
		}
	}
	// The merged set: sorted, disjoint, not adjacent; everything above
	// global unicast (4000::/2, 8000::/1, the pool, ULA, multicast) is one
	// interval.
	rs := g.BlockedRanges6()
	for i := 1; i < len(rs); i++ {
		if !rs[i-1].Last.Next().Less(rs[i].First) {
			t.Errorf("intervals %v and %v overlap or touch", rs[i-1], rs[i])
		}
	}
	if last := rs[len(rs)-1]; last.First != netip.MustParseAddr("4000::") || last.Last != netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff") {
		t.Errorf("last interval %v, want 4000:: to the end", last)
	}
}

// TestEntry6Grammar: on a dual-stack guard the IPv6 forms parse, print back
// to themselves, and the guard refuses special-purpose ones; without one
// every IPv6 form is refused as before (entry_test.go).
func TestEntry6Grammar(t *testing.T) {
	g, err := DefaultGuard().DualStack(netip.MustParsePrefix("fd00:20::/112"), []netip.Prefix{netip.MustParsePrefix("2001:2::/48")})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ in, want string }{
		{"2001:2::10", "2001:2::10"},
		{"[2001:2::10]", "2001:2::10"},
		{"[2001:2::10]:443/tcp", "[2001:2::10]:443/tcp"},
		{"[2001:2::10]:53/UDP", "[2001:2::10]:53/udp"},
		{"2001:2::/64", "2001:2::/64"},
		{"2606:4700::/32", "2606:4700::/32"},
	} {
		e, err := ParseEntry(tc.in, g)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if e.Kind != KindCIDR || e.String() != tc.want {
			t.Errorf("%s: %v %q, want %q", tc.in, e.Kind, e.String(), tc.want)
		}
		if back, err := ParseEntry(e.String(), g); err != nil || back != e {
			t.Errorf("%s: round trip %v %v", tc.in, back, err)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"2001:db8::1", `allow entry "2001:db8::1": 2001:db8::1 is inside special-purpose range 2001:db8::/32 (documentation); only public unicast IPv6 is accepted`},
		{"fe80::1", `allow entry "fe80::1": fe80::1 is inside special-purpose range fe80::/10 (link-local); only public unicast IPv6 is accepted`},
		{"::ffff:8.8.8.8", `allow entry "::ffff:8.8.8.8": ::ffff:8.8.8.8 is inside special-purpose range ::ffff:0.0.0.0/96 (ipv4-mapped); only public unicast IPv6 is accepted`},
		{"64:ff9b::8.8.8.8", `allow entry "64:ff9b::8.8.8.8": 64:ff9b::808:808 is inside special-purpose range 64:ff9b::/96 (nat64); only public unicast IPv6 is accepted`},
		{"fd00:20::2", `allow entry "fd00:20::2": fd00:20::2 is inside special-purpose range fd00:20::/112 (session pool); only public unicast IPv6 is accepted`},
		{"2000::/3", `allow entry "2000::/3": 2000::/3 overlaps special-purpose range 2001::/32 (teredo); only public unicast IPv6 is accepted`},
		{"2001:2::1/48", `allow entry "2001:2::1/48": host bits set in 2001:2::1/48; did you mean 2001:2::/48?`},
		{"2001:2::10::443", `allow entry "2001:2::10::443": invalid IPv6 address "2001:2::10::443"; want an IPv6 address, an IPv6 CIDR such as 2001:db8::/64, or [ADDRESS]:PORT, optionally followed by /tcp or /udp`},
		{"[2001:2::10", `allow entry "[2001:2::10": unbalanced or misplaced brackets; want an IPv6 address, an IPv6 CIDR such as 2001:db8::/64, or [ADDRESS]:PORT, optionally followed by /tcp or /udp`},
		{"[2001:2::10]:0", `allow entry "[2001:2::10]:0": port 0 is out of range; want 1 to 65535`},
		{"fe80::1%eth0", `allow entry "fe80::1%eth0": invalid IPv6 address "fe80::1%eth0"; want an IPv6 address, an IPv6 CIDR such as 2001:db8::/64, or [ADDRESS]:PORT, optionally followed by /tcp or /udp`},
	} {
		_, err := ParseEntry(tc.in, g)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s:\n got %v\nwant %s", tc.in, err, tc.want)
		}
	}
}

// TestDenyEntry6: on a dual-stack daemon a deny entry may be any IPv6
// address or CIDR (special-purpose ones too: denying is never unsafe); on
// an IPv4-only one IPv6 is refused, as before.
func TestDenyEntry6(t *testing.T) {
	g, err := DefaultGuard().DualStack(netip.MustParsePrefix("fd00:20::/112"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"2001:db8::/32", "2001:2::5", "[2001:2::5]:443/tcp", "fd00:20::/112"} {
		e, err := ParseDenyEntryFor(s, g)
		if err != nil || e.Kind != KindCIDR || !e.Prefix.Addr().Is6() {
			t.Errorf("ParseDenyEntryFor(%q, dual-stack) = %+v, %v", s, e, err)
		}
		if _, err := ParseDenyEntryFor(s, DefaultGuard()); err == nil || !strings.Contains(err.Error(), "IPv6 is not supported") {
			t.Errorf("ParseDenyEntryFor(%q, IPv4-only) = %v, want IPv6 is not supported", s, err)
		}
	}
	if _, err := ParseDenyEntryFor("::ffff:198.18.0.1", g); err == nil {
		t.Error("a v4-mapped deny entry parsed")
	}
}
