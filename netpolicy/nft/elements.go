package nft

import (
	"encoding/binary"
	"net/netip"
	"sort"
	"time"

	"github.com/google/nftables"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// This file turns desired state into set elements: pure functions, unit
// tested byte for byte. Key layouts follow the kernel's register rules: every
// field of a concatenation starts on a 4-byte boundary, so a 1-byte protocol
// and a 2-byte port are each padded with zeros to 4 bytes (the meta and
// payload expressions zero the rest of their register), and an interface
// name is IFNAMSIZ (16) bytes, zero padded.

const ifNameSize = 16

func ipKey(a netip.Addr) []byte {
	b := a.Unmap().As4()
	return b[:]
}

func protoKey(p netpolicy.Proto) []byte { return []byte{p.Number(), 0, 0, 0} }

func portKey(port uint16) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint16(b, port)
	return b
}

func ifnameKey(name string) []byte {
	b := make([]byte, ifNameSize)
	copy(b, name)
	return b
}

func concat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// setElems is a batch of elements for one set.
type setElems struct {
	set   string
	elems []nftables.SetElement
}

// blockedElements returns the elements of the "blocked" interval set: for
// each merged interval [first, last] a start element at first and, unless
// last is 255.255.255.255, an interval-end element at last+1 (the kernel's
// rbtree interval encoding: an address is in the set when the greatest
// element at or below it is not an interval end).
func blockedElements(g *netpolicy.Guard) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range g.BlockedRanges() {
		out = append(out, nftables.SetElement{Key: ipKey(r.First)})
		if r.Last != netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			out = append(out, nftables.SetElement{Key: ipKey(r.Last.Next()), IntervalEnd: true})
		}
	}
	return out
}

// prefixBounds returns the first and last address of p.
func prefixBounds(p netip.Prefix) (netip.Addr, netip.Addr) {
	r := netpolicy.PrefixRange(p)
	return r.First, r.Last
}

