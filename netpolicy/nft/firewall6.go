package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// Dual-stack sessions (FirewallConfig.Pool6). Everything IPv6 lives in sets
// and chains of its own, made only on a dual-stack daemon: an IPv4-only
// table is exactly what it was. Each v6 set is keyed by the guest's v6
// address (its slot's ::2 in Pool6), which anti-spoofing pins to the
// session's interface as the v4 one is.
//
//	raw_prerouting (first rule)
//	  iifname "P*" meta nfproto ipv6 goto raw_session6
//	raw_session6
//	  exthdr rt exists drop                                # no source routing (routingHeader6)
//	  icmpv6 type {nd-router-advert, nd-redirect, nd-router-solicit} drop  # a guest is no router
//	  icmpv6 type {nd-neighbor-solicit, nd-neighbor-advert} ip6 hoplimit 255 ip6 saddr fe80::2 accept  # NDP with the host side, from the guest's pinned link-local
//	  icmpv6 type nd-neighbor-solicit ip6 hoplimit 255 ip6 saddr :: accept  # DAD probes
//	  iifname . ip6 saddr != @sessions6 goto drop_spoofed6  # anti-spoofing, before conntrack
//	forward (before the v4 rules of sessions)
//	  iifname "P*" meta nfproto ipv6 goto from_session6
//	  oifname "P*" meta nfproto ipv6 ct mark NAME_PENDING goto name_queue  # the server's ACK confirms a checked flow
//	  oifname "P*" meta nfproto ipv6 ct state established,related accept
//	  oifname "P*" meta nfproto ipv6 goto drop_inbound6     # no new flow into a session
//	from_session6
//	  icmpv6 type {133-137} drop                           # ND is link-scoped, never forwarded
//	  ip6 saddr vmap @budget_chains6                       # byte budgets (limits6.go)
//	  ct mark NAME_PENDING goto name_queue                 # the name check (namecheck6.go)
//	  ct mark NAME_REFUSED goto drop_name6
//	  ct state established accept
//	  ct state related,invalid drop                        # a session's ICMPv6 errors: refused
//	  (every accept below is "goto accept_new6"; every drop_X6 a reason chain, droprules6.go)
//	  ip6 saddr . ip6 daddr @denied6 goto drop_denied6
//	  ip6 saddr . ip6 daddr @peers6 accept                 # lab peers (peers6.go), before the guard: in the pool6
//	  ip6 daddr @blocked6 goto drop_special6               # the v6 special-purpose guard
//	  ip6 saddr vmap @grant_chains6                        # connection grants (limits6.go)
//	  KEY6 @static6_ports accept                           # KEY6 = ip6 saddr . meta l4proto . ip6 daddr . th dport
//	  KEY6 @attested6_ports goto accept_named6             # admitted by a name: the name check (namecheck6.go)
//	                                                       # (with the refresh, and its live set: refresh6.go)
//	  meta l4proto {tcp,udp} th dport {53,853} goto drop_resolver6  # resolvers: only the proxy, or an entry naming the port
//	  ip6 saddr @namecheck6_public goto accept_named6      # public, deny entries by name: every flow checked
//	  ip6 saddr @public6 accept
//	  ip6 saddr . ip6 daddr @attested6 goto accept_named6
//	  ip6 saddr . ip6 daddr @static6 accept
//	  ip6 saddr . ip6 daddr @static6_cidr accept
//	  KEY6 @static6_cidr_ports accept
//	  goto drop_not_allowed6
//	accept_new6
//	  ct state new add @flows6 { ip6 saddr ct count over MAXFLOWS } goto drop_limited6
//	  ct state new update @flowrate6 { ip6 saddr limit rate over RATE/second burst 2*RATE packets } goto drop_limited6
//	  accept
//	drop_policy6
//	  update @acct_drop { meta mark }                      # the reason chain's mark: the v4 guest
//	  ip6 saddr @reset6 meta l4proto tcp reject with tcp reset
//	  ip6 saddr @reject6 reject with icmpv6 admin-prohibited
//	  drop
//	input (first rule)
//	  iifname "P*" meta nfproto ipv6 goto input_session6
//	  meta nfproto ipv6 ip6 daddr DNS6 drop                # the v6 anycast address answers sessions only
//	input_session6
//	  icmpv6 type {nd-neighbor-solicit, nd-neighbor-advert} accept
//	  ip6 daddr DNS6 udp dport 53 accept
//	  ct state established accept                          # DNS over TCP; replies to --inbound-from-host flows
//	  ip6 daddr DNS6 tcp dport 53 accept
//	  drop
//	output (first rule)
//	  oifname "P*" meta nfproto ipv6 goto output_session6
//	output_session6
//	  icmpv6 type {nd-neighbor-solicit, nd-neighbor-advert} accept
//	  ct state established,related accept                  # the proxy's answers
//	  ip6 daddr . meta l4proto . th dport @inbound_host6 accept  # --inbound-from-host (peers6.go)
//	  goto drop_inbound6                                   # nothing else the host opens
//	postrouting
//	  meta nfproto ipv6 ip6 saddr POOL6 oifname != "P*" masquerade   # NAT66
const (
	setSessions6         = "sessions6"          // ifname . ipv6_addr: host veth . guest6
	setBlocked6          = "blocked6"           // ipv6_addr interval: Guard.BlockedRanges6()
	setPublic6           = "public6"            // ipv6_addr: guests in public mode
	setStatic6           = "static6"            // ipv6_addr . ipv6_addr: guest6 . /128 entry
	setStatic6Ports      = "static6_ports"      // ipv6_addr . inet_proto . ipv6_addr . inet_service
	setStatic6CIDR       = "static6_cidr"       // ipv6_addr . ipv6_addr interval
	setStatic6CIDRPorts  = "static6_cidr_ports" // ipv6_addr . inet_proto . ipv6_addr . inet_service interval
	setAttested6         = "attested6"          // ipv6_addr . ipv6_addr, timeout: guest6 . AAAA-attested address
	setAttested6Ports    = "attested6_ports"    // ipv6_addr . inet_proto . ipv6_addr . inet_service, timeout
	setDenied6           = "denied6"            // ipv6_addr . ipv6_addr interval: guest6 . denied v6 CIDR (any port)
	setReject6           = "reject6"            // ipv6_addr: guests whose policy drops are answered
	setReset6            = "reset6"             // ipv6_addr: of those, answered with a TCP reset
	chainRawSession6     = "raw_session6"
	chainFromSession6    = "from_session6"
	chainDropPolicy6     = "drop_policy6"
	chainInputSession6   = "input_session6"
	chainOutputSession6  = "output_session6"
	chainAcceptNew6      = "accept_new6"
	setFlows6            = "flows6"    // ipv6_addr, dynamic, ct count per element: tracked v6 flows of a guest6
	setFlowRate6         = "flowrate6" // ipv6_addr, dynamic, limit per element: new v6 flow rate of a guest6
	icmp6AdminProhibited = 1           // ICMPv6 destination unreachable code 1
)

