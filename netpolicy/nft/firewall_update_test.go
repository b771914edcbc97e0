package nft

import (
	"net/netip"
	"testing"

	"github.com/enforcerd/enforcerd/netpolicy"
)

func updRules(egress netpolicy.Mode, static []netpolicy.Target, peers ...netip.Addr) SessionRules {
	return SessionRules{Name: "s", HostIface: "enf1h", Guest: netip.MustParseAddr("10.20.0.6"), Egress: egress, Static: static, Peers: peers}
}

func setsOf(ps []setElems) map[string]int {
	out := map[string]int{}
	for _, se := range ps {
		out[se.set] += len(se.elems)
	}
	return out
}

func TestPlanUpdateTouchesOnlyTheDifference(t *testing.T) {
	a := netpolicy.Target{Prefix: netip.MustParsePrefix("198.51.100.7/32")}
	b := netpolicy.Target{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Port: 443, Proto: netpolicy.ProtoTCP}
	peer := netip.MustParseAddr("10.20.0.10")
	u := SessionUpdate{Old: updRules(netpolicy.ModePublic, []netpolicy.Target{a}, peer), New: updRules(netpolicy.ModeAllowlist, []netpolicy.Target{b})}
	p := (&Firewall{}).planUpdate(u)
	del, add := setsOf(p.del), setsOf(p.add)
	if del[setPublic] != 1 || del[setStatic] != 1 || del[setPeers] != 1 || add[setStaticCIDRPorts] != 1 {
		t.Fatalf("del %v add %v: want public, static and peers deleted, the port CIDR added", del, add)
	}
	for _, s := range []string{setSessions, setAcctAccept, setAcctDrop, setAcctLimited} {
		if del[s] != 0 || add[s] != 0 {
			t.Errorf("%s touched (del %d, add %d): the session's own elements must stay", s, del[s], add[s])
		}
	}
	if len((&Firewall{}).planUpdate(SessionUpdate{Old: u.New, New: u.New}).add) != 0 {
		t.Error("an update to the same rules adds elements")
	}
}

func TestPlanUpdateKeepsWhatAnotherNameAttested(t *testing.T) {
	x, y := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	r := updRules(netpolicy.ModeAllowlist, nil)
	u := SessionUpdate{Old: r, New: r,
		Stale: []netpolicy.Attestation{{Addrs: []netip.Addr{x, y}}},
		Keep:  []netpolicy.Attestation{{Addrs: []netip.Addr{y}}}}
	p := (&Firewall{}).planUpdate(u)
	if got := setsOf(p.unattest); got[setAttested] != 1 {
		t.Fatalf("unattest %v: want only x's element removed", got)
	}
	if k := p.unattest[0].elems[0].Key; netip.AddrFrom4([4]byte(k[4:8])) != x {
		t.Errorf("unattest removes %v, want %s", k, x)
	}
	// A port-constrained attestation removes its ported elements.
	u.Stale = []netpolicy.Attestation{{Addrs: []netip.Addr{x}, Ports: []netpolicy.PortSpec{{Port: 443, Proto: netpolicy.ProtoTCP}}}}
	if got := setsOf((&Firewall{}).planUpdate(u).unattest); got[setAttestedPorts] != 1 {
		t.Errorf("unattest %v: want the 443/tcp element", got)
	}
}

