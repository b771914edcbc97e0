package netpolicy

import (
	"net/netip"
	"slices"
	"testing"
)

var pool16 = netip.MustParsePrefix("10.20.0.0/16")

func TestIsPublicUnicast(t *testing.T) {
	tests := []struct {
		ip   string
		want bool
	}{
		{"8.8.8.8", true}, {"1.1.1.1", true}, {"0.0.0.0", false}, {"0.255.255.255", false}, {"1.0.0.0", true},
		{"9.255.255.255", true}, {"10.0.0.0", false}, {"11.0.0.0", true},
		{"100.63.255.255", true}, {"100.64.0.0", false}, {"100.127.255.255", false}, {"100.128.0.0", true},
		{"127.0.0.1", false}, {"168.63.129.15", true}, {"168.63.129.16", false}, {"168.63.129.17", true}, {"169.254.169.254", false}, {"172.15.255.255", true}, {"172.16.0.0", false},
		{"172.31.255.255", false}, {"172.32.0.0", true}, {"192.0.0.8", false}, {"192.0.2.1", false},
		{"192.88.99.1", false}, {"192.168.1.1", false}, {"198.17.255.255", true}, {"198.18.0.0", false},
		{"198.19.255.255", false}, {"198.20.0.0", true}, {"198.51.100.7", false}, {"203.0.113.9", false},
		{"223.255.255.255", true}, {"224.0.0.1", false}, {"239.255.255.255", false}, {"240.0.0.1", false},
		{"255.255.255.255", false},
		{"::ffff:10.0.0.1", false}, {"::ffff:8.8.8.8", true}, {"2001:4860:4860::8888", false}, {"::1", false},
	}
	for _, tt := range tests {
		if got := IsPublicUnicast(netip.MustParseAddr(tt.ip)); got != tt.want {
			t.Errorf("IsPublicUnicast(%s) = %v, want %v", tt.ip, got, tt.want)
		}
	}
	if IsPublicUnicast(netip.Addr{}) {
		t.Errorf("the zero Addr is public")
	}
}

func TestGuardBlockedPrefixes(t *testing.T) {
	g, err := NewGuard(pool16, []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "168.63.129.16/32", "169.254.0.0/16", "172.16.0.0/12",
		"192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/3"}
	var got []string
	for _, p := range g.Blocked() {
		got = append(got, p.String())
	}
	if !slices.Equal(got, want) {
		t.Errorf("Blocked() =\n%v\nwant\n%v", got, want)
	}
}

func TestNewGuardErrors(t *testing.T) {
	p := netip.MustParsePrefix
	tests := []struct {
		pool      netip.Prefix
		overrides []netip.Prefix
		want      string
	}{
		{p("fd00::/64"), nil, "session pool fd00::/64: IPv6 is not supported"},
		{p("10.20.0.1/16"), nil, "session pool 10.20.0.1/16: host bits set; did you mean 10.20.0.0/16?"},
		{pool16, []netip.Prefix{p("8.8.8.0/24")}, "public override 8.8.8.0/24: not inside a special-purpose range; only special-purpose ranges can be treated as public"},
		{pool16, []netip.Prefix{p("10.0.0.0/7")}, "public override 10.0.0.0/7: not inside a special-purpose range; only special-purpose ranges can be treated as public"},
		{pool16, []netip.Prefix{p("10.0.0.0/8")}, "public override 10.0.0.0/8: overlaps the session pool 10.20.0.0/16, which is never public"},
		{pool16, []netip.Prefix{p("10.20.1.0/24")}, "public override 10.20.1.0/24: overlaps the session pool 10.20.0.0/16, which is never public"},
		{pool16, []netip.Prefix{p("fe80::/10")}, "public override fe80::/10: IPv6 is not supported"},
		{pool16, []netip.Prefix{p("198.18.0.1/15")}, "public override 198.18.0.1/15: host bits set; did you mean 198.18.0.0/15?"},
		{pool16, []netip.Prefix{{}}, "public override: invalid prefix"},
	}
	for _, tt := range tests {
		_, err := NewGuard(tt.pool, tt.overrides)
		if err == nil || err.Error() != tt.want {
			t.Errorf("NewGuard(%s, %v) = %v, want %q", tt.pool, tt.overrides, err, tt.want)
		}
	}
}

