package nft

import (
	"bytes"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"

	"github.com/enforcerd/enforcerd/netpolicy"
)

var pool16 = netip.MustParsePrefix("10.20.0.0/16")

// oracle is the definition, written independently of the interval code: a
// special range not overridden, or the pool.
func oracle(ip netip.Addr, pool netip.Prefix, overrides []netip.Prefix) bool {
	ip = ip.Unmap()
	if !ip.Is4() {
		return true
	}
	if pool.IsValid() && pool.Contains(ip) {
		return true
	}
	for _, r := range netpolicy.SpecialPurpose {
		if r.Prefix.Contains(ip) {
			for _, o := range overrides {
				if o.Contains(ip) {
					return false
				}
			}
			return true
		}
	}
	return false
}

// inIntervalSet evaluates an nftables (rbtree) interval set the way the
// kernel does: an address matches when the greatest element at or below it
// exists and is not an interval end. It also checks the element list is
// well formed: strictly increasing keys, starts and ends alternating.
func inIntervalSet(t *testing.T, elems []nftables.SetElement, ip netip.Addr) bool {
	t.Helper()
	key := ipKey(ip)
	var match *nftables.SetElement
	for i := range elems {
		e := &elems[i]
		if i > 0 {
			if bytes.Compare(elems[i-1].Key, e.Key) >= 0 {
				t.Fatalf("element keys not increasing at %d: %v then %v", i, elems[i-1].Key, e.Key)
			}
			if elems[i-1].IntervalEnd == e.IntervalEnd {
				t.Fatalf("elements %d and %d do not alternate start/end", i-1, i)
			}
		} else if e.IntervalEnd {
			t.Fatalf("first element is an interval end")
		}
		if bytes.Compare(e.Key, key) <= 0 {
			match = e
		}
	}
	return match != nil && !match.IntervalEnd
}

// boundaries returns first, last, first-1 and last+1 of every prefix.
func boundaries(ps []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, p := range ps {
		r := netpolicy.PrefixRange(p)
		out = append(out, r.First, r.Last)
		if prev := r.First.Prev(); prev.IsValid() {
			out = append(out, prev)
		}
		if next := r.Last.Next(); next.IsValid() {
			out = append(out, next)
		}
	}
	return out
}

// u32ToAddr is the address of a 32-bit number.
func u32ToAddr(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// TestGuardAgreesWithDropSet proves IsPublicUnicast, Blocked() and the
// elements of the nftables drop set agree with the definition at every
// range boundary (and on random addresses), with and without overrides.
func TestGuardAgreesWithDropSet(t *testing.T) {
	cases := []struct {
		name      string
		pool      netip.Prefix
		overrides []netip.Prefix
	}{
		{"no pool, no overrides", netip.Prefix{}, nil},
		{"default pool", pool16, nil},
		{"test world override", pool16, []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}},
		{"overrides cutting ranges", pool16, []netip.Prefix{
			netip.MustParsePrefix("10.99.0.0/16"), netip.MustParsePrefix("0.0.0.0/8"),
			netip.MustParsePrefix("240.0.0.0/5"), netip.MustParsePrefix("255.255.255.255/32"),
			netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("169.254.169.254/32"),
		}},
		{"pool outside the table", netip.MustParsePrefix("100.64.0.0/16"), []netip.Prefix{netip.MustParsePrefix("100.65.0.0/16")}},
		{"public pool", netip.MustParsePrefix("44.0.0.0/16"), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := netpolicy.NewGuard(c.pool, c.overrides)
			if err != nil {
				t.Fatal(err)
			}
			elems := blockedElements(g)
			blocked := g.Blocked()
			var edges []netip.Prefix
			for _, r := range netpolicy.SpecialPurpose {
				edges = append(edges, r.Prefix)
			}
			edges = append(edges, c.overrides...)
			edges = append(edges, blocked...)
			if c.pool.IsValid() {
				edges = append(edges, c.pool)
			}
			points := boundaries(edges)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := 0; i < 20000; i++ {
				points = append(points, u32ToAddr(rng.Uint32()))
			}
			for _, ip := range points {
				want := oracle(ip, c.pool, c.overrides)
				if got := !g.IsPublicUnicast(ip); got != want {
					t.Errorf("%s: guard blocked=%v, definition %v", ip, got, want)
				}
				if got := inIntervalSet(t, elems, ip); got != want {
					t.Errorf("%s: nft drop set blocked=%v, definition %v", ip, got, want)
				}
				if got := slices.ContainsFunc(blocked, func(p netip.Prefix) bool { return p.Contains(ip) }); got != want {
					t.Errorf("%s: Blocked() blocked=%v, definition %v", ip, got, want)
				}
				if c.pool == (netip.Prefix{}) && c.overrides == nil && netpolicy.IsPublicUnicast(ip) == want {
					t.Errorf("%s: package IsPublicUnicast disagrees", ip)
				}
			}
			for i := 1; i < len(blocked); i++ {
				if blocked[i-1].Overlaps(blocked[i]) || blocked[i-1].Addr().Compare(blocked[i].Addr()) >= 0 {
					t.Errorf("Blocked() not disjoint and sorted at %s, %s", blocked[i-1], blocked[i])
				}
			}
		})
	}
}

// TestBlockedElementsEnd: the last blocked interval runs to
// 255.255.255.255, so no end element follows it.
func TestBlockedElementsEnd(t *testing.T) {
	g, err := netpolicy.NewGuard(pool16, []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")})
	if err != nil {
		t.Fatal(err)
	}
	elems := blockedElements(g)
	if last := elems[len(elems)-1]; last.IntervalEnd || !bytes.Equal(last.Key, []byte{224, 0, 0, 0}) {
		t.Errorf("last element = %+v, want an open start at 224.0.0.0", last)
	}
}