func TestCutsFlow(t *testing.T) {
	g := netpolicy.DefaultGuard()
	x, y := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	cidr := netpolicy.Target{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Port: 443, Proto: netpolicy.ProtoTCP}
	peer := netip.MustParseAddr("10.20.0.10")
	u := SessionUpdate{
		Old:   updRules(netpolicy.ModeAllowlist, []netpolicy.Target{cidr}, peer),
		New:   updRules(netpolicy.ModeAllowlist, nil),
		Stale: []netpolicy.Attestation{{Addrs: []netip.Addr{x, y}}},
		Keep:  []netpolicy.Attestation{{Addrs: []netip.Addr{y}}},
	}
	const tcp, udp = 6, 17
	for _, c := range []struct {
		dst   string
		proto uint8
		port  uint16
		cut   bool
	}{
		{"198.51.100.1", tcp, 80, true},  // a revoked name's address
		{"198.51.100.2", tcp, 80, false}, // another allowed name attested it too
		{"203.0.113.9", tcp, 443, true},  // a revoked CIDR entry
		{"203.0.113.9", udp, 443, false}, // never allowed by the update's old side
		{"10.20.0.10", tcp, 22, true},    // a revoked lab peer
		{"192.0.2.99", tcp, 80, false},   // nothing the update took away
	} {
		if got := u.cutsFlow(g, netip.MustParseAddr(c.dst), c.proto, c.port); got != c.cut {
			t.Errorf("cutsFlow(%s %d/%d) = %v, want %v", c.dst, c.port, c.proto, got, c.cut)
		}
	}
	// public -> allowlist cuts every public destination the new rules lack.
	pa, pb := netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("93.184.216.35")
	u = SessionUpdate{Old: updRules(netpolicy.ModePublic, nil), New: updRules(netpolicy.ModeAllowlist, []netpolicy.Target{{Prefix: netip.PrefixFrom(pa, 32)}})}
	if !u.cutsFlow(g, pb, tcp, 80) || u.cutsFlow(g, pa, tcp, 80) {
		t.Error("public -> allowlist: want every public destination cut but the new static one")
	}
}