var (
	typeGuestPeer6  = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeIP6Addr)
	typeGuestPort6  = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeIP6Addr, nftables.TypeInetService)
	typeIfaceGuest6 = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIP6Addr)
)

// sessionSets6 are the v6 sets keyed by a guest (sessions6 after its
// interface name): what removing a session deletes from.
var sessionSets6 = append([]string{setSessions6, setPublic6, setStatic6, setStatic6Ports, setStatic6CIDR, setStatic6CIDRPorts,
	setAttested6, setAttested6Ports, setAttested6Live, setAttested6PortsLive, setDenied6, setReject6, setReset6, setFlows6, setFlowRate6, setPeers6, setInboundHost6}, nameCheckSets6...)

// addSets6 adds the v6 sets to a dual-stack daemon's schema.
func (s *schema) addSets6() {
	add := func(set *nftables.Set) {
		set.Table = s.table
		s.sets[set.Name] = set
		s.order = append(s.order, set.Name)
	}
	add(&nftables.Set{Name: setSessions6, KeyType: typeIfaceGuest6, Concatenation: true})
	add(&nftables.Set{Name: setBlocked6, KeyType: nftables.TypeIP6Addr, Interval: true})
	add(&nftables.Set{Name: setPublic6, KeyType: nftables.TypeIP6Addr})
	add(&nftables.Set{Name: setStatic6, KeyType: typeGuestPeer6, Concatenation: true})
	add(&nftables.Set{Name: setStatic6Ports, KeyType: typeGuestPort6, Concatenation: true})
	add(&nftables.Set{Name: setStatic6CIDR, KeyType: typeGuestPeer6, Concatenation: true, Interval: true})
	add(&nftables.Set{Name: setStatic6CIDRPorts, KeyType: typeGuestPort6, Concatenation: true, Interval: true})
	add(&nftables.Set{Name: setAttested6, KeyType: typeGuestPeer6, Concatenation: true, HasTimeout: true, Size: attestedSetSize})
	add(&nftables.Set{Name: setAttested6Ports, KeyType: typeGuestPort6, Concatenation: true, HasTimeout: true, Size: attestedSetSize})
	add(&nftables.Set{Name: setDenied6, KeyType: typeGuestPeer6, Concatenation: true, Interval: true})
	add(&nftables.Set{Name: setReject6, KeyType: nftables.TypeIP6Addr})
	add(&nftables.Set{Name: setReset6, KeyType: nftables.TypeIP6Addr})
	// Created by the datapath, one element per guest6 (the v4 ones' size).
	size := s.sets[setFlows].Size
	add(&nftables.Set{Name: setFlows6, KeyType: nftables.TypeIP6Addr, Dynamic: true, Size: size})
	add(&nftables.Set{Name: setFlowRate6, KeyType: nftables.TypeIP6Addr, Dynamic: true, Size: size})
	for _, set := range nameCheckSetDefs6() { // namecheck6.go
		add(set)
	}
	s.addLimitSets6(add)
	addPeerSets6(add)
	addLiveSets6(add) // refresh6.go
}

