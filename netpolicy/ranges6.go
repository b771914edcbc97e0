package netpolicy

import (
	"fmt"
	"net/netip"
	"sort"
)

// SpecialPurpose6 is the IPv6 twin of SpecialPurpose: the blocks of the
// IANA IPv6 special-purpose address registry (RFC 6890 and successors) a
// session may never reach, and everything outside global unicast
// (2000::/3: the registry's unallocated space, ULA, link-local, multicast).
// A dual-stack guard's answer filtering, entry validation and the table's
// v6 drop set are all generated from it.
//
// Choices, each tested row by row (TestGuard6Registry):
//   - ::ffff:0:0/96 (IPv4-mapped) is refused outright: a mapped address
//     never goes on the wire as such, and judging it by its v4 address
//     would give a second way to name a v4 destination.
//   - 64:ff9b::/96 and 64:ff9b:1::/48 (NAT64) are refused: a translator
//     reaches the embedded v4 address behind the v4 table's back, and the
//     daemon runs none; a dual-stack session reaches v4 over v4.
//   - 2001::/23 (IETF protocol assignments) is refused as a whole: Teredo,
//     benchmarking, ORCHID and the anycast service addresses inside it are
//     named by their own rows; the few globally reachable ones (AMT, AS112)
//     are not worth a hole.
var SpecialPurpose6 = []Range{
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("::ffff:0:0/96"), "ipv4-mapped"},
	{netip.MustParsePrefix("64:ff9b::/96"), "nat64"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "nat64-local-use"},
	{netip.MustParsePrefix("100::/64"), "discard-only"},
	{netip.MustParsePrefix("2001::/23"), "ietf-protocol-assignments"},
	{netip.MustParsePrefix("2001::/32"), "teredo"},
	{netip.MustParsePrefix("2001:2::/48"), "benchmarking"},
	{netip.MustParsePrefix("2001:10::/28"), "orchid"},
	{netip.MustParsePrefix("2001:20::/28"), "orchid-v2"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("2002::/16"), "6to4"},
	{netip.MustParsePrefix("3fff::/20"), "documentation"},
	{netip.MustParsePrefix("5f00::/16"), "srv6-sids"},
	{netip.MustParsePrefix("fc00::/7"), "unique-local"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	// Outside 2000::/3, the global unicast space.
	{netip.MustParsePrefix("::/3"), "not-global-unicast"},
	{netip.MustParsePrefix("4000::/2"), "not-global-unicast"},
	{netip.MustParsePrefix("8000::/1"), "not-global-unicast"},
}

// interval6 is a closed range of IPv6 addresses.
type interval6 struct{ first, last netip.Addr }

// prefixInterval6 is the first and last address of p.
func prefixInterval6(p netip.Prefix) interval6 {
	p = p.Masked()
	b := p.Addr().As16()
	for i := p.Bits(); i < 128; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	return interval6{p.Addr(), netip.AddrFrom16(b)}
}

// subtract6 removes cut from every interval of in.
func subtract6(in []interval6, cut interval6) []interval6 {
	var out []interval6
	for _, iv := range in {
		if cut.last.Less(iv.first) || iv.last.Less(cut.first) {
			out = append(out, iv)
			continue
		}
		if iv.first.Less(cut.first) {
			out = append(out, interval6{iv.first, cut.first.Prev()})
		}
		if cut.last.Less(iv.last) {
			out = append(out, interval6{cut.last.Next(), iv.last})
		}
	}
	return out
}

// guard6 is the IPv6 half of a dual-stack Guard.
type guard6 struct {
	pool      netip.Prefix
	overrides []netip.Prefix
	blocked   []interval6 // (SpecialPurpose6 minus overrides) plus pool, merged, sorted
}

