package dnsproxy

import (
	"net"
	"net/netip"
	"slices"

	"github.com/miekg/dns"
)

// filtered is an upstream answer reduced to what a session may see.
//
// Invariant: every address left in answer, ns or extra (A records and SVCB
// ipv4hint values) is in kept, and only those of them that belong to the
// chain started by the query name; kept must be attested before the
// records are released.
type filtered struct {
	answer, ns, extra []dns.RR
	kept              []netip.Addr // deduplicated, in answer order
	dropped           []netip.Addr // removed by the guard
	minTTL            uint32       // lowest TTL among records that carry a kept address
	// changed are the types of the answer's RRsets that lost or changed a
	// record (AAAA removed, an address dropped, a hint removed): their
	// signatures no longer verify.
	changed map[uint16]bool
}

func (f *filtered) change(t uint16) {
	if f.changed == nil {
		f.changed = map[uint16]bool{}
	}
	f.changed[t] = true
}

// withoutStaleSignatures is the answer without the RRSIGs over a changed
// RRset (the others still verify: their RRsets passed unchanged).
func (f *filtered) withoutStaleSignatures() []dns.RR {
	if len(f.changed) == 0 {
		return f.answer
	}
	return slices.DeleteFunc(f.answer, func(rr dns.RR) bool {
		sig, ok := rr.(*dns.RRSIG)
		return ok && f.changed[sig.TypeCovered]
	})
}

// filterResponseFamilies applies the answer rules to up, the upstream's answer to a
// query for qname:
//   - the chain is qname plus every CNAME target reachable from it in the
//     answer section (the targets need not be allowed);
//   - A records of the chain are kept when public(addr), others dropped; A
//     records outside the chain are removed;
//   - AAAA records are removed everywhere, unless v6 (below);
//   - SVCB/HTTPS records lose ipv6hint (unless v6); ipv4hint keeps only public
//     addresses, only for records of the chain, and only when hints is set
//     (no entry that allowed qname said NoHints: a scope attests the
//     host's A records and nothing else);
//   - the authority and additional sections lose every address record and
//     every hint, and the OPT record (the reply gets its own);
//   - every other record passes unchanged.
//
// With v6 (a dual-stack
// session, SessionPolicy.AAAA) the AAAA records and ipv6hints follow the
// rules of A and ipv4hint: kept when of the chain and public(addr), an
// IPv4-mapped address never.
func filterResponseFamilies(qname string, up *dns.Msg, hints bool, public func(netip.Addr) bool, v6 bool) filtered {
	chain := map[string]bool{dns.CanonicalName(qname): true}
	for grew := true; grew; {
		grew = false
		for _, rr := range up.Answer {
			if c, ok := rr.(*dns.CNAME); ok && chain[dns.CanonicalName(c.Hdr.Name)] {
				t := dns.CanonicalName(c.Target)
				if !chain[t] {
					chain[t] = true
					grew = true
				}
			}
		}
	}
	var f filtered
	first := true
	keep := func(a netip.Addr, ttl uint32) {
		if !slices.Contains(f.kept, a) {
			f.kept = append(f.kept, a)
		}
		if first || ttl < f.minTTL {
			f.minTTL = ttl
			first = false
		}
	}
	for _, rr := range up.Answer {
		inChain := chain[dns.CanonicalName(rr.Header().Name)]
		switch r := rr.(type) {
		case *dns.A:
			a, ok := netip.AddrFromSlice(r.A.To4())
			if !ok || !inChain {
				f.change(dns.TypeA)
				continue
			}
			if !public(a) {
				f.change(dns.TypeA)
				f.dropped = append(f.dropped, a)
				continue
			}
			keep(a, r.Hdr.Ttl)
			f.answer = append(f.answer, r)
		case *dns.AAAA:
			a, ok := netip.AddrFromSlice(r.AAAA.To16())
			if !v6 || !ok || !inChain || a.Is4In6() {
				f.change(dns.TypeAAAA)
				continue
			}
			if !public(a) {
				f.change(dns.TypeAAAA)
				f.dropped = append(f.dropped, a)
				continue
			}
			keep(a, r.Hdr.Ttl)
			f.answer = append(f.answer, r)
		case *dns.SVCB:
			c := dns.Copy(r).(*dns.SVCB)
			c.Value = f.filterHints(c.Value, c.Hdr.Ttl, inChain && hints, v6, public, keep)
			if c.String() != r.String() {
				f.change(dns.TypeSVCB)
			}
			f.answer = append(f.answer, c)
		case *dns.HTTPS:
			c := dns.Copy(r).(*dns.HTTPS)
			c.Value = f.filterHints(c.Value, c.Hdr.Ttl, inChain && hints, v6, public, keep)
			if c.String() != r.String() {
				f.change(dns.TypeHTTPS)
			}
			f.answer = append(f.answer, c)
		default:
			f.answer = append(f.answer, rr)
		}
	}
	f.ns = stripAddresses(up.Ns)
	f.extra = stripAddresses(up.Extra)
	return f
}

// limit keeps at most n addresses (the first n, in answer order) and
// removes every A record and ipv4hint value that carries one of the
// others, so the invariant holds: nothing is released that is not kept. It
// returns how many addresses it removed. minTTL stays the minimum over the
// larger set, which is never above the true one: safe.
func (f *filtered) limit(n int) int {
	if len(f.kept) <= n {
		return 0
	}
	removed := len(f.kept) - n
	f.kept = f.kept[:n:n]
	for _, t := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSVCB, dns.TypeHTTPS} {
		f.change(t) // conservative: the capped RRsets may have lost records
	}
	out := f.answer[:0]
	for _, rr := range f.answer {
		switch r := rr.(type) {
		case *dns.A:
			a, _ := netip.AddrFromSlice(r.A.To4())
			if !slices.Contains(f.kept, a) {
				continue
			}
		case *dns.AAAA:
			a, _ := netip.AddrFromSlice(r.AAAA.To16())
			if !slices.Contains(f.kept, a) {
				continue
			}
		case *dns.SVCB:
			r.Value = f.keptHints(r.Value)
		case *dns.HTTPS:
			r.Value = f.keptHints(r.Value)
		}
		out = append(out, rr)
	}
	clear(f.answer[len(out):])
	f.answer = out
	return removed
}