func TestIntervalPrefixes(t *testing.T) {
	got := intervalPrefixes(interval{addrToU32(netip.MustParseAddr("10.0.0.0")), addrToU32(netip.MustParseAddr("10.98.255.255"))})
	want := []string{"10.0.0.0/10", "10.64.0.0/11", "10.96.0.0/15", "10.98.0.0/16"}
	var s []string
	for _, p := range got {
		s = append(s, p.String())
	}
	if !slices.Equal(s, want) {
		t.Errorf("got %v, want %v", s, want)
	}
	if all := intervalPrefixes(interval{0, ^uint32(0)}); len(all) != 1 || all[0].String() != "0.0.0.0/0" {
		t.Errorf("whole space = %v", all)
	}
}

// ianaIPv4Special is the IANA IPv4 Special-Purpose Address Registry
// (iana-ipv4-special-registry, RFC 6890 and successors), transcribed: each
// block with its "Globally Reachable" column. See testdata/README.md.
var ianaIPv4Special = []struct {
	block  string
	name   string
	global bool
}{
	{"0.0.0.0/8", "This network", false},
	{"0.0.0.0/32", "This host on this network", false},
	{"10.0.0.0/8", "Private-Use", false},
	{"100.64.0.0/10", "Shared Address Space", false},
	{"127.0.0.0/8", "Loopback", false},
	{"169.254.0.0/16", "Link Local", false},
	{"172.16.0.0/12", "Private-Use", false},
	{"192.0.0.0/24", "IETF Protocol Assignments", false},
	{"192.0.0.0/29", "IPv4 Service Continuity Prefix", false},
	{"192.0.0.8/32", "IPv4 dummy address", false},
	{"192.0.0.9/32", "Port Control Protocol Anycast", true},
	{"192.0.0.10/32", "Traversal Using Relays around NAT Anycast", true},
	{"192.0.0.170/32", "NAT64/DNS64 Discovery", false},
	{"192.0.0.171/32", "NAT64/DNS64 Discovery", false},
	{"192.0.2.0/24", "Documentation (TEST-NET-1)", false},
	{"192.31.196.0/24", "AS112-v4", true},
	{"192.52.193.0/24", "AMT", true},
	{"192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", false},
	{"192.168.0.0/16", "Private-Use", false},
	{"192.175.48.0/24", "Direct Delegation AS112 Service", true},
	{"198.18.0.0/15", "Benchmarking", false},
	{"198.51.100.0/24", "Documentation (TEST-NET-2)", false},
	{"203.0.113.0/24", "Documentation (TEST-NET-3)", false},
	{"240.0.0.0/4", "Reserved", false},
	{"255.255.255.255/32", "Limited Broadcast", false},
}

// stricterByDesign are registry blocks that are globally reachable but
// blocked anyway, with the reason.
var stricterByDesign = map[string]string{
	"192.0.0.9/32":  "inside 192.0.0.0/24, blocked whole: an anycast for NAT port control is no destination a sandbox needs",
	"192.0.0.10/32": "inside 192.0.0.0/24, blocked whole: likewise for TURN anycast",
}

// TestIANASpecialPurposeIPv4: every block the registry says is not globally
// reachable is blocked whole (first, last and middle address), with no
// overrides; a globally reachable block is public unless listed, with its
// reason, in stricterByDesign.
func TestIANASpecialPurposeIPv4(t *testing.T) {
	g := DefaultGuard()
	for _, r := range ianaIPv4Special {
		p := netip.MustParsePrefix(r.block)
		pr := PrefixRange(p)
		first, last := pr.First, pr.Last
		mid := u32ToAddr(addrToU32(first) + (addrToU32(last)-addrToU32(first))/2)
		blocked := !g.IsPublicUnicast(first) && !g.IsPublicUnicast(last) && !g.IsPublicUnicast(mid)
		public := g.IsPublicUnicast(first) && g.IsPublicUnicast(last) && g.IsPublicUnicast(mid)
		switch why, stricter := stricterByDesign[r.block]; {
		case !r.global && !blocked:
			t.Errorf("%s (%s) is not globally reachable, but part of it passes the guard", r.block, r.name)
		case r.global && stricter && !blocked:
			t.Errorf("%s (%s) should be blocked by design (%s)", r.block, r.name, why)
		case r.global && !stricter && !public:
			t.Errorf("%s (%s) is globally reachable, but the guard blocks part of it without a stated reason", r.block, r.name)
		}
	}
}
