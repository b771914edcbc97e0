package nft

import (
	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// Lab peers and inbound ports from the host for a dual-stack session's v6
// address (issue 26), as the v4 ones (elements.go, inbound.go):
//
//	from_session6 (after denied6, before blocked6: a peer is in the pool6)
//	  ip6 saddr . ip6 daddr @peers6 goto accept_new6       # guest6 . the lab target's guest6
//	output_session6 (before its last rule)
//	  ip6 daddr . meta l4proto . th dport @inbound_host6 accept  # what the session names (--inbound-from-host)
//	  goto drop_inbound6                                   # every other connection the host opens
const (
	setPeers6       = "peers6"        // ipv6_addr . ipv6_addr: guest6 . lab target's guest6
	setInboundHost6 = "inbound_host6" // ipv6_addr . inet_proto . inet_service: guest6 . protocol . port
)

var typeGuestService6 = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService)

// addPeerSets6 adds the sets of this file to a dual-stack schema.
func addPeerSets6(add func(*nftables.Set)) {
	add(&nftables.Set{Name: setPeers6, KeyType: typeGuestPeer6, Concatenation: true})
	add(&nftables.Set{Name: setInboundHost6, KeyType: typeGuestService6, Concatenation: true})
}

// peerRule6 is from_session6's lab peer rule.
func (env ruleEnv) peerRule6() []expr.Any {
	return append(env.lookupPair6(setPeers6), verdict(expr.VerdictGoto, chainAcceptNew6)...)
}

// inboundRule6 is output_session6's rule for the ports a session names.
func (env ruleEnv) inboundRule6() []expr.Any {
	ex := loadDaddr6(reg32(0))
	ex = append(ex, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32(4)})
	ex = append(ex, loadDport(reg32(5))...)
	ex = append(ex, env.lookup(setInboundHost6, reg32(0), false)...)
	return append(ex, verdict(expr.VerdictAccept, "")...)
}

// peerElements6 are a dual-stack session's peers6 and inbound_host6
// elements: its lab targets' v6 addresses (of their slots), its inbound
// ports on its v6 address.
func (f *Firewall) peerElements6(g6 []byte, r SessionRules) []setElems {
	var peers, inbound []nftables.SetElement
	for _, p := range r.Peers {
		if p6 := f.guest6Of(p.Unmap()); p6.IsValid() {
			peers = append(peers, nftables.SetElement{Key: concat(g6, ip6Key(p6))})
		}
	}
	for _, p := range netpolicy.NormalizeInbound(r.InboundFromHost) {
		for _, proto := range protosOf(p.Proto) {
			inbound = append(inbound, nftables.SetElement{Key: concat(g6, protoKey(proto), portKey(p.Port))})
		}
	}
	var out []setElems
	if len(peers) > 0 {
		out = append(out, setElems{setPeers6, peers})
	}
	if len(inbound) > 0 {
		out = append(out, setElems{setInboundHost6, inbound})
	}
	return out
}
