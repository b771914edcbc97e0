package dnsproxy

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// TestFilterAAAAForDualStack: for a dual-stack session AAAA records and
// ipv6hints follow A's and ipv4hint's rules (kept when of the chain and
// public by the v6 guard; special-purpose, v4-mapped and out-of-chain ones
// dropped); for an IPv4-only session the same answer loses every AAAA and
// ipv6hint (the control that nothing changed there).
func TestFilterAAAAForDualStack(t *testing.T) {
	g, err := netpolicy.DefaultGuard().DualStack(netip.MustParsePrefix("fd00:20::/112"), nil)
	if err != nil {
		t.Fatal(err)
	}
	rr := func(s string) dns.RR {
		r, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	up := new(dns.Msg)
	up.Answer = []dns.RR{
		rr("www.example.com. 60 IN CNAME edge.example.net."),
		rr("edge.example.net. 60 IN AAAA 2606:4700::10"),
		rr("edge.example.net. 60 IN AAAA 2001:db8::1"),    // documentation
		rr("edge.example.net. 60 IN AAAA ::ffff:8.8.8.8"), // v4-mapped
		rr("edge.example.net. 60 IN AAAA fd00:20::2"),     // the pool
		rr("other.example.org. 60 IN AAAA 2606:4700::99"), // outside the chain
		rr("edge.example.net. 60 IN HTTPS 1 . ipv6hint=2606:4700::11,fe80::1 ipv4hint=192.0.2.1,93.184.215.14"),
	}
	f := filterResponseFamilies("www.example.com.", up, true, g.IsPublicUnicast, true)
	want := []netip.Addr{netip.MustParseAddr("2606:4700::10"), netip.MustParseAddr("2606:4700::11"), netip.MustParseAddr("93.184.215.14")}
	if !sameAddrs(f.kept, want) {
		t.Errorf("dual-stack kept %v, want %v", f.kept, want)
	}
	for _, a := range []string{"2001:db8::1", "fd00:20::2", "fe80::1", "192.0.2.1"} {
		if !slices.Contains(f.dropped, netip.MustParseAddr(a)) {
			t.Errorf("dual-stack: %s not reported dropped: %v", a, f.dropped)
		}
	}
	for _, r := range f.answer {
		if a, ok := r.(*dns.AAAA); ok && a.AAAA.String() != "2606:4700::10" {
			t.Errorf("dual-stack answer holds %s", a)
		}
	}

	v4 := filterResponseFamilies("www.example.com.", up, true, g.IsPublicUnicast, false)
	if !sameAddrs(v4.kept, []netip.Addr{netip.MustParseAddr("93.184.215.14")}) {
		t.Errorf("IPv4-only kept %v, want only the v4 hint", v4.kept)
	}
	for _, r := range v4.answer {
		if _, ok := r.(*dns.AAAA); ok {
			t.Errorf("IPv4-only answer holds %s", r)
		}
		if h, ok := r.(*dns.HTTPS); ok {
			for _, kv := range h.Value {
				if _, ok := kv.(*dns.SVCBIPv6Hint); ok {
					t.Errorf("IPv4-only answer holds an ipv6hint: %s", h)
				}
			}
		}
	}
}

func sameAddrs(a, b []netip.Addr) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.SortFunc(a, netip.Addr.Compare)
	slices.SortFunc(b, netip.Addr.Compare)
	return slices.Equal(a, b)
}