// TestWidensOnly: an update CutFlows skips (widensOnly) cuts no flow
// cutsFlow would cut, checked over a grid of destinations, protocols and
// ports; each way of taking something away makes it walk the table.
func TestWidensOnly(t *testing.T) {
	g := netpolicy.DefaultGuard()
	a := netpolicy.Target{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Port: 443, Proto: netpolicy.ProtoTCP}
	b := netpolicy.Target{Prefix: netip.MustParsePrefix("198.51.100.7/32")}
	deny := netpolicy.Target{Prefix: netip.MustParsePrefix("203.0.113.66/32")}
	peer, peer2 := netip.MustParseAddr("10.20.0.10"), netip.MustParseAddr("10.20.0.14")
	att := []netpolicy.Attestation{{Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.5")}}}
	withDeny := func(r SessionRules, d ...netpolicy.Target) SessionRules { r.Deny = d; return r }
	withInbound := func(r SessionRules, p ...netpolicy.PortSpec) SessionRules { r.InboundFromHost = p; return r }
	in8080, in8080tcp := netpolicy.PortSpec{Port: 8080, Proto: netpolicy.ProtoAny}, netpolicy.PortSpec{Port: 8080, Proto: netpolicy.ProtoTCP}
	for _, c := range []struct {
		name  string
		u     SessionUpdate
		widen bool
	}{
		{"add a target", SessionUpdate{Old: updRules(netpolicy.ModeAllowlist, []netpolicy.Target{a}), New: updRules(netpolicy.ModeAllowlist, []netpolicy.Target{a, b})}, true},
		{"add a peer, keep an attestation", SessionUpdate{Old: updRules(netpolicy.ModeAllowlist, nil, peer), New: updRules(netpolicy.ModeAllowlist, nil, peer, peer2), Keep: att}, true},
		{"allowlist to public", SessionUpdate{Old: updRules(netpolicy.ModeAllowlist, []netpolicy.Target{a}), New: updRules(netpolicy.ModePublic, []netpolicy.Target{a})}, true},
		{"drop a deny", SessionUpdate{Old: withDeny(updRules(netpolicy.ModePublic, nil), deny), New: updRules(netpolicy.ModePublic, nil)}, true},
		{"no change", SessionUpdate{Old: updRules(netpolicy.ModeAllowlist, []netpolicy.Target{a}), New: updRules(netpolicy.ModeAllowlist, []netpolicy.Target{a})}, true},
		{"revoke a target", SessionUpdate{Old: updRules(netpolicy.ModeAllowlist, []netpolicy.Target{a, b}), New: updRules(netpolicy.ModeAllowlist, []netpolicy.Target{a})}, false},
		{"revoke a peer", SessionUpdate{Old: updRules(netpolicy.ModeAllowlist, nil, peer), New: updRules(netpolicy.ModeAllowlist, nil)}, false},
		{"public to allowlist", SessionUpdate{Old: updRules(netpolicy.ModePublic, nil), New: updRules(netpolicy.ModeAllowlist, nil)}, false},
		{"add a deny", SessionUpdate{Old: updRules(netpolicy.ModeAllowlist, []netpolicy.Target{a}), New: withDeny(updRules(netpolicy.ModeAllowlist, []netpolicy.Target{a}), deny)}, false},
		{"a stale attestation", SessionUpdate{Old: updRules(netpolicy.ModeAllowlist, nil), New: updRules(netpolicy.ModeAllowlist, nil), Stale: att}, false},
		{"add an inbound port", SessionUpdate{Old: updRules(netpolicy.ModeAllowlist, nil), New: withInbound(updRules(netpolicy.ModeAllowlist, nil), in8080)}, true},
		{"revoke an inbound port", SessionUpdate{Old: withInbound(updRules(netpolicy.ModeAllowlist, nil), in8080), New: updRules(netpolicy.ModeAllowlist, nil)}, false},
		{"narrow an inbound port to tcp", SessionUpdate{Old: withInbound(updRules(netpolicy.ModeAllowlist, nil), in8080), New: withInbound(updRules(netpolicy.ModeAllowlist, nil), in8080tcp)}, false},
	} {
		if got := c.u.widensOnly(); got != c.widen {
			t.Errorf("%s: widensOnly = %v, want %v", c.name, got, c.widen)
		}
		if !c.u.widensOnly() {
			continue
		}
		for _, src := range []string{"10.20.0.1", "198.18.0.2", "10.20.0.6"} {
			for _, proto := range []uint8{6, 17} {
				if c.u.cutsInbound(netip.MustParsePrefix("10.20.0.0/16"), netip.MustParseAddr(src), proto, 8080) {
					t.Errorf("%s: widensOnly, yet cutsInbound(%s %d/8080)", c.name, src, proto)
				}
			}
		}
		for _, dst := range []string{"203.0.113.9", "203.0.113.66", "198.51.100.7", "192.0.2.5", "10.20.0.10", "10.20.0.14", "93.184.216.34", "100.64.0.1"} {
			for _, proto := range []uint8{1, 6, 17} {
				for _, port := range []uint16{0, 53, 80, 443} {
					if c.u.cutsFlow(g, netip.MustParseAddr(dst), proto, port) {
						t.Errorf("%s: widensOnly, yet cutsFlow(%s %d/%d)", c.name, dst, port, proto)
					}
				}
			}
		}
	}
}

// TestCutsInbound: a revoked --inbound-from-host port cuts the host's
// connections to it (from a gateway or any host address), not a lab
// peer's (a session's address: the third of its /30), nor a port kept.
func TestCutsInbound(t *testing.T) {
	pool := netip.MustParsePrefix("10.20.0.0/16")
	r := func(p ...netpolicy.PortSpec) SessionRules {
		x := updRules(netpolicy.ModeAllowlist, nil)
		x.InboundFromHost = p
		return x
	}
	u := SessionUpdate{Old: r(netpolicy.PortSpec{Port: 8080}, netpolicy.PortSpec{Port: 9090, Proto: netpolicy.ProtoTCP}), New: r(netpolicy.PortSpec{Port: 9090, Proto: netpolicy.ProtoTCP})}
	for _, c := range []struct {
		src   string
		proto uint8
		port  uint16
		want  bool
	}{
		{"10.20.0.1", 6, 8080, true},   // the session's gateway: the host
		{"10.20.0.5", 17, 8080, true},  // another slot's gateway: the host too
		{"198.18.0.2", 6, 8080, true},  // a host address outside the pool
		{"10.20.0.6", 6, 8080, false},  // a session's address: a lab peer's flow
		{"10.20.0.1", 6, 9090, false},  // a port the update keeps
		{"10.20.0.1", 17, 7070, false}, // a port never named
	} {
		if got := u.cutsInbound(pool, netip.MustParseAddr(c.src), c.proto, c.port); got != c.want {
			t.Errorf("cutsInbound(%s %d/%d) = %v, want %v", c.src, c.proto, c.port, got, c.want)
		}
	}
}

// TestPlanUpdateRewritesTheV6Side: on a dual-stack firewall an update's
// plan holds the session's v6 elements beside the v4 ones (one batch):
// an added v6 literal, the egress mode and --on-deny in public6 and
// reject6/reset6, a v6 deny entry, and the attested6 elements of a
// revoked name's AAAA answer (unless a kept name holds them); the
// session's own sessions6 element is never touched.
func TestPlanUpdateRewritesTheV6Side(t *testing.T) {
	f := &Firewall{cfg: FirewallConfig{Pool: netip.MustParsePrefix("10.20.0.0/16"), Pool6: netip.MustParsePrefix("fd00:20::/112")}}
	lit := netpolicy.Target{Prefix: netip.MustParsePrefix("2001:2:0:1::11/128"), Port: 7, Proto: netpolicy.ProtoTCP}
	deny := netpolicy.Target{Prefix: netip.MustParsePrefix("2001:2:0:2::/64")}
	old := updRules(netpolicy.ModeAllowlist, nil)
	old.OnDeny = netpolicy.DenyReject
	next := updRules(netpolicy.ModePublic, []netpolicy.Target{lit})
	next.Deny, next.OnDeny = []netpolicy.Target{deny}, netpolicy.DenyReset
	x, y := netip.MustParseAddr("2001:2:0:1::10"), netip.MustParseAddr("2001:2:0:1::12")
	u := SessionUpdate{Old: old, New: next,
		Stale: []netpolicy.Attestation{{Addrs: []netip.Addr{netip.MustParseAddr("198.18.1.10"), x, y}}},
		Keep:  []netpolicy.Attestation{{Addrs: []netip.Addr{y}}}}
	p := f.planUpdate(u)
	add, del, un := setsOf(p.add), setsOf(p.del), setsOf(p.unattest)
	for _, s := range []string{setStatic6Ports, setPublic6, setDenied6, setReset6} {
		if add[s] != 1 {
			t.Errorf("add %v: want one element in %s", add, s)
		}
	}
	if add[setReject6] != 0 || del[setReject6] != 0 {
		t.Errorf("reject6 touched (add %v, del %v): reject and reset both answer", add, del)
	}
	if add[setSessions6] != 0 || del[setSessions6] != 0 {
		t.Errorf("sessions6 touched (add %v, del %v): the session's own element must stay", add, del)
	}
	if un[setAttested6] != 1 || un[setAttested] != 1 {
		t.Fatalf("unattest %v: want the revoked name's v4 element and x's v6 one (y is kept)", un)
	}
	for _, se := range p.unattest {
		if se.set == setAttested6 {
			if k := se.elems[0].Key; netip.AddrFrom16([16]byte(k[16:32])) != x || netip.AddrFrom16([16]byte(k[:16])) != f.guest6Of(old.Guest) {
				t.Errorf("unattest6 removes %x, want %s . %s", k, f.guest6Of(old.Guest), x)
			}
		}
	}
	// And back: every v6 element the first update added is deleted.
	back := f.planUpdate(SessionUpdate{Old: next, New: old})
	if d := setsOf(back.del); d[setStatic6Ports] != 1 || d[setPublic6] != 1 || d[setDenied6] != 1 || d[setReset6] != 1 || d[setReject6] != 0 {
		t.Errorf("the way back deletes %v, want static6_ports, public6, denied6 and reset6 (reject6 stays)", d)
	}
	// The owner of each v6 element is the session's v4 guest.
	for _, se := range p.add {
		if g, ok := f.keyOwner(se.set, se.elems[0].Key); !ok || g != old.Guest {
			t.Errorf("keyOwner(%s) = %s, %v: want %s", se.set, g, ok, old.Guest)
		}
	}
}