// keptHints drops the ipv4hint values that are not kept (the records are
// the filter's own copies, safe to change).
func (f *filtered) keptHints(kvs []dns.SVCBKeyValue) []dns.SVCBKeyValue {
	return slices.DeleteFunc(kvs, func(kv dns.SVCBKeyValue) bool {
		switch h := kv.(type) {
		case *dns.SVCBIPv4Hint:
			h.Hint = slices.DeleteFunc(h.Hint, func(ip net.IP) bool {
				a, _ := netip.AddrFromSlice(ip.To4())
				return !slices.Contains(f.kept, a)
			})
			return len(h.Hint) == 0 // an empty ipv4hint is not valid on the wire
		case *dns.SVCBIPv6Hint:
			h.Hint = slices.DeleteFunc(h.Hint, func(ip net.IP) bool {
				a, _ := netip.AddrFromSlice(ip.To16())
				return !slices.Contains(f.kept, a)
			})
			return len(h.Hint) == 0
		}
		return false
	})
}

// stripECH removes the ech parameter (the ECH configuration) from the
// answer's SVCB and HTTPS records: a client without one sends the name it
// wants in the clear, as the outer server_name the table's name check
// reads (an ECH client's outer name is its provider's, never the one the
// policy allows).
func (f *filtered) stripECH() {
	for _, rr := range f.answer {
		var kvs *[]dns.SVCBKeyValue
		switch r := rr.(type) {
		case *dns.SVCB:
			kvs = &r.Value
		case *dns.HTTPS:
			kvs = &r.Value
		default:
			continue
		}
		n := len(*kvs)
		*kvs = slices.DeleteFunc(*kvs, func(kv dns.SVCBKeyValue) bool {
			_, ech := kv.(*dns.SVCBECHConfig)
			return ech
		})
		if len(*kvs) != n {
			f.change(rr.Header().Rrtype)
		}
	}
}

// publicHints keeps the hint addresses of the family (v4: ipv4hint's,
// else ipv6hint's, whose v4-mapped ones are left out) that are public,
// each given to keep; the others are recorded as dropped.
func (f *filtered) publicHints(ips []net.IP, v4 bool, ttl uint32, public func(netip.Addr) bool, keep func(netip.Addr, uint32)) []net.IP {
	var out []net.IP
	for _, ip := range ips {
		var a netip.Addr
		var ok bool
		if v4 {
			a, ok = netip.AddrFromSlice(ip.To4())
		} else {
			a, ok = netip.AddrFromSlice(ip.To16())
			ok = ok && !a.Is4In6()
		}
		if !ok {
			continue
		}
		if !public(a) {
			f.dropped = append(f.dropped, a)
			continue
		}
		keep(a, ttl)
		out = append(out, ip)
	}
	return out
}

// filterHints drops ipv6hint and keeps the public ipv4hint addresses of a
// record of the chain (none for a record outside it).
func (f *filtered) filterHints(kvs []dns.SVCBKeyValue, ttl uint32, inChain, v6 bool, public func(netip.Addr) bool, keep func(netip.Addr, uint32)) []dns.SVCBKeyValue {
	out := kvs[:0]
	for _, kv := range kvs {
		switch h := kv.(type) {
		case *dns.SVCBIPv6Hint:
			if !v6 || !inChain {
				continue
			}
			if h.Hint = f.publicHints(h.Hint, false, ttl, public, keep); len(h.Hint) == 0 {
				continue // an empty ipv6hint is not valid on the wire
			}
		case *dns.SVCBIPv4Hint:
			if !inChain {
				continue
			}
			if h.Hint = f.publicHints(h.Hint, true, ttl, public, keep); len(h.Hint) == 0 {
				continue // an empty ipv4hint is not valid on the wire
			}
		}
		out = append(out, kv)
	}
	return out
}

// stripAddresses removes what a session must not see outside the answer's
// chain: A and AAAA records, SVCB/HTTPS hints and the OPT record.
func stripAddresses(rrs []dns.RR) []dns.RR {
	var out []dns.RR
	for _, rr := range rrs {
		switch r := rr.(type) {
		case *dns.A, *dns.AAAA, *dns.OPT:
		case *dns.SVCB:
			c := dns.Copy(r).(*dns.SVCB)
			c.Value = withoutHints(c.Value)
			out = append(out, c)
		case *dns.HTTPS:
			c := dns.Copy(r).(*dns.HTTPS)
			c.Value = withoutHints(c.Value)
			out = append(out, c)
		default:
			out = append(out, rr)
		}
	}
	return out
}

func withoutHints(kvs []dns.SVCBKeyValue) []dns.SVCBKeyValue {
	return slices.DeleteFunc(kvs, func(kv dns.SVCBKeyValue) bool {
		k := kv.Key()
		return k == dns.SVCB_IPV4HINT || k == dns.SVCB_IPV6HINT
	})
}

// capTTLs lowers every TTL in rrs to at most max.
func capTTLs(rrs []dns.RR, max uint32) {
	for _, rr := range rrs {
		if h := rr.Header(); h.Ttl > max {
			h.Ttl = max
		}
	}
}
