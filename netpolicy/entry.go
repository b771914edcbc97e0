package netpolicy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// entryGrammar is what error messages say an entry may look like.
const entryGrammar = "want HOST, *.HOST, **.HOST, A.B.C.D or A.B.C.D/N, optionally followed by :PORT or :PORT/tcp or :PORT/udp"

// ParseEntry parses one allow entry:
//
//	HOST | *.HOST | **.HOST | A.B.C.D | A.B.C.D/N   optionally :PORT   optionally /tcp|/udp after the port
//
// Names are normalised by NormalizeName. Addresses and CIDRs must be public
// according to g (nil means DefaultGuard: no overrides, no pool). Surrounding
// white space is ignored. Errors are one line: `allow entry "X": reason`.
func ParseEntry(s string, g *Guard) (Entry, error) {
	e, err := parseEntry(strings.TrimSpace(s), g)
	if err != nil {
		return Entry{}, fmt.Errorf("allow entry %q: %w", s, err)
	}
	return e, nil
}

// ParseDeny parses a deny entry on a daemon judged by g: the grammar of
// ParseEntry, except that an address or CIDR may be any IPv4 range
// (denying a special-purpose range is redundant, never unsafe) and a name
// takes no port: a name is denied at the resolver, which knows no ports
// (deny its addresses with a port instead). When g is dual-stack
// (DualStack) an IPv6 address or CIDR may be denied too, any range, and
// on every port (the v6 table's denied6 has no ports: such an entry with a
// port is refused rather than widened). Errors are one line:
// `deny entry "X": reason`.
func (g *Guard) ParseDeny(s string) (Entry, error) {
	if g == nil || g.v6 == nil {
		return parseDeny(s, anyRange)
	}
	return parseDeny(s, anyRange6)
}

func parseDeny(s string, any *Guard) (Entry, error) {
	e, err := parseEntry(strings.TrimSpace(s), any)
	switch {
	case err != nil:
	case e.Kind == KindCIDR && e.Prefix.Addr().Is4In6():
		err = fmt.Errorf("%s is IPv4-mapped, never on the wire; want the IPv4 address or CIDR", e.Prefix)
	case e.Kind != KindCIDR && e.Port != 0:
		err = fmt.Errorf("a name is denied on every port (the resolver knows no ports); want %s, or deny an address or CIDR with a port", e.Name)
	case e.Kind == KindCIDR && e.Prefix.Addr().Is6() && e.Port != 0:
		err = fmt.Errorf("an IPv6 address or CIDR is denied on every port; want %s without the port", cidrHost(e.Prefix, false))
	}
	if err != nil {
		return Entry{}, fmt.Errorf("deny entry %q: %w", s, err)
	}
	return e, nil
}

// anyRange is the guard of deny entries: it blocks nothing, so no range is
// refused. anyRange6 is a dual-stack daemon's: it blocks no IPv6 range
// either.
var (
	anyRange  = &Guard{}
	anyRange6 = &Guard{v6: &guard6{}}
)

// MustParseEntry is ParseEntry with the default guard for constants in tests
// and examples: it panics on error, so it must never see user input.
func MustParseEntry(s string) Entry {
	e, err := ParseEntry(s, nil)
	if err != nil {
		panic(err)
	}
	return e
}

func parseEntry(s string, g *Guard) (Entry, error) {
	if g == nil {
		g = defaultGuard
	}
	if s == "" {
		return Entry{}, fmt.Errorf("empty; %s", entryGrammar)
	}
	if strings.Contains(s, "://") {
		return Entry{}, fmt.Errorf("a URL is not an allow entry; want its host, or list the URL as a scope")
	}
	if looksLikeIPv6(s) {
		return parseEntry6(s, g)
	}
	var e Entry
	host := s
	if h, portStr, ok := strings.Cut(s, ":"); ok {
		host = h
		ps, err := parsePortProto(portStr)
		if err != nil {
			return Entry{}, err
		}
		e.PortSpec = ps
	} else if i := strings.LastIndexByte(s, '/'); i >= 0 {
		if p := strings.ToLower(s[i+1:]); p == string(ProtoTCP) || p == string(ProtoUDP) {
			return Entry{}, fmt.Errorf("protocol %q needs a port, as in HOST:PORT/%s", p, p)
		}
	}
	if host == "" {
		return Entry{}, fmt.Errorf("empty host; %s", entryGrammar)
	}
	if looksLikeIPv4(host) {
		p, err := parseCIDR(host, g)
		if err != nil {
			return Entry{}, err
		}
		e.Kind, e.Prefix = KindCIDR, p
		return e, nil
	}
	kind, rest := KindHost, host
	switch {
	case strings.HasPrefix(host, "**."):
		kind, rest = KindMultiWildcard, host[3:]
	case strings.HasPrefix(host, "*."):
		kind, rest = KindWildcard, host[2:]
	case host == "*" || host == "**":
		return Entry{}, errWildcardLabels
	}
	if strings.Contains(rest, "*") {
		return Entry{}, fmt.Errorf(`wildcard "*" is only allowed as the whole leftmost label, as in *.example.com or **.example.com`)
	}
	if kind != KindHost && strings.TrimSuffix(rest, ".") == "" {
		return Entry{}, errWildcardLabels
	}
	name, err := NormalizeName(rest)
	if err != nil {
		return Entry{}, err
	}
	if kind != KindHost && !strings.Contains(name, ".") {
		return Entry{}, errWildcardLabels
	}
	e.Kind, e.Name = kind, name
	return e, nil
}

var errWildcardLabels = fmt.Errorf("a wildcard needs at least two labels after it, as in *.example.com")

