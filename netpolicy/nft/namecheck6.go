package nft

import (
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// The name check of dual-stack sessions' IPv6 flows (docs/network-model.md,
// "Names on shared addresses"): the same queue, verdict marks and conntrack
// marks as the v4 check's (the forward chain's first rule turns a verdict
// mark into the ct mark for both families: the table is inet), with sets
// keyed by the guest's v6 address and two chains of their own.
//
//	forward (the v6 dispatch, before "oifname P* meta nfproto ipv6 ct state established,related accept")
//	  oifname "P*" meta nfproto ipv6 ct mark NAME_PENDING goto name_queue   # the server's ACK confirms a checked flow
//	from_session6 (after the ND drops, before the state rules)
//	  ct mark NAME_PENDING goto name_queue                 # held for the name check
//	  ct mark NAME_REFUSED goto drop_name6                 # refused: answered
//	  KEY6 @attested6_ports goto accept_named6             # (was accept_new6)
//	  ip6 saddr @namecheck6_public goto accept_named6      # public, deny entries by name: every flow checked (before public6)
//	  ip6 saddr . ip6 daddr @attested6 goto accept_named6  # (was accept_new6)
//	accept_named6                                          # admitted because of a name
//	  meta l4proto udp ct mark NAME_OK accept              # a QUIC datagram the check passed (NF_REPEAT)
//	  udp dport 443 ip6 saddr @namecheck6_quic ct mark set NAME_PENDING   # --quic check
//	  meta l4proto tcp ip6 saddr @namecheck6 ct mark set NAME_PENDING
//	  ct mark NAME_PENDING ct state new add @flows6 { ip6 saddr ct count over MAXFLOWS } drop
//	  ct mark NAME_PENDING ct state new update @flowrate6 { ip6 saddr limit rate over RATE/second burst 2*RATE packets } drop
//	  ct mark NAME_PENDING goto name_queue                 # the SYN too: the checker learns where the bytes start
//	  udp dport 443 ip6 saddr @namecheck6 goto drop_quic6     # --quic refuse (reason quic, then drop_policy6): ICMPv6 under reject and reset
//	  goto accept_new6
//	drop_name6                                             # a refused flow's packets
//	  ip6 saddr @reject6 meta l4proto tcp reject with tcp reset   # established: ICMPv6 would be a soft error
//	  ip6 saddr @reject6 reject with icmpv6 admin-prohibited      # a refused QUIC flow
//	  drop                                                 # --on-deny drop
//
// The checker reads a v6 packet's TCP or UDP header directly after the
// fixed header: a guest's packet with extension headers before it (which
// the rules above see past, as conntrack does) refuses its flow.
const (
	setNameCheck6       = "namecheck6"        // ipv6_addr: guest6s whose name-admitted TCP flows are name-checked
	setNameCheck6Public = "namecheck6_public" // ipv6_addr: of those, public-mode guest6s with deny entries by name
	setNameCheck6QUIC   = "namecheck6_quic"   // ipv6_addr: of those, guest6s whose UDP/443 is checked (--quic check)
	chainAcceptNamed6   = "accept_named6"
	chainDropName6      = "drop_name6"
)

// nameCheckSets6 are the name check's v6 sets, all keyed by a guest6.
var nameCheckSets6 = []string{setNameCheck6, setNameCheck6Public, setNameCheck6QUIC}

// nameCheckSetDefs6 are nameCheckSets6's definitions.
func nameCheckSetDefs6() []*nftables.Set {
	var out []*nftables.Set
	for _, name := range nameCheckSets6 {
		out = append(out, &nftables.Set{Name: name, KeyType: nftables.TypeIP6Addr})
	}
	return out
}

// nameCheckChainDefs6 are the name check's v6 chains.
func nameCheckChainDefs6() []chainDef {
	return []chainDef{{name: chainAcceptNamed6}, {name: chainDropName6}}
}

// nameCheckElements6 are the name check's v6 elements of a session whose
// v6 address is g (sessionElements' for v4).
func nameCheckElements6(g []byte, r SessionRules) []setElems {
	if !r.NameCheck {
		return nil
	}
	out := []setElems{{setNameCheck6, []nftables.SetElement{{Key: g}}}}
	if r.Egress == netpolicy.ModePublic && r.DenyNames {
		out = append(out, setElems{setNameCheck6Public, []nftables.SetElement{{Key: g}}})
	}
	if r.QUICCheck {
		out = append(out, setElems{setNameCheck6QUIC, []nftables.SetElement{{Key: g}}})
	}
	return out
}

// nameCheckRules6 adds the rules of accept_named6 and drop_name6.
func nameCheckRules6(env ruleEnv, add6 func(chain string, parts ...[]expr.Any)) {
	accept := verdict(expr.VerdictAccept, "")
	drop := verdict(expr.VerdictDrop, "")
	gotoC := func(c string) []expr.Any { return verdict(expr.VerdictGoto, c) }
	in := func(set string) []expr.Any { return append(loadSaddr6(reg1), env.lookup(set, reg1, false)...) }
	quic := append(l4protoIs(netpolicy.ProtoUDP), append(loadDport(reg1), cmpEq(reg1, portKey(443)[:2]))...)
	pending := ctMarkIs(CtMarkNamePending)
	isNew := ctStateIn(expr.CtStateBitNEW)

	// A QUIC datagram the check passed comes back (NF_REPEAT) before its
	// flow is confirmed, as a new packet: it was counted when queued.
	add6(chainAcceptNamed6, l4protoIs(netpolicy.ProtoUDP), ctMarkIs(CtMarkNameOK), accept)
	add6(chainAcceptNamed6, quic, in(setNameCheck6QUIC), ctMarkSet(CtMarkNamePending))
	add6(chainAcceptNamed6, l4protoIs(netpolicy.ProtoTCP), in(setNameCheck6), ctMarkSet(CtMarkNamePending))
	// The session's v6 budget and flow rate (accept_new6's), for the
	// flows that go to the checker instead of accept_new6.
	add6(chainAcceptNamed6, pending, isNew, env.limitFlows6(), drop)
	add6(chainAcceptNamed6, pending, isNew, env.limitRate6(), drop)
	add6(chainAcceptNamed6, pending, gotoC(chainNameQueue))
	add6(chainAcceptNamed6, quic, in(setNameCheck6), gotoC(chainDropQUIC6))
	add6(chainAcceptNamed6, gotoC(chainAcceptNew6))

	// A refused flow is established: a reset ends it under reject and
	// reset alike (v4's reject_session), ICMPv6 answers a QUIC one.
	add6(chainDropName6, in(setReject6), l4protoIs(netpolicy.ProtoTCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
	add6(chainDropName6, in(setReject6), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: icmp6AdminProhibited}})
	add6(chainDropName6, drop)
}