// sessionElements returns every element AddSession inserts for r, grouped by
// set in a fixed order. Static targets are normalised first so that the
// concatenated interval sets never receive overlapping ranges; single
// addresses go to the hash sets (see the set comments).
func sessionElements(r SessionRules) []setElems {
	// A dual-stack session's IPv6 targets are sessionElements6's.
	r.Static, _ = splitFamilies(r.Static)
	r.Deny, _ = splitFamilies(r.Deny)
	g := ipKey(r.Guest)
	out := []setElems{
		{set: setSessions, elems: []nftables.SetElement{{Key: concat(ifnameKey(r.HostIface), g)}}},
		{set: setIfaces, elems: []nftables.SetElement{{Key: ifnameKey(r.HostIface), Val: g}}},
	}
	if r.Egress == netpolicy.ModePublic {
		out = append(out, setElems{setPublic, []nftables.SetElement{{Key: g}}})
	}
	var peers []nftables.SetElement
	for _, p := range r.Peers {
		if p = p.Unmap(); p.Is4() {
			peers = append(peers, nftables.SetElement{Key: concat(g, ipKey(p))})
		}
	}
	var static, staticPorts, cidr, cidrPorts, portHosts []nftables.SetElement
	var portCIDRs []netip.Prefix
	seenHost := map[netip.Addr]bool{}
	for _, t := range netpolicy.ExpandProto(r.Static) {
		first, last := prefixBounds(t.Prefix)
		single := t.Prefix.IsSingleIP()
		switch {
		case t.Port == 0 && single:
			static = append(static, nftables.SetElement{Key: concat(g, ipKey(first))})
		case t.Port == 0:
			cidr = append(cidr, nftables.SetElement{Key: concat(g, ipKey(first)), KeyEnd: concat(g, ipKey(last))})
		case single:
			staticPorts = append(staticPorts, nftables.SetElement{Key: concat(g, protoKey(t.Proto), ipKey(first), portKey(t.Port))})
			if !seenHost[first] {
				seenHost[first] = true
				portHosts = append(portHosts, nftables.SetElement{Key: concat(g, ipKey(first))})
			}
		default:
			portCIDRs = append(portCIDRs, t.Prefix)
			pr, po := protoKey(t.Proto), portKey(t.Port)
			cidrPorts = append(cidrPorts, nftables.SetElement{
				Key:    concat(g, pr, ipKey(first), po),
				KeyEnd: concat(g, pr, ipKey(last), po),
			})
		}
	}
	var portCIDR []nftables.SetElement
	for _, p := range outermost(portCIDRs) {
		first, last := prefixBounds(p)
		portCIDR = append(portCIDR, nftables.SetElement{Key: concat(g, ipKey(first)), KeyEnd: concat(g, ipKey(last))})
	}
	var denied, deniedPorts []nftables.SetElement
	for _, t := range netpolicy.ExpandProto(r.Deny) {
		first, last := prefixBounds(t.Prefix)
		if t.Port == 0 {
			denied = append(denied, nftables.SetElement{Key: concat(g, ipKey(first)), KeyEnd: concat(g, ipKey(last))})
			continue
		}
		pr, po := protoKey(t.Proto), portKey(t.Port)
		deniedPorts = append(deniedPorts, nftables.SetElement{Key: concat(g, pr, ipKey(first), po), KeyEnd: concat(g, pr, ipKey(last), po)})
	}
	var reject, reset []nftables.SetElement
	if r.OnDeny.Answers() {
		reject = []nftables.SetElement{{Key: g}}
	}
	if r.OnDeny == netpolicy.DenyReset {
		reset = []nftables.SetElement{{Key: g}}
	}
	var nameCheck, nameCheckPublic, nameCheckQUIC, pinned, pinnedPorts []nftables.SetElement
	if r.NameCheck {
		nameCheck = []nftables.SetElement{{Key: g}}
		if r.Egress == netpolicy.ModePublic && r.DenyNames {
			nameCheckPublic = nameCheck
		}
		if r.QUICCheck {
			nameCheckQUIC = nameCheck
		}
		for _, t := range netpolicy.ExpandProto(r.Pinned) {
			a := ipKey(t.Prefix.Addr())
			if t.Port == 0 {
				pinned = append(pinned, nftables.SetElement{Key: concat(g, a)})
				continue
			}
			pinnedPorts = append(pinnedPorts, nftables.SetElement{Key: concat(g, protoKey(t.Proto), a, portKey(t.Port))})
		}
	}
	for _, se := range []setElems{{setNameCheck, nameCheck}, {setNameCheckPublic, nameCheckPublic}, {setNameCheckQUIC, nameCheckQUIC}, {setPinned, pinned}, {setPinnedPorts, pinnedPorts}, {setPeers, peers}, {setStatic, static}, {setStaticPorts, staticPorts}, {setStaticCIDR, cidr}, {setStaticCIDRPorts, cidrPorts},
		{setPortHosts, portHosts}, {setPortCIDRs, portCIDR}, {setDenied, denied}, {setDeniedPorts, deniedPorts}, {setReject, reject}, {setReset, reset}} {
		if len(se.elems) > 0 {
			out = append(out, se)
		}
	}
	out = append(out, inboundElements(r)...)
	out = append(out,
		setElems{setAcctAccept, []nftables.SetElement{{Key: g}}},
		setElems{setAcctDrop, []nftables.SetElement{{Key: g}}},
		setElems{setAcctLimited, []nftables.SetElement{{Key: g}}},
		setElems{setAcctReturn, []nftables.SetElement{{Key: g}}},
	)
	return out
}