// limitFlows6 is limitFlows keyed by the v6 source.
func (env ruleEnv) limitFlows6() []expr.Any { return env.flowCount(setFlows6, loadSaddr6(reg1)) }

// limitRate6 is limitRate keyed by the v6 source.
func (env ruleEnv) limitRate6() []expr.Any { return env.flowRateOver(setFlowRate6, loadSaddr6(reg1)) }

// chainDefs6 are the v6 chains (regular chains: they go before the base
// chains that jump to them).
func chainDefs6() []chainDef {
	out := append([]chainDef{{name: chainDropPolicy6}}, reasonChainDefs6()...)
	out = append(out, chainDef{name: chainAcceptNew6})
	out = append(out, nameCheckChainDefs6()...)
	return append(out, []chainDef{{name: chainRawSession6}, {name: chainFromSession6}, {name: chainInputSession6}, {name: chainOutputSession6}}...)
}

// chainDefs returns the table's chains for this firewall.
func (f *Firewall) chainDefs() []chainDef {
	if !f.cfg.Pool6.IsValid() {
		return chainDefs()
	}
	return append(chainDefs6(), chainDefs()...)
}

func ip6Key(a netip.Addr) []byte {
	b := a.As16()
	return b[:]
}

func nfproto6() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.NFPROTO_IPV6}},
	}
}

func loadSaddr6(reg uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16}}
}

func loadDaddr6(reg uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16}}
}

// icmp6TypeIn matches ICMPv6 messages of type t.
func icmp6TypeIn(t byte) []expr.Any {
	ex := l4protoNumIs(unix.IPPROTO_ICMPV6)
	ex = append(ex, &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1})
	return append(ex, cmpEq(reg1, []byte{t}))
}

// lookupPair6 matches ip6 saddr . ip6 daddr in set.
func (env ruleEnv) lookupPair6(set string) []expr.Any {
	ex := append(loadSaddr6(reg32(0)), loadDaddr6(reg32(4))...)
	return append(ex, env.lookup(set, reg32(0), false)...)
}

// lookupPorts6 matches ip6 saddr . meta l4proto . ip6 daddr . th dport in set.
func (env ruleEnv) lookupPorts6(set string) []expr.Any {
	ex := loadSaddr6(reg32(0))
	ex = append(ex, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32(4)})
	ex = append(ex, loadDaddr6(reg32(5))...)
	ex = append(ex, loadDport(reg32(9))...)
	return append(ex, env.lookup(set, reg32(0), false)...)
}

