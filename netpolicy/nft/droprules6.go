package nft

import (
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// The drop reasons of a dual-stack session's v6 packets: every v6 drop
// point goes through a reason chain of its own, as the v4 ones do, and
// counts and logs under the session's v4 guest (the key of @acct_reason,
// @acct_drop, @acct_limited and @lograte, and what a drop line's Guest
// is): the chain first marks the packet with the guest of its session
// interface (meta mark set iifname map @ifaces, oifname for inbound), as
// drop_spoofed does for a spoofed v4 packet, and keys every update on the
// mark. The packet is dropped (or answered) in the same chain, so the mark
// goes nowhere.
//
//	drop_<reason>6
//	  meta mark set iifname map @ifaces
//	  meta nfproto ipv6 meta mark != 0 update @acct_reason { meta mark . CODE }
//	  [ct state new] meta nfproto ipv6 meta mark != 0 update @lograte { meta mark limit rate over R/s } update @acct_reason { meta mark . 255 } FINAL
//	  [ct state new] meta nfproto ipv6 meta mark != 0 log prefix "P:REASON" group G snaplen 64
//	  FINAL
//	drop_limited6: the same with update @acct_limited { meta mark } and
//	  update @acct_drop { meta mark } as its counts
//	drop_policy6 (first rule): meta mark != 0 update @acct_drop { meta mark }
//
// FINAL is "goto drop_policy6" (reject, reset or drop by the session's
// --on-deny) for the reasons the v4 table answers, "drop" for spoofed,
// inbound and rate-limit. There is no v6 "port" reason (a destination
// allowed on other ports only is not-allowed over v6); of the name
// check's reasons, the table's own is quic (--quic refuse, namecheck6.go),
// name-mismatch is the checker's.

const (
	chainDropNotAllowed6 = "drop_not_allowed6"
	chainDropSpecial6    = "drop_special6"
	chainDropResolver6   = "drop_resolver6"
	chainDropSpoofed6    = "drop_spoofed6"
	chainDropInbound6    = "drop_inbound6"
	chainDropDenied6     = "drop_denied6"
	chainDropBudget6     = "drop_budget6"
	chainDropGrantUsed6  = "drop_grant_used6"
	chainDropLimited6    = "drop_limited6"
	chainDropQUIC6       = "drop_quic6"
)

// reasonChains6 are the v6 reason chains by reason.
var reasonChains6 = []struct{ reason, chain string }{
	{netpolicy.ReasonNotAllowed, chainDropNotAllowed6},
	{netpolicy.ReasonSpecialPurpose, chainDropSpecial6},
	{netpolicy.ReasonResolver, chainDropResolver6},
	{netpolicy.ReasonSpoofed, chainDropSpoofed6},
	{netpolicy.ReasonInbound, chainDropInbound6},
	{netpolicy.ReasonDenied, chainDropDenied6},
	{netpolicy.ReasonBudget, chainDropBudget6},
	{netpolicy.ReasonGrantUsed, chainDropGrantUsed6},
	{netpolicy.ReasonQUIC, chainDropQUIC6},
}

// reasonChainDefs6 are the v6 reason chains (regular chains).
func reasonChainDefs6() []chainDef {
	out := []chainDef{{name: chainDropLimited6}}
	for _, rc := range reasonChains6 {
		out = append(out, chainDef{name: rc.chain})
	}
	return out
}

// markGuestOut is markGuest by the output interface: a packet going into
// a session.
func (env ruleEnv) markGuestOut() []expr.Any {
	s := env.set(setIfaces)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: reg1},
		&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: s.Name, SetID: s.ID},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}
}

// updateMark runs "update @set { meta mark }" for a packet marked with its
// guest (markGuest): the v6 packets' key of the v4 guest's counters.
func (env ruleEnv) updateMark(set string) []expr.Any {
	s := env.set(set)
	return append(env.loadGuest(guestByIface), &expr.Dynset{SrcRegKey: reg32(0), SetName: s.Name, SetID: s.ID, Operation: unix.NFT_DYNSET_OP_UPDATE})
}

// reasonRules6 are the rules of the v6 reason chains, added with add6
// (which puts "meta nfproto ipv6" first).
func (env ruleEnv) reasonRules6(add, add6 func(chain string, parts ...[]expr.Any)) {
	gotoC := func(c string) []expr.Any { return verdict(expr.VerdictGoto, c) }
	drop := verdict(expr.VerdictDrop, "")
	for _, rc := range reasonChains6 {
		code, _ := codeOfReason(rc.reason)
		d := dropCode{reason: rc.reason, code: code, chain: rc.chain}
		mark, final := env.markGuest(), gotoC(chainDropPolicy6)
		switch rc.reason {
		case netpolicy.ReasonSpoofed:
			final = drop
		case netpolicy.ReasonInbound:
			mark, final = env.markGuestOut(), drop
			// Not towards a session's own address: nothing to count.
			ex := append([]expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: reg1}}, loadDaddr6(reg32(4))...)
			add6(rc.chain, ex, env.lookup(setSessions6, reg1, true), drop)
		}
		onlyNew := rc.reason != netpolicy.ReasonSpoofed && rc.reason != netpolicy.ReasonBudget
		rules := env.reasonRulesFam(nfproto6(), d, guestByIface, onlyNew, final)
		add6(rc.chain, mark)
		for _, r := range rules[1 : len(rules)-1] {
			add(rc.chain, r)
		}
		add6(rc.chain, final)
	}
	// rate-limit: counted in @acct_limited, never answered.
	limited := env.reasonRulesFam(nfproto6(), dropCode{reason: netpolicy.ReasonRateLimit}, guestByIface, true, drop)
	add6(chainDropLimited6, limited[0])
	add6(chainDropLimited6, env.updateMark(setAcctLimited))
	add6(chainDropLimited6, env.updateMark(setAcctDrop)) // rate-limited packets are in DroppedPackets too
	for _, r := range limited[2 : len(limited)-1] {
		add(chainDropLimited6, r)
	}
	add6(chainDropLimited6, drop)
	// Every v6 drop of a session's own packet the reason chains send to
	// drop_policy6 counts in its @acct_drop.
	add6(chainDropPolicy6, env.updateMark(setAcctDrop))
}