// attestElements returns the elements Attest inserts: guest . ip in
// "attested" when ports is empty or contains a port-less spec (and, since
// such an element never opens 53 or 853, a guest . proto . ip . port
// element in "attested_ports" per resolver port ports names beside it),
// otherwise one guest . proto . ip . port element per (ip, port, protocol)
// in "attested_ports". Non-IPv4 addresses are skipped (IPv6 is not
// supported).
func attestElements(guest netip.Addr, ips []netip.Addr, timeout time.Duration, ports []netpolicy.PortSpec) []setElems {
	g := ipKey(guest)
	anyPort := len(ports) == 0
	for _, p := range ports {
		if p.Port == 0 {
			anyPort = true
		}
	}
	var elems, resolver []nftables.SetElement
	for _, ip := range ips {
		if ip = ip.Unmap(); !ip.Is4() {
			continue
		}
		if anyPort {
			elems = append(elems, nftables.SetElement{Key: concat(g, ipKey(ip)), Timeout: timeout})
			// Any port but the resolver ports: those an entry names
			// beside the port-less one are attested on their own.
			for _, p := range ports {
				if !netpolicy.IsResolverPort(p.Port) {
					continue
				}
				for _, proto := range protosOf(p.Proto) {
					resolver = append(resolver, nftables.SetElement{Key: concat(g, protoKey(proto), ipKey(ip), portKey(p.Port)), Timeout: timeout})
				}
			}
			continue
		}
		for _, p := range ports {
			for _, proto := range protosOf(p.Proto) {
				elems = append(elems, nftables.SetElement{
					Key:     concat(g, protoKey(proto), ipKey(ip), portKey(p.Port)),
					Timeout: timeout,
				})
			}
		}
	}
	if len(elems) == 0 {
		return nil
	}
	if anyPort {
		if len(resolver) > 0 {
			return []setElems{{setAttested, elems}, {setAttestedPorts, resolver}}
		}
		return []setElems{{setAttested, elems}}
	}
	// The address without its ports, so a drop on another port says "port".
	var hosts []nftables.SetElement
	seen := map[netip.Addr]bool{}
	for _, ip := range ips {
		if ip = ip.Unmap(); ip.Is4() && !seen[ip] {
			seen[ip] = true
			hosts = append(hosts, nftables.SetElement{Key: concat(g, ipKey(ip)), Timeout: timeout})
		}
	}
	return []setElems{{setAttestedPorts, elems}, {setPortAttested, hosts}}
}

func protosOf(p netpolicy.Proto) []netpolicy.Proto {
	if p == netpolicy.ProtoAny {
		return []netpolicy.Proto{netpolicy.ProtoTCP, netpolicy.ProtoUDP}
	}
	return []netpolicy.Proto{p}
}

// decodeGuestPort splits a guest . proto . ip . port key.
func decodeGuestPort(key []byte) (guest, ip netip.Addr, proto netpolicy.Proto, port uint16, ok bool) {
	if len(key) != 16 {
		return
	}
	guest = netip.AddrFrom4([4]byte(key[0:4]))
	switch key[4] {
	case 6:
		proto = netpolicy.ProtoTCP
	case 17:
		proto = netpolicy.ProtoUDP
	}
	ip = netip.AddrFrom4([4]byte(key[8:12]))
	port = binary.BigEndian.Uint16(key[12:14])
	return guest, ip, proto, port, true
}

// outermost returns the prefixes of ps that no other one covers, sorted:
// prefixes nest or are disjoint, so these are disjoint (an interval set
// refuses overlapping elements).
func outermost(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for i, p := range ps {
		covered := false
		for j, q := range ps {
			if i != j && q.Bits() <= p.Bits() && q.Contains(p.Addr()) && (q.Bits() < p.Bits() || j < i) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr().Less(out[j].Addr()) })
	return out
}

// elemGuest returns the guest a dumped element of set belongs to: the map
// ifaces holds it in the element's data, every other set in its key.
func elemGuest(set string, e nftables.SetElement) (netip.Addr, bool) {
	if set == setIfaces {
		if len(e.Val) != 4 {
			return netip.Addr{}, false
		}
		return netip.AddrFrom4([4]byte(e.Val)), true
	}
	return keyGuest(set, e.Key)
}

// keyGuest returns the guest address a session-keyed element belongs to: the
// first 4 bytes of every per-session key except "sessions", whose guest
// follows the interface name.
func keyGuest(set string, key []byte) (netip.Addr, bool) {
	off := 0
	if set == setSessions {
		off = ifNameSize
	}
	if len(key) < off+4 {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte(key[off : off+4])), true
}