// buildRules6 adds the dual-stack rules: into the v6 chains, and the
// dispatch rules into the base chains at the points buildRules calls it
// with (where names the point).
func buildRules6(env ruleEnv, where string, add func(chain string, parts ...[]expr.Any)) {
	if !env.pool6.IsValid() {
		return
	}
	accept := verdict(expr.VerdictAccept, "")
	drop := verdict(expr.VerdictDrop, "")
	gotoC := func(c string) []expr.Any { return verdict(expr.VerdictGoto, c) }
	fromSession := ifPrefix(expr.MetaKeyIIFNAME, env.prefix, true)
	toSession := ifPrefix(expr.MetaKeyOIFNAME, env.prefix, true)
	v6 := nfproto6()
	toDNS6 := append(loadDaddr6(reg1), cmpEq(reg1, ip6Key(env.dns6)))
	// Every rule of the v6 chains starts with "meta nfproto ipv6" although
	// only v6 packets get there: one compare, and nft then prints the
	// loads as ip6 saddr/daddr (as the v4 rules do for ip).
	add6 := func(chain string, parts ...[]expr.Any) { add(chain, append([][]expr.Any{v6}, parts...)...) }
	switch where {
	case chainRawPrerouting:
		add(chainRawPrerouting, fromSession, v6, gotoC(chainRawSession6))
		add6(chainRawSession6, routingHeader6(), drop)
		// A guest is no router: its RAs, redirects and solicitations go nowhere.
		for _, t := range []byte{133, 134, 137} {
			add6(chainRawSession6, icmp6TypeIn(t), drop)
		}
		// Neighbour discovery with the host side, on-link only (hop limit
		// 255, RFC 4861), from the addresses anti-spoofing cannot know
		// before it: the guest's link-local, which nsmgr pins (the kernel
		// generates none on a session's eth0), and :: for DAD probes. From
		// the guest's own v6 address it passes anti-spoofing below; from
		// any other address (another session's, with the guest's MAC in
		// its source link-layer option, or a made-up link-local one) it is
		// dropped there, so it never enters the host's neighbour table,
		// which a flood of made-up sources would fill for every session
		// (TestAttack6NDPGames, TestAttack6NeighbourFlood).
		for _, t := range []byte{135, 136} {
			add6(chainRawSession6, icmp6TypeIn(t), hopLimit255(), loadSaddr6(reg1), []expr.Any{cmpEq(reg1, ip6Key(guestLinkLocal6))}, accept)
		}
		add6(chainRawSession6, icmp6TypeIn(135), hopLimit255(), saddr6In(unspecified6), accept)
		ex := []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1}}
		ex = append(ex, loadSaddr6(reg32(4))...)
		add6(chainRawSession6, ex, env.lookup(setSessions6, reg1, true), gotoC(chainDropSpoofed6))
	case chainForward:
		add(chainForward, fromSession, v6, gotoC(chainFromSession6))
		// The server's packets of a pending flow: the checker reads its
		// acknowledgement of the checked bytes (namecheck6.go).
		add(chainForward, toSession, v6, ctMarkIs(CtMarkNamePending), gotoC(chainNameQueue))
		add(chainForward, toSession, v6, ctStateIn(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept)
		add(chainForward, toSession, v6, gotoC(chainDropInbound6))

		// Neighbour discovery is link-scoped: never forwarded. (raw_session6
		// let it past anti-spoofing for the host side's sake; conntrack does
		// not track it, so no state rule below would stop it.)
		for t := byte(133); t <= 137; t++ {
			add6(chainFromSession6, icmp6TypeIn(t), drop)
		}
		add6(chainFromSession6, env.dispatchBudget6())
		// The name check's pending and refused flows (namecheck6.go).
		add6(chainFromSession6, ctMarkIs(CtMarkNamePending), gotoC(chainNameQueue))
		add6(chainFromSession6, ctMarkIs(CtMarkNameRefused), gotoC(chainDropName6))
		add6(chainFromSession6, ctStateIn(expr.CtStateBitESTABLISHED), accept)
		add6(chainFromSession6, ctStateIn(expr.CtStateBitRELATED|expr.CtStateBitINVALID), drop)
		add6(chainFromSession6, env.lookupPair6(setDenied6), gotoC(chainDropDenied6))
		add6(chainFromSession6, env.peerRule6())
		add6(chainFromSession6, loadDaddr6(reg1), env.lookup(setBlocked6, reg1, false), gotoC(chainDropSpecial6))
		add6(chainFromSession6, env.dispatchGrants6())
		acceptNew, acceptNamed := gotoC(chainAcceptNew6), gotoC(chainAcceptNamed6)
		add6(chainFromSession6, env.lookupPorts6(setStatic6Ports), acceptNew)
		env.attested6Rules(add6, true) // refresh6.go
		for _, pp := range resolverPorts {
			add6(chainFromSession6, l4protoIs(pp.Proto), loadDport(reg1), []expr.Any{cmpEq(reg1, portKey(pp.Port)[:2])}, gotoC(chainDropResolver6))
		}
		add6(chainFromSession6, loadSaddr6(reg1), env.lookup(setNameCheck6Public, reg1, false), acceptNamed)
		add6(chainFromSession6, loadSaddr6(reg1), env.lookup(setPublic6, reg1, false), acceptNew)
		env.attested6Rules(add6, false)
		for _, set := range []string{setStatic6, setStatic6CIDR} {
			add6(chainFromSession6, env.lookupPair6(set), acceptNew)
		}
		add6(chainFromSession6, env.lookupPorts6(setStatic6CIDRPorts), acceptNew)
		add6(chainFromSession6, gotoC(chainDropNotAllowed6))

		// accept_new6: the session's v6 conntrack budget and flow rate
		// (a budget of their own, beside the v4 one), then accept.
		isNew := ctStateIn(expr.CtStateBitNEW)
		add6(chainAcceptNew6, isNew, env.limitFlows6(), gotoC(chainDropLimited6))
		add6(chainAcceptNew6, isNew, env.limitRate6(), gotoC(chainDropLimited6))
		add6(chainAcceptNew6, accept)
		nameCheckRules6(env, add6)

		env.reasonRules6(add, add6)

		add6(chainDropPolicy6, loadSaddr6(reg1), env.lookup(setReset6, reg1, false), l4protoIs(netpolicy.ProtoTCP),
			[]expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
		add6(chainDropPolicy6, loadSaddr6(reg1), env.lookup(setReject6, reg1, false),
			[]expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: icmp6AdminProhibited}})
		add6(chainDropPolicy6, drop)
	case chainInput:
		add(chainInput, fromSession, v6, gotoC(chainInputSession6))
		add(chainInput, v6, toDNS6, drop)
		for _, t := range []byte{135, 136} {
			add6(chainInputSession6, icmp6TypeIn(t), accept)
		}
		add6(chainInputSession6, toDNS6, dnsPort53(netpolicy.ProtoUDP), accept)
		// Established: the session's DNS over TCP, and replies to what
		// the host opened on a port the session names (peers6.go).
		add6(chainInputSession6, ctStateIn(expr.CtStateBitESTABLISHED), accept)
		add6(chainInputSession6, toDNS6, dnsPort53(netpolicy.ProtoTCP), accept)
		add6(chainInputSession6, drop)
	case chainOutput:
		// The host side's neighbour discovery and the v6 proxy's answers
		// (replies of tracked flows); nothing the host opens.
		add(chainOutput, toSession, v6, gotoC(chainOutputSession6))
		for _, t := range []byte{135, 136} {
			add6(chainOutputSession6, icmp6TypeIn(t), accept)
		}
		add6(chainOutputSession6, ctStateIn(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept)
		add6(chainOutputSession6, env.inboundRule6())
		add6(chainOutputSession6, gotoC(chainDropInbound6))
	case chainPostrouting:
		add(chainPostrouting, v6, saddr6In(env.pool6), ifPrefix(expr.MetaKeyOIFNAME, env.prefix, false), []expr.Any{&expr.Masq{}})
	}
}

