package netpolicy

import (
	"fmt"
	"net/netip"
	"sort"
)

// Range is one IPv4 special-purpose block with the name used in messages.
type Range struct {
	Prefix netip.Prefix
	Name   string
}

// SpecialPurpose is the single source of truth for "not public unicast": the
// IPv4 blocks of the IANA special-purpose registry (RFC 6890 and successors)
// plus multicast and the reserved class E space (which includes
// 255.255.255.255), and the cloud host endpoints that sit in public space
// but, like the metadata address, serve the host rather than the internet.
// IsPublicUnicast, entry validation, answer filtering and the nftables drop
// set are all generated from this table.
var SpecialPurpose = []Range{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private-use"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared-address-space"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	// Azure's platform endpoint (WireServer: DHCP, DNS, health probes and the
	// guest agent's certificates) answers any VM that reaches it; it is
	// public unicast in the IANA registry, so it is listed here by hand.
	{netip.MustParsePrefix("168.63.129.16/32"), "cloud-host-endpoint"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private-use"},
	{netip.MustParsePrefix("192.0.0.0/24"), "ietf-protocol-assignments"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation"},
	{netip.MustParsePrefix("192.88.99.0/24"), "6to4-relay-anycast"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private-use"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
}

// poolRangeName names the daemon's session pool in messages.
const poolRangeName = "session pool"

// interval is a closed range of IPv4 addresses as host-order integers.
type interval struct {
	first, last uint32
}

// namedInterval is a blocked interval with the range it came from, so that
// errors can name "10.0.0.0/8 (private-use)" even after overrides cut it.
type namedInterval struct {
	interval
	source Range
}

// Guard decides which IPv4 destinations a session may ever reach. It is
// immutable after NewGuard and safe for concurrent use.
//
// Invariants: blocked is sorted by first address, its intervals are disjoint,
// and it covers exactly (SpecialPurpose minus overrides) plus the pool.
type Guard struct {
	pool      netip.Prefix
	overrides []netip.Prefix
	blocked   []namedInterval
	v6        *guard6 // nil: IPv4-only, every IPv6 address blocked (see DualStack)
}

// defaultGuard has no overrides and no pool; it backs the package-level
// IsPublicUnicast and ParseEntry with a nil guard.
var defaultGuard = &Guard{blocked: computeBlocked(netip.Prefix{}, nil)}

// DefaultGuard returns the guard with no pool and no overrides.
func DefaultGuard() *Guard { return defaultGuard }

// NewGuard builds the guard for a daemon whose session pool is pool and which
// treats publicOverrides as public. An override must be one of the
// special-purpose ranges or lie inside one, and must not overlap the pool (the
// pool is never public). A zero pool means "no pool" (tests and tools only).
func NewGuard(pool netip.Prefix, publicOverrides []netip.Prefix) (*Guard, error) {
	g := &Guard{}
	if pool.IsValid() {
		if !pool.Addr().Is4() {
			return nil, fmt.Errorf("session pool %s: IPv6 is not supported", pool)
		}
		if pool != pool.Masked() {
			return nil, fmt.Errorf("session pool %s: host bits set; did you mean %s?", pool, pool.Masked())
		}
		g.pool = pool
	}
	for _, o := range publicOverrides {
		if !o.IsValid() {
			return nil, fmt.Errorf("public override: invalid prefix")
		}
		if !o.Addr().Is4() {
			return nil, fmt.Errorf("public override %s: IPv6 is not supported", o)
		}
		if o != o.Masked() {
			return nil, fmt.Errorf("public override %s: host bits set; did you mean %s?", o, o.Masked())
		}
		if !insideSpecial(o) {
			return nil, fmt.Errorf("public override %s: not inside a special-purpose range; only special-purpose ranges can be treated as public", o)
		}
		if g.pool.IsValid() && o.Overlaps(g.pool) {
			return nil, fmt.Errorf("public override %s: overlaps the session pool %s, which is never public", o, g.pool)
		}
		g.overrides = append(g.overrides, o)
	}
	g.blocked = computeBlocked(g.pool, g.overrides)
	return g, nil
}

func insideSpecial(p netip.Prefix) bool {
	for _, r := range SpecialPurpose {
		if r.Prefix.Bits() <= p.Bits() && r.Prefix.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// computeBlocked subtracts the overrides from every special range, adds the
// pool, and returns disjoint sorted intervals. Overlaps between table entries
// and the pool are resolved in favour of the earlier source.
func computeBlocked(pool netip.Prefix, overrides []netip.Prefix) []namedInterval {
	var out []namedInterval
	for _, r := range SpecialPurpose {
		pieces := []interval{toInterval(r.Prefix)}
		for _, o := range overrides {
			pieces = subtract(pieces, toInterval(o))
		}
		for _, p := range pieces {
			out = append(out, namedInterval{p, r})
		}
	}
	if pool.IsValid() {
		pieces := []interval{toInterval(pool)}
		for _, n := range out {
			pieces = subtract(pieces, n.interval)
		}
		for _, p := range pieces {
			out = append(out, namedInterval{p, Range{pool, poolRangeName}})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].first < out[j].first })
	return out
}

// subtract removes cut from every interval in in.
func subtract(in []interval, cut interval) []interval {
	var out []interval
	for _, iv := range in {
		if cut.last < iv.first || cut.first > iv.last {
			out = append(out, iv)
			continue
		}
		if cut.first > iv.first {
			out = append(out, interval{iv.first, cut.first - 1})
		}
		if cut.last < iv.last {
			out = append(out, interval{cut.last + 1, iv.last})
		}
	}
	return out
}

func toInterval(p netip.Prefix) interval {
	p = p.Masked()
	first := addrToU32(p.Addr())
	size := uint64(1) << (32 - p.Bits())
	return interval{first, uint32(uint64(first) + size - 1)}
}

func addrToU32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func u32ToAddr(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// IsPublicUnicast reports whether ip is a public unicast IPv4 address for a
// daemon with no public overrides. IPv4-mapped IPv6 addresses are unmapped
// first; every other IPv6 address is not public (IPv6 is not supported).
func IsPublicUnicast(ip netip.Addr) bool {
	return defaultGuard.IsPublicUnicast(ip)
}

// IsPublicUnicast reports whether a session may ever reach ip: it is IPv4
// (after unmapping) and lies in no blocked interval.
func (g *Guard) IsPublicUnicast(ip netip.Addr) bool {
	_, blocked := g.blockedBy(ip)
	return !blocked
}

// blockedBy returns the range that blocks ip. IPv6 addresses are judged by
// the dual-stack half (see DualStack); without it they are blocked with a
// zero Range.
func (g *Guard) blockedBy(ip netip.Addr) (Range, bool) {
	ip = ip.Unmap()
	if ip.Is6() {
		return g.blockedBy6(ip)
	}
	if !ip.Is4() {
		return Range{}, true
	}
	v := addrToU32(ip)
	i := sort.Search(len(g.blocked), func(i int) bool { return g.blocked[i].last >= v })
	if i < len(g.blocked) && g.blocked[i].first <= v {
		return g.blocked[i].source, true
	}
	return Range{}, false
}

// overlapping returns the first blocked range that overlaps p.
func (g *Guard) overlapping(p netip.Prefix) (Range, bool) {
	iv := toInterval(p)
	for _, b := range g.blocked {
		if b.first <= iv.last && iv.first <= b.last {
			return b.source, true
		}
	}
	return Range{}, false
}

// Pool returns the session pool the guard was built with (zero if none).
func (g *Guard) Pool() netip.Prefix { return g.pool }

// Overrides returns a copy of the public overrides.
func (g *Guard) Overrides() []netip.Prefix { return append([]netip.Prefix(nil), g.overrides...) }

// Blocked returns the blocked address space (special-purpose ranges minus the
// public overrides, plus the pool) as disjoint prefixes sorted by address.
func (g *Guard) Blocked() []netip.Prefix {
	var out []netip.Prefix
	for _, iv := range g.mergedBlocked() {
		out = append(out, intervalPrefixes(iv)...)
	}
	return out
}

// mergedBlocked returns the blocked intervals with adjacent ones joined, the
// shape an nftables interval set needs (224/4 and 240/4 become one interval).
// AddrRange is an inclusive range of IPv4 addresses.
type AddrRange struct{ First, Last netip.Addr }

// BlockedRanges is the blocked ranges merged (overlapping and adjacent ones
// joined), in address order: what the table's interval set of blocked
// destinations holds.
func (g *Guard) BlockedRanges() []AddrRange {
	var out []AddrRange
	for _, iv := range g.mergedBlocked() {
		out = append(out, AddrRange{u32ToAddr(iv.first), u32ToAddr(iv.last)})
	}
	return out
}

// PrefixRange is the first and last address of p (masked).
func PrefixRange(p netip.Prefix) AddrRange {
	iv := toInterval(p)
	return AddrRange{u32ToAddr(iv.first), u32ToAddr(iv.last)}
}

func (g *Guard) mergedBlocked() []interval {
	var out []interval
	for _, b := range g.blocked {
		if n := len(out); n > 0 && out[n-1].last != ^uint32(0) && out[n-1].last+1 >= b.first {
			if b.last > out[n-1].last {
				out[n-1].last = b.last
			}
			continue
		}
		out = append(out, b.interval)
	}
	return out
}

// intervalPrefixes splits a closed interval into the minimal list of CIDR
// prefixes covering exactly it.
func intervalPrefixes(iv interval) []netip.Prefix {
	var out []netip.Prefix
	cur := uint64(iv.first)
	end := uint64(iv.last)
	for cur <= end {
		bits := 32
		// Grow the block while it stays aligned and inside the interval.
		for bits > 0 {
			size := uint64(1) << (32 - (bits - 1))
			if cur%size != 0 || cur+size-1 > end {
				break
			}
			bits--
		}
		out = append(out, netip.PrefixFrom(u32ToAddr(uint32(cur)), bits))
		cur += uint64(1) << (32 - bits)
	}
	return out
}

func (r Range) String() string { return fmt.Sprintf("%s (%s)", r.Prefix, r.Name) }

// BlockedBy returns the special-purpose range (or the session pool) that
// blocks ip, if any: what a drop of reason special-purpose names.
func (g *Guard) BlockedBy(ip netip.Addr) (Range, bool) {
	if r, ok := g.blockedBy(ip); ok && r.Prefix.IsValid() {
		return r, true
	}
	return Range{}, false
}
