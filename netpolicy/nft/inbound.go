package nft

import (
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// Inbound from the host. A packet the host itself sends to a session (from
// the daemon's netns: the node, any process on it, a hostNetwork pod) leaves
// through the output hook, never through forward, so forward's drop_inbound
// never sees it, and input_session admits the replies as established. The
// output chain closes that: towards a session veth it passes what the
// product itself sends into sessions and what the session named, and drops
// every other new connection as "inbound".
//
//	output (filter hook output, priority filter)
//	  oifname "P*" goto output_session
//	output_session
//	  meta nfproto != ipv4 drop
//	  ct state established,related accept                # replies to the session's own flows (DNS over TCP), ICMP errors about them
//	  ip saddr DNS udp sport 53 accept                   # the proxy's answers (untracked: raw_output)
//	  meta l4proto tcp tcp flags & rst != 0 accept       # resets the host sends for a session's flows (on-deny, revoke)
//	  meta l4proto icmp icmp type {3, 11, 12} accept     # ICMP errors the host's stack sends about a session's packets
//	  ip daddr . meta l4proto . th dport @inbound_host accept  # what the session names (--inbound-from-host)
//	  goto drop_inbound
//
// Resets and ICMP errors pass whatever their conntrack state: the kernel
// attaches a reject's reset to the flow it answers (related), but an ICMP
// error about a packet dropped before conntrack confirmed its flow, or a
// reset the daemon sends after deleting a flow, has no entry to relate to,
// and neither opens anything.
const (
	setInboundHost     = "inbound_host" // ipv4_addr . inet_proto . inet_service: guest . protocol . port the host may open connections to
	chainOutput        = "output"
	chainOutputSession = "output_session"
)

var typeGuestService = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)

// icmpErrorTypes are the ICMP types the host's own stack sends about a
// packet it received: destination unreachable, time exceeded, parameter
// problem.
var icmpErrorTypes = []byte{3, 11, 12}

// inboundRules adds the rules of the output hook (see above).
func inboundRules(env ruleEnv, add func(chain string, parts ...[]expr.Any)) {
	accept := verdict(expr.VerdictAccept, "")
	add(chainOutput, ifPrefix(expr.MetaKeyOIFNAME, env.prefix, true), verdict(expr.VerdictGoto, chainOutputSession))
	add(chainOutputSession, nfprotoIs(false), verdict(expr.VerdictDrop, ""))
	add(chainOutputSession, ctStateIn(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept)
	add(chainOutputSession, nfprotoIs(true), loadSaddr(reg1), []expr.Any{cmpEq(reg1, ipKey(env.dns))},
		l4protoIs(netpolicy.ProtoUDP), loadSport(reg1), []expr.Any{cmpEq(reg1, portKey(53)[:2])}, accept)
	add(chainOutputSession, l4protoIs(netpolicy.ProtoTCP), []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 1, Mask: []byte{0x04}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{0}},
	}, accept)
	for _, typ := range icmpErrorTypes {
		add(chainOutputSession, nfprotoIs(true), l4protoNumIs(unix.IPPROTO_ICMP), []expr.Any{
			&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			cmpEq(reg1, []byte{typ}),
		}, accept)
	}
	ex := loadDaddr(reg32(0))
	ex = append(ex, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32(1)})
	ex = append(ex, loadDport(reg32(2))...)
	add(chainOutputSession, nfprotoIs(true), ex, env.lookup(setInboundHost, reg32(0), false), accept)
	add(chainOutputSession, verdict(expr.VerdictGoto, chainDropInbound))
}

// inboundElements are the elements of a session's --inbound-from-host
// ports: guest . protocol . port, both protocols for a port given without
// one.
func inboundElements(r SessionRules) []setElems {
	g := ipKey(r.Guest)
	var elems []nftables.SetElement
	for _, p := range netpolicy.NormalizeInbound(r.InboundFromHost) {
		for _, proto := range protosOf(p.Proto) {
			elems = append(elems, nftables.SetElement{Key: concat(g, protoKey(proto), portKey(p.Port))})
		}
	}
	if len(elems) == 0 {
		return nil
	}
	return []setElems{{setInboundHost, elems}}
}