var (
	// guestLinkLocal6 is the link-local address of every dual-stack
	// session's eth0 (nsmgr.GuestLinkLocal6, pinned there with address
	// generation off; TestAttack6NeighbourFlood checks the two agree).
	guestLinkLocal6 = netip.MustParseAddr("fe80::2")
	unspecified6    = netip.MustParsePrefix("::/128")
)

// routingHeader6 matches a packet with a routing header (any type: 0, 2
// Mobile IPv6, 3 RPL, 4 segment routing). The table judges a packet by its
// IPv6 destination, which is only a routing header's next segment: a
// guest naming an allowed destination first and a denied one after would
// reach the denied one through any server that processes the header
// (TestAttack6ExtensionHeaders performs it with segment routing). A
// session has no use for source routing; its packets carrying a routing
// header are dropped in raw_session6.
func routingHeader6() []expr.Any {
	return []expr.Any{
		&expr.Exthdr{Op: expr.ExthdrOpIpv6, Type: unix.IPPROTO_ROUTING, Len: 1, Flags: unix.NFT_EXTHDR_F_PRESENT, DestRegister: reg1},
		cmpEq(reg1, []byte{1}),
	}
}

func dnsPort53(proto netpolicy.Proto) []expr.Any {
	return append(append(l4protoIs(proto), loadDport(reg1)...), cmpEq(reg1, portKey(53)[:2]))
}