// parsePortProto parses "PORT" or "PORT/PROTO".
func parsePortProto(s string) (PortSpec, error) {
	portStr, protoStr, hasProto := strings.Cut(s, "/")
	if portStr == "" {
		return PortSpec{}, fmt.Errorf("empty port; want a number from 1 to 65535")
	}
	n, err := strconv.ParseUint(portStr, 10, 64)
	if err != nil {
		if strings.Trim(portStr, "0123456789") == "" {
			return PortSpec{}, fmt.Errorf("port %s is out of range; want 1 to 65535", portStr)
		}
		return PortSpec{}, fmt.Errorf("port %q is not a number; want 1 to 65535", portStr)
	}
	if n == 0 || n > 65535 {
		return PortSpec{}, fmt.Errorf("port %d is out of range; want 1 to 65535", n)
	}
	ps := PortSpec{Port: uint16(n)}
	if hasProto {
		if protoStr == "" {
			return PortSpec{}, fmt.Errorf("empty protocol after the port; want tcp or udp")
		}
		switch p := Proto(strings.ToLower(protoStr)); p {
		case ProtoTCP, ProtoUDP:
			ps.Proto = p
		default:
			return PortSpec{}, fmt.Errorf("unknown protocol %q; want tcp or udp", protoStr)
		}
	}
	return ps, nil
}

// looksLikeIPv4 is true for strings made only of digits, dots and at most a
// "/N" suffix: they are addresses or mistakes, never host names (a top-level
// label is never all-numeric).
func looksLikeIPv4(s string) bool {
	return strings.Trim(s, "0123456789./") == ""
}

// parseCIDR parses an IPv4 address (as a /32) or a CIDR and applies the guard.
func parseCIDR(s string, g *Guard) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil || !p.Addr().Is4() {
			return netip.Prefix{}, fmt.Errorf("invalid IPv4 CIDR %q; want A.B.C.D/N with N from 0 to 32", s)
		}
		if p != p.Masked() {
			return netip.Prefix{}, fmt.Errorf("host bits set in %s; did you mean %s?", p, p.Masked())
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return netip.Prefix{}, fmt.Errorf("invalid IPv4 address %q; want A.B.C.D", s)
		}
		p = netip.PrefixFrom(a, 32)
	}
	if r, bad := g.overlapping(p); bad {
		return netip.Prefix{}, specialPurposeError(p, r, "IPv4")
	}
	return p, nil
}

// specialPurposeError says that p, an entry's address or CIDR, meets the
// special-purpose range r.
func specialPurposeError(p netip.Prefix, r Range, family string) error {
	what := p.String()
	if p.IsSingleIP() {
		what = p.Addr().String()
	}
	verb := "overlaps"
	if r.Prefix.Bits() <= p.Bits() && r.Prefix.Contains(p.Addr()) {
		verb = "is inside"
	}
	return fmt.Errorf("%s %s special-purpose range %s; only public unicast %s is accepted", what, verb, r, family)
}

// String returns the canonical text of the entry, which ParseEntry accepts
// and maps back to the same Entry.
func (e Entry) String() string {
	var host string
	switch e.Kind {
	case KindHost:
		host = e.Name
	case KindWildcard:
		host = "*." + e.Name
	case KindMultiWildcard:
		host = "**." + e.Name
	case KindCIDR:
		host = cidrHost(e.Prefix, e.Port != 0)
	}
	return host + e.PortSpec.String()
}

// MarshalText implements encoding.TextMarshaler with the canonical text.
func (e Entry) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// MatchesName is the reference semantics of name matching (the DNS proxy keeps
// its own index and cross-checks against this). name is in presentation
// format, as a DNS library prints a wire name: '\.' is a dot inside a label,
// '\DDD' a byte, '\X' the character X; one trailing dot is allowed. Labels
// are compared as wire bytes, ASCII letters case-insensitively and nothing
// else (RFC 4343), so "www\.miek.nl" is the two labels "www.miek" and "nl",
// and the KELVIN SIGN is not a "k". Internationalised names must already be
// in punycode. CIDR entries match no name.
func (e Entry) MatchesName(name string) bool {
	if e.Kind == KindCIDR {
		return false
	}
	labels, ok := wireLabels(name)
	if !ok {
		return false
	}
	want := strings.Split(e.Name, ".")
	extra := len(labels) - len(want)
	switch {
	case e.Kind == KindHost && extra != 0,
		e.Kind == KindWildcard && extra != 1,
		e.Kind == KindMultiWildcard && extra < 1,
		extra < 0:
		return false
	}
	for i, w := range want {
		if labels[extra+i] != w {
			return false
		}
	}
	return true
}

// wireLabels splits a presentation-format name into its labels as wire
// bytes, ASCII lower-cased. It fails on an empty label, a dangling '\' or a
// '\DDD' above 255.
func wireLabels(name string) ([]string, bool) {
	if name == "" || name == "." {
		return nil, false
	}
	var labels []string
	var cur []byte
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '.':
			if len(cur) == 0 {
				return nil, false
			}
			labels = append(labels, string(cur))
			cur = cur[:0]
			continue
		case c == '\\':
			if i+1 >= len(name) {
				return nil, false
			}
			if i+3 < len(name) && isDigit(name[i+1]) && isDigit(name[i+2]) && isDigit(name[i+3]) {
				v := int(name[i+1]-'0')*100 + int(name[i+2]-'0')*10 + int(name[i+3]-'0')
				if v > 255 {
					return nil, false
				}
				c = byte(v)
				i += 3
			} else {
				c = name[i+1]
				i++
			}
		}
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		cur = append(cur, c)
	}
	if len(cur) > 0 {
		labels = append(labels, string(cur))
	}
	return labels, true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
