package netpolicy

import (
	"fmt"
	"net/netip"
	"strings"
)

// entry6Grammar is what error messages say an IPv6 entry may look like.
const entry6Grammar = "want an IPv6 address, an IPv6 CIDR such as 2001:db8::/64, or [ADDRESS]:PORT, optionally followed by /tcp or /udp"

// looksLikeIPv6 reports whether an entry is written as an IPv6 literal.
func looksLikeIPv6(s string) bool {
	return strings.ContainsAny(s, "[]") || strings.Count(s, ":") >= 2
}

// parseEntry6 parses the IPv6 forms of an entry, for a dual-stack guard:
//
//	ADDR | ADDR/N | [ADDR] | [ADDR]:PORT | [ADDR]:PORT/tcp|udp
//
// A port needs the brackets (an address of eight groups would read as one
// with a port otherwise). The address or CIDR must be public by g's IPv6
// table; a zone (%eth0) or an IPv4-mapped address is refused.
func parseEntry6(s string, g *Guard) (Entry, error) {
	if g.v6 == nil {
		return Entry{}, fmt.Errorf("IPv6 is not supported")
	}
	var e Entry
	host := s
	if strings.HasPrefix(s, "[") {
		h, rest, ok := strings.Cut(s[1:], "]")
		if !ok || strings.Contains(h, "/") {
			return Entry{}, fmt.Errorf("unbalanced or misplaced brackets; %s", entry6Grammar)
		}
		host = h
		if rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return Entry{}, fmt.Errorf("%q after the brackets; %s", rest, entry6Grammar)
			}
			ps, err := parsePortProto(rest[1:])
			if err != nil {
				return Entry{}, err
			}
			e.PortSpec = ps
		}
	} else if strings.ContainsAny(s, "[]") {
		return Entry{}, fmt.Errorf("unbalanced or misplaced brackets; %s", entry6Grammar)
	}
	p, err := parseCIDR6(host, g)
	if err != nil {
		return Entry{}, err
	}
	e.Kind, e.Prefix = KindCIDR, p
	return e, nil
}

// parseCIDR6 parses an IPv6 address (as a /128) or CIDR and applies the
// dual-stack guard.
func parseCIDR6(s string, g *Guard) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil || !p.Addr().Is6() || p.Addr().Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("invalid IPv6 CIDR %q; want ADDRESS/N with N from 0 to 128", s)
		}
		if p != p.Masked() {
			return netip.Prefix{}, fmt.Errorf("host bits set in %s; did you mean %s?", p, p.Masked())
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("invalid IPv6 address %q; %s", s, entry6Grammar)
		}
		p = netip.PrefixFrom(a, 128)
	}
	if r, bad := g.overlapping6(p); bad {
		return netip.Prefix{}, specialPurposeError(p, r, "IPv6")
	}
	return p, nil
}

// overlapping6 returns a blocked range overlapping the IPv6 prefix p: the
// most specific row (or the pool6) holding its first blocked address.
func (g *Guard) overlapping6(p netip.Prefix) (Range, bool) {
	if g.v6 == nil {
		return Range{}, true
	}
	iv := prefixInterval6(p)
	for _, b := range g.v6.blocked {
		if b.first.Compare(iv.last) <= 0 && iv.first.Compare(b.last) <= 0 {
			first := iv.first
			if first.Less(b.first) {
				first = b.first
			}
			r, _ := g.blockedBy6(first)
			return r, true
		}
	}
	return Range{}, false
}

// cidrHost is an entry's address or CIDR as written before a port:
// bracketed for IPv6 when a port follows.
func cidrHost(p netip.Prefix, withPort bool) string {
	host := p.String()
	if p.IsSingleIP() {
		host = p.Addr().String()
		if p.Addr().Is6() && withPort {
			host = "[" + host + "]"
		}
	}
	return host
}