func hopLimit255() []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 7, Len: 1},
		cmpEq(reg1, []byte{255}),
	}
}

// saddr6In matches ip6 saddr inside p.
func saddr6In(p netip.Prefix) []expr.Any {
	mask := make([]byte, 16)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 1 << (7 - i%8)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 16, Mask: mask, Xor: make([]byte, 16)},
		cmpEq(reg1, ip6Key(p.Masked().Addr())),
	}
}

// blockedElements6 are the elements of blocked6 (see blockedElements).
func blockedElements6(g *netpolicy.Guard) []nftables.SetElement {
	var out []nftables.SetElement
	last := netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")
	for _, r := range g.BlockedRanges6() {
		out = append(out, nftables.SetElement{Key: ip6Key(r.First)})
		if r.Last != last {
			out = append(out, nftables.SetElement{Key: ip6Key(r.Last.Next()), IntervalEnd: true})
		}
	}
	return out
}

// guest6Of is the v6 address of the guest whose v4 address is guest: the
// ::2 of the /126 at the same slot index in Pool6 (nsmgr's layout).
func (f *Firewall) guest6Of(guest netip.Addr) netip.Addr {
	if !f.cfg.Pool6.IsValid() || !f.cfg.Pool.Contains(guest) {
		return netip.Addr{}
	}
	slot := (binary.BigEndian.Uint32(guest.AsSlice()) - binary.BigEndian.Uint32(f.cfg.Pool.Addr().AsSlice())) / 4
	b := f.cfg.Pool6.Addr().As16()
	binary.BigEndian.PutUint64(b[8:], binary.BigEndian.Uint64(b[8:])+uint64(slot)*4+2)
	return netip.AddrFrom16(b)
}

// splitFamilies splits targets into IPv4 and IPv6 ones.
func splitFamilies(ts []netpolicy.Target) (v4, v6 []netpolicy.Target) {
	for _, t := range ts {
		if a := t.Prefix.Addr(); a.Is6() && !a.Is4In6() {
			v6 = append(v6, t)
		} else {
			v4 = append(v4, t)
		}
	}
	return v4, v6
}

