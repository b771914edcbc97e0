package netpolicy

import (
	"cmp"
	"net/netip"
	"slices"
	"sort"
)

// Target is a static destination of a session: an IPv4 prefix, optionally
// constrained to one port. Port 0 means every port and every protocol (ICMP
// included), and then Proto is ProtoAny; with a port, ProtoAny means TCP and
// UDP.
type Target struct {
	Prefix netip.Prefix
	Port   uint16
	Proto  Proto
}

// StaticTargets returns the destinations of p that need no DNS attestation:
// its CIDR entries, plus every pinned address (name -> addresses resolved
// and fixed by the daemon at launch) of a name that one of p's name entries
// matches, with that entry's port constraint. Non-IPv4 pinned addresses are
// ignored. The result is sorted, deduplicated, and drops targets covered by
// another (1.2.3.4:443 next to 1.2.3.0/24); ModeNone has none.
func StaticTargets(p Policy, pinned map[string][]netip.Addr) []Target {
	if p.Egress == ModeNone {
		return nil
	}
	var out []Target
	names := make([]string, 0, len(pinned))
	for n := range pinned {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, e := range p.Allow {
		if e.Kind == KindCIDR {
			out = append(out, Target{Prefix: e.Prefix, Port: e.Port, Proto: e.Proto})
			continue
		}
		for _, n := range names {
			if !e.MatchesName(n) {
				continue
			}
			for _, a := range pinned[n] {
				if a = a.Unmap(); a.Is4() {
					out = append(out, Target{Prefix: netip.PrefixFrom(a, 32), Port: e.Port, Proto: e.Proto})
				}
			}
		}
	}
	return normalizeTargets(out)
}

// PinnedTargets returns the pinned addresses of p's name entries (with
// the entry's port), normalised: the part of StaticTargets a name
// admits, which the name check reads.
func PinnedTargets(p Policy, pinned map[string][]netip.Addr) []Target {
	var names Policy
	names.Egress = p.Egress
	for _, e := range p.Allow {
		if e.Kind != KindCIDR {
			names.Allow = append(names.Allow, e)
		}
	}
	return StaticTargets(names, pinned)
}

// DenyTargets returns the address and CIDR deny entries of p as targets,
// normalised like StaticTargets' (name entries are the DNS proxy's).
func DenyTargets(p Policy) []Target {
	if p.Egress == ModeNone {
		return nil
	}
	var out []Target
	for _, e := range p.Deny {
		if e.Kind == KindCIDR {
			out = append(out, Target{Prefix: e.Prefix, Port: e.Port, Proto: e.Proto})
		}
	}
	return normalizeTargets(out)
}

// covers reports whether every packet matching u also matches t.
func (t Target) covers(u Target) bool {
	if t.Prefix.Bits() > u.Prefix.Bits() || !t.Prefix.Contains(u.Prefix.Addr()) {
		return false
	}
	if t.Port == 0 {
		// A port-less target opens every port but the resolver ports
		// (53, 853: the resolver chain looks at port entries only), so
		// it does not cover an entry that names one of them.
		return !IsResolverPort(u.Port)
	}
	return t.Port == u.Port && (t.Proto == ProtoAny || t.Proto == u.Proto)
}

func compareTargets(a, b Target) int {
	return cmp.Or(
		a.Prefix.Addr().Compare(b.Prefix.Addr()),
		cmp.Compare(a.Prefix.Bits(), b.Prefix.Bits()),
		cmp.Compare(a.Port, b.Port),
		cmp.Compare(a.Proto, b.Proto),
	)
}

// normalizeTargets masks, sorts, dedups and drops covered targets. Because
// two prefixes are either disjoint or nested, what remains for any one
// (protocol, port) pair is a set of disjoint ranges, which the kernel's
// concatenated interval sets require.
func normalizeTargets(in []Target) []Target {
	ts := make([]Target, 0, len(in))
	for _, t := range in {
		if !t.Prefix.IsValid() || t.Prefix.Addr().Is4In6() { // IPv6 ones only come from a dual-stack guard's entries
			continue
		}
		t.Prefix = t.Prefix.Masked()
		if t.Port == 0 {
			t.Proto = ProtoAny
		}
		ts = append(ts, t)
	}
	slices.SortFunc(ts, compareTargets)
	ts = slices.Compact(ts)
	out := ts[:0:0]
	for i, t := range ts {
		covered := false
		for j, u := range ts {
			if i != j && u.covers(t) { // no mutual covers: duplicates are compacted
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, t)
		}
	}
	return out
}

// ExpandProto splits a ProtoAny port target into its TCP and UDP halves.
func ExpandProto(ts []Target) []Target {
	var out []Target
	for _, t := range ts {
		if t.Port != 0 && t.Proto == ProtoAny {
			out = append(out, Target{t.Prefix, t.Port, ProtoTCP}, Target{t.Prefix, t.Port, ProtoUDP})
			continue
		}
		out = append(out, t)
	}
	return normalizeTargets(out)
}