// DualStack returns a copy of g that also judges IPv6 destinations, for a
// daemon whose IPv6 session pool is pool6 and which treats overrides6 as
// public (each inside a row of SpecialPurpose6, none overlapping pool6).
// A guard without it refuses every IPv6 address, as it always did.
func (g *Guard) DualStack(pool6 netip.Prefix, overrides6 []netip.Prefix) (*Guard, error) {
	if !pool6.IsValid() || !pool6.Addr().Is6() || pool6.Addr().Is4In6() || pool6 != pool6.Masked() {
		return nil, fmt.Errorf("session pool6 %s: want a masked IPv6 prefix", pool6)
	}
	g6 := &guard6{pool: pool6}
	for _, o := range overrides6 {
		if !o.IsValid() || !o.Addr().Is6() || o.Addr().Is4In6() {
			return nil, fmt.Errorf("public override %s: want an IPv6 prefix", o)
		}
		if o != o.Masked() {
			return nil, fmt.Errorf("public override %s: host bits set; did you mean %s?", o, o.Masked())
		}
		if _, ok := special6Containing(o); !ok {
			return nil, fmt.Errorf("public override %s: not inside a special-purpose range; only special-purpose ranges can be treated as public", o)
		}
		if o.Overlaps(pool6) {
			return nil, fmt.Errorf("public override %s: overlaps the session pool6 %s, which is never public", o, pool6)
		}
		g6.overrides = append(g6.overrides, o)
	}
	var ivs []interval6
	for _, r := range SpecialPurpose6 {
		pieces := []interval6{prefixInterval6(r.Prefix)}
		for _, o := range g6.overrides {
			pieces = subtract6(pieces, prefixInterval6(o))
		}
		ivs = append(ivs, pieces...)
	}
	ivs = append(ivs, prefixInterval6(pool6))
	sort.Slice(ivs, func(i, j int) bool { return ivs[i].first.Less(ivs[j].first) })
	for _, iv := range ivs {
		if n := len(g6.blocked); n > 0 {
			last := &g6.blocked[n-1]
			if !last.last.Next().IsValid() || !last.last.Next().Less(iv.first) {
				if last.last.Less(iv.last) {
					last.last = iv.last
				}
				continue
			}
		}
		g6.blocked = append(g6.blocked, iv)
	}
	c := *g
	c.v6 = g6
	return &c, nil
}

// special6Containing returns the most specific row of SpecialPurpose6
// holding all of p.
func special6Containing(p netip.Prefix) (Range, bool) {
	var best Range
	for _, r := range SpecialPurpose6 {
		if r.Prefix.Bits() <= p.Bits() && r.Prefix.Contains(p.Addr()) && (!best.Prefix.IsValid() || r.Prefix.Bits() > best.Prefix.Bits()) {
			best = r
		}
	}
	return best, best.Prefix.IsValid()
}

// Pool6 returns the IPv6 session pool of a dual-stack guard (zero if none).
func (g *Guard) Pool6() netip.Prefix {
	if g.v6 == nil {
		return netip.Prefix{}
	}
	return g.v6.pool
}

// blockedBy6 returns the range that blocks the IPv6 address ip (not a
// mapped one). A guard that is not dual-stack blocks every IPv6 address
// with a zero Range.
func (g *Guard) blockedBy6(ip netip.Addr) (Range, bool) {
	if g.v6 == nil {
		return Range{}, true
	}
	i := sort.Search(len(g.v6.blocked), func(i int) bool { return !g.v6.blocked[i].last.Less(ip) })
	if i == len(g.v6.blocked) || ip.Less(g.v6.blocked[i].first) {
		return Range{}, false
	}
	if g.v6.pool.Contains(ip) {
		return Range{g.v6.pool, poolRangeName}, true
	}
	r, _ := special6Containing(netip.PrefixFrom(ip, 128))
	return r, true
}

// IsPublicUnicast6 reports whether a session of a dual-stack daemon may
// ever reach the IPv6 address ip. An IPv4-mapped address is not unmapped:
// it is refused (see SpecialPurpose6), as is an IPv4 address.
func (g *Guard) IsPublicUnicast6(ip netip.Addr) bool {
	if !ip.Is6() {
		return false
	}
	_, blocked := g.blockedBy6(ip)
	return !blocked
}

// BlockedBy6 returns the row of SpecialPurpose6 (or the pool6) that blocks
// the IPv6 address ip, if any.
func (g *Guard) BlockedBy6(ip netip.Addr) (Range, bool) {
	if r, ok := g.blockedBy6(ip); ok && r.Prefix.IsValid() {
		return r, true
	}
	return Range{}, false
}

// BlockedRanges6 is the blocked IPv6 space of a dual-stack guard, merged,
// in address order: what the table's v6 interval set of blocked
// destinations holds. Nil for a guard that is not dual-stack.
func (g *Guard) BlockedRanges6() []AddrRange {
	if g.v6 == nil {
		return nil
	}
	out := make([]AddrRange, len(g.v6.blocked))
	for i, iv := range g.v6.blocked {
		out[i] = AddrRange{iv.first, iv.last}
	}
	return out
}

// NewDualStackGuard is NewGuard for a daemon whose IPv6 session pool is
// pool6: the IPv6 public overrides go to the guard's v6 half (DualStack).
// Without pool6 it is NewGuard with every override (an IPv6 one is then
// refused, as it always was).
func NewDualStackGuard(pool, pool6 netip.Prefix, publicOverrides []netip.Prefix) (*Guard, error) {
	if !pool6.IsValid() {
		return NewGuard(pool, publicOverrides)
	}
	var v4, v6 []netip.Prefix
	for _, o := range publicOverrides {
		if o.Addr().Is6() && !o.Addr().Is4In6() {
			v6 = append(v6, o)
		} else {
			v4 = append(v4, o)
		}
	}
	g, err := NewGuard(pool, v4)
	if err != nil {
		return nil, err
	}
	return g.DualStack(pool6, v6)
}