// sessionElements6 are the v6 elements of a dual-stack session.
func (f *Firewall) sessionElements6(r SessionRules) []setElems {
	g6 := f.guest6Of(r.Guest)
	if !g6.IsValid() {
		return nil
	}
	g := ip6Key(g6)
	out := []setElems{{setSessions6, []nftables.SetElement{{Key: concat(ifnameKey(r.HostIface), g)}}}}
	if r.Egress == netpolicy.ModePublic {
		out = append(out, setElems{setPublic6, []nftables.SetElement{{Key: g}}})
	}
	_, static := splitFamilies(r.Static)
	var hosts, hostPorts, cidrs, cidrPorts []nftables.SetElement
	for _, t := range netpolicy.ExpandProto(static) {
		r := prefixInterval(t.Prefix)
		switch {
		case t.Port == 0 && t.Prefix.IsSingleIP():
			hosts = append(hosts, nftables.SetElement{Key: concat(g, ip6Key(r.First))})
		case t.Port == 0:
			cidrs = append(cidrs, nftables.SetElement{Key: concat(g, ip6Key(r.First)), KeyEnd: concat(g, ip6Key(r.Last))})
		case t.Prefix.IsSingleIP():
			hostPorts = append(hostPorts, nftables.SetElement{Key: concat(g, protoKey(t.Proto), ip6Key(r.First), portKey(t.Port))})
		default:
			pr, po := protoKey(t.Proto), portKey(t.Port)
			cidrPorts = append(cidrPorts, nftables.SetElement{Key: concat(g, pr, ip6Key(r.First), po), KeyEnd: concat(g, pr, ip6Key(r.Last), po)})
		}
	}
	_, deny := splitFamilies(r.Deny)
	var denied []nftables.SetElement
	for _, p := range outermost(prefixesOf(deny)) { // a v6 deny entry drops its range on every port
		r := prefixInterval(p)
		denied = append(denied, nftables.SetElement{Key: concat(g, ip6Key(r.First)), KeyEnd: concat(g, ip6Key(r.Last))})
	}
	var reject, reset []nftables.SetElement
	if r.OnDeny.Answers() {
		reject = []nftables.SetElement{{Key: g}}
	}
	if r.OnDeny == netpolicy.DenyReset {
		reset = []nftables.SetElement{{Key: g}}
	}
	out = append(out, f.peerElements6(g, r)...)
	for _, se := range []setElems{{setStatic6, hosts}, {setStatic6Ports, hostPorts}, {setStatic6CIDR, cidrs},
		{setStatic6CIDRPorts, cidrPorts}, {setDenied6, denied}, {setReject6, reject}, {setReset6, reset}} {
		if len(se.elems) > 0 {
			out = append(out, se)
		}
	}
	return append(out, nameCheckElements6(g, r)...)
}

func prefixesOf(ts []netpolicy.Target) []netip.Prefix {
	var out []netip.Prefix
	for _, t := range ts {
		out = append(out, t.Prefix)
	}
	return out
}

// prefixInterval is the first and last address of a v6 prefix.
func prefixInterval(p netip.Prefix) netpolicy.AddrRange {
	p = p.Masked()
	b := p.Addr().As16()
	for i := p.Bits(); i < 128; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	return netpolicy.AddrRange{First: p.Addr(), Last: netip.AddrFrom16(b)}
}

// attestElements6 are the v6 elements of an answer's IPv6 addresses for
// the guest whose v6 address is g6, as attestElements' for v4: guest6 .
// ip in attested6 when a port-less entry allowed the name (and the resolver
// ports it names beside it in attested6_ports), else one guest6 . proto .
// ip . port element per port. IPv4 and v4-mapped addresses are skipped.
func attestElements6(g6 netip.Addr, ips []netip.Addr, timeout time.Duration, ports []netpolicy.PortSpec) []setElems {
	g := ip6Key(g6)
	anyPort := len(ports) == 0
	for _, p := range ports {
		if p.Port == 0 {
			anyPort = true
		}
	}
	var hosts, withPorts []nftables.SetElement
	for _, ip := range ips {
		if !ip.Is6() || ip.Is4In6() {
			continue
		}
		for _, p := range ports {
			if anyPort && !netpolicy.IsResolverPort(p.Port) || p.Port == 0 {
				continue
			}
			for _, proto := range protosOf(p.Proto) {
				withPorts = append(withPorts, nftables.SetElement{Key: concat(g, protoKey(proto), ip6Key(ip), portKey(p.Port)), Timeout: timeout})
			}
		}
		if anyPort {
			hosts = append(hosts, nftables.SetElement{Key: concat(g, ip6Key(ip)), Timeout: timeout})
		}
	}
	var out []setElems
	if len(hosts) > 0 {
		out = append(out, setElems{setAttested6, hosts})
	}
	if len(withPorts) > 0 {
		out = append(out, setElems{setAttested6Ports, withPorts})
	}
	return out
}

// attestElements6Of are the v6 elements of an answer's IPv6 addresses for
// the dual-stack guest whose v4 address is guest (see attestElements6);
// none without Pool6. AttestName sends them in the batch of the answer's
// v4 elements.
func (f *Firewall) attestElements6Of(guest netip.Addr, ips []netip.Addr, timeout time.Duration, ports []netpolicy.PortSpec) []setElems {
	g6 := f.guest6Of(guest)
	if !g6.IsValid() {
		return nil
	}
	return attestElements6(g6, ips, timeout, ports)
}

// removeGuests6Locked queues the deletion of every v6 element of the
// guests (by v4 address) for which gone is true; it returns how many.
func (f *Firewall) removeGuests6Locked(c *nftables.Conn, gone func(netip.Addr) bool) (int, error) {
	if !f.cfg.Pool6.IsValid() {
		return 0, nil
	}
	owners := map[netip.Addr]bool{}
	queued := 0
	for _, name := range sessionSets6 {
		set := f.schema.sets[name]
		elems, err := c.GetSetElements(set)
		if err != nil {
			return 0, fmt.Errorf("list set %s: %w", name, err)
		}
		var del []nftables.SetElement
		for _, e := range elems {
			off := 0
			if name == setSessions6 {
				off = ifNameSize
			}
			if len(e.Key) < off+16 {
				continue
			}
			g6 := netip.AddrFrom16([16]byte(e.Key[off : off+16]))
			mine, seen := owners[g6]
			if !seen {
				mine = f.gone6(g6, gone)
				owners[g6] = mine
				if g, ok := f.guest4Of6(g6); ok && mine {
					f.attested6.forget(g, nil)
				}
			}
			if mine {
				del = append(del, nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd})
			}
		}
		if err := addElements(c, set, del, true); err != nil {
			return 0, err
		}
		queued += len(del)
	}
	return queued, nil
}

// gone6 maps a guest6 back to its v4 guest and asks gone; an address of no
// slot (never ours) is gone.
func (f *Firewall) gone6(g6 netip.Addr, gone func(netip.Addr) bool) bool {
	g, ok := f.guest4Of6(g6)
	return !ok || gone(g)
}

// guest4Of6 is the v4 guest whose v6 address is g6 (the inverse of
// guest6Of); false for an address that is no slot's guest6.
func (f *Firewall) guest4Of6(g6 netip.Addr) (netip.Addr, bool) {
	if !f.cfg.Pool6.IsValid() || !g6.Is6() || !f.cfg.Pool6.Contains(g6) {
		return netip.Addr{}, false
	}
	base := f.cfg.Pool6.Addr().As16()
	a := g6.As16()
	if [8]byte(a[:8]) != [8]byte(base[:8]) { // slots live in the pool6's first /64
		return netip.Addr{}, false
	}
	off := binary.BigEndian.Uint64(a[8:]) - binary.BigEndian.Uint64(base[8:])
	if off%4 != 2 || off >= uint64(1)<<(32-f.cfg.Pool.Bits()) {
		return netip.Addr{}, false
	}
	v4 := binary.BigEndian.Uint32(f.cfg.Pool.Addr().AsSlice()) + uint32(off)
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v4)
	return netip.AddrFrom4(b), true
}

// allAttested6 adds a dual-stack table's attested v6 elements to out,
// under their sessions' v4 guests (see AllAttested); an element the
// refresh keeps alive (refresh6.go) with the later of its two expiries.
func (f *Firewall) allAttested6(out map[netip.Addr][]AttestedAddr) error {
	if !f.cfg.Pool6.IsValid() {
		return nil
	}
	type id struct {
		guest netip.Addr
		key   string
	}
	at := map[id]int{}
	for _, name := range []string{setAttested6, setAttested6Live, setAttested6Ports, setAttested6PortsLive} {
		elems, err := f.listSet(name)
		if err != nil {
			return err
		}
		for _, e := range elems {
			if len(e.Key) < 32 {
				continue
			}
			g, ok := f.guest4Of6(netip.AddrFrom16([16]byte(e.Key[:16])))
			if !ok {
				continue
			}
			a := AttestedAddr{Expires: e.Expires}
			switch len(e.Key) {
			case 32:
				a.IP = netip.AddrFrom16([16]byte(e.Key[16:32]))
			case 40: // guest6 . proto . ip . port
				a.IP = netip.AddrFrom16([16]byte(e.Key[20:36]))
				a.Port = binary.BigEndian.Uint16(e.Key[36:38])
				a.Proto = netpolicy.ProtoTCP
				if e.Key[16] == unix.IPPROTO_UDP {
					a.Proto = netpolicy.ProtoUDP
				}
			default:
				continue
			}
			k := id{g, string(e.Key)}
			if i, ok := at[k]; ok {
				out[g][i].Expires = max(out[g][i].Expires, a.Expires)
				continue
			}
			at[k] = len(out[g])
			out[g] = append(out[g], a)
		}
	}
	return nil
}
