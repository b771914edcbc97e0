package nft

import (
	"hash/fnv"

	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// dropCode is a reason's number in @acct_reason keys (guest . code). The
// counts of rate-limit are @acct_limited's; codeUnlogged counts the log
// lines the session's log budget suppressed.
type dropCode struct {
	reason string
	code   uint32
	chain  string
}

const codeUnlogged = 255

var dropCodes = []dropCode{
	{netpolicy.ReasonNotAllowed, 1, chainDropNotAllowed},
	{netpolicy.ReasonPort, 2, chainDropPort},
	{netpolicy.ReasonSpecialPurpose, 3, chainDropSpecial},
	{netpolicy.ReasonResolver, 4, chainDropResolver},
	{netpolicy.ReasonSpoofed, 5, chainDropSpoofed},
	{netpolicy.ReasonInbound, 6, chainDropInbound},
	{netpolicy.ReasonDenied, 7, chainDropDenied},
	{netpolicy.ReasonBudget, 8, chainDropBudget},
	{netpolicy.ReasonGrantUsed, 9, chainDropGrantUsed},
	{netpolicy.ReasonNameMismatch, 10, chainDropName},
	{netpolicy.ReasonQUIC, 11, chainDropQUIC},
	{"", codeUnlogged, ""},
}

// reasonKey is a code as the mark half of an @acct_reason key (a mark is in
// host byte order, as the immediate the rules load).
func reasonKey(code uint32) []byte { return binaryutil.NativeEndian.PutUint32(code) }

// reasonOfCode returns the reason an @acct_reason code counts.
func reasonOfCode(code uint32) (string, bool) {
	for _, d := range dropCodes {
		if d.code == code && d.reason != "" {
			return d.reason, true
		}
	}
	return "", false
}

// DefaultLogRate is each session's drop-log budget when FirewallConfig
// leaves LogRate zero: log lines per second, with a burst of twice that.
const DefaultLogRate = 10

// logSnaplen is what NFLOG copies of a dropped packet: the longest IPv4
// header (60 bytes) and the transport ports.
const logSnaplen = 64

// defaultLogGroup derives the NFLOG group from the prefix, so two daemons
// with different prefixes on one host do not bind the same group (a group
// takes one listener per netns). Groups 0 to 999 are left to others.
func defaultLogGroup(prefix string) uint16 {
	h := fnv.New32a()
	h.Write([]byte(prefix))
	return uint16(1000 + h.Sum32()%64000)
}

// logPrefix is the NFLOG prefix of a reason: "<prefix>:<reason>", at most
// 24 bytes (the kernel's limit is 127, nft's 63 with the NUL).
func logPrefix(prefix, reason string) string { return prefix + ":" + reason }

// guestKey says where a reason chain finds the session's address.
type guestKey int

const (
	guestIsSaddr guestKey = iota // from the session: ip saddr
	guestIsDaddr                 // towards the session: ip daddr
	guestByIface                 // a spoofed source: the packet's mark, set from @ifaces
)

// loadGuest loads the guest address into reg32(0). For guestByIface it
// is the packet's mark, which markGuest set to the guest of the interface
// (the bytes of the address, as the ifaces map holds them): nft cannot
// print a map lookup inside a set key, and the mark is what NFLOG reports
// with the packet (NFULA_MARK). The packet is dropped in the same chain,
// so the mark goes nowhere; a packet crossing into the daemon's netns
// arrives with mark 0 (the veth scrubs it).
func (env ruleEnv) loadGuest(k guestKey) []expr.Any {
	switch k {
	case guestIsDaddr:
		return loadDaddr(reg32(0))
	case guestByIface:
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: reg32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg32(0), Data: []byte{0, 0, 0, 0}}, // no session's interface
		}
	}
	return loadSaddr(reg32(0))
}

// markGuest runs "meta mark set iifname map @ifaces": the rule ends, and
// the mark stays 0, when the interface is no session's.
func (env ruleEnv) markGuest() []expr.Any {
	s := env.set(setIfaces)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: s.Name, SetID: s.ID},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}
}

// countReason runs "update @acct_reason { GUEST . code }".
func (env ruleEnv) countReason(k guestKey, code uint32) []expr.Any {
	s := env.set(setAcctReason)
	ex := env.loadGuest(k)
	return append(ex,
		&expr.Immediate{Register: reg32(1), Data: reasonKey(code)},
		&expr.Dynset{SrcRegKey: reg32(0), SetName: s.Name, SetID: s.ID, Operation: unix.NFT_DYNSET_OP_UPDATE})
}

// overLogRate matches when the guest has spent its log budget:
// update @lograte { GUEST limit rate over R/second burst 2*R packets }.
func (env ruleEnv) overLogRate(k guestKey) []expr.Any {
	s := env.set(setLogRate)
	return append(env.loadGuest(k), &expr.Dynset{SrcRegKey: reg32(0), SetName: s.Name, SetID: s.ID,
		Operation: unix.NFT_DYNSET_OP_UPDATE,
		Exprs: []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(env.logRate), Over: true,
			Unit: expr.LimitTimeSecond, Burst: 2 * env.logRate}}})
}

func (env ruleEnv) logAs(reason string) []expr.Any {
	return []expr.Any{&expr.Log{
		Key:     1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN,
		Group:   env.logGroup,
		Snaplen: logSnaplen,
		Data:    []byte(logPrefix(env.prefix, reason)),
	}}
}

// reasonRules are the rules of one reason's chain:
//
//	[meta mark set iifname map @ifaces]                  # spoofed: the guest of the interface
//	update @acct_reason { GUEST . CODE }                 # every packet, exactly
//	[ct state new] update @lograte { GUEST limit rate over R/s } update @acct_reason { GUEST . 255 } FINAL
//	[ct state new] log prefix "P:REASON" group G snaplen 64
//	FINAL
//
// FINAL is "goto drop_session" for the session's own packets (counted in
// acct_drop) and "drop" for the others. Only the first packet of a flow is
// logged (ct state new; raw_prerouting has no conntrack yet, so a spoofed
// packet is logged whatever its state), and only within the session's log
// budget; what the budget suppresses is counted (code 255), so the daemon
// can say how many were not logged. Each step is a rule of its own: a
// dynset that cannot insert (a full set) ends its rule, and the verdict
// must not depend on accounting.
func (env ruleEnv) reasonRules(d dropCode, k guestKey, onlyNew bool, final []expr.Any) [][]expr.Any {
	return env.reasonRulesFam(nfprotoIs(true), d, k, onlyNew, final)
}

// reasonRulesFam is reasonRules for the packets of one family (v4 is the
// rules' "meta nfproto" match; droprules6.go makes the v6 ones).
func (env ruleEnv) reasonRulesFam(v4 []expr.Any, d dropCode, k guestKey, onlyNew bool, final []expr.Any) [][]expr.Any {
	var isNew []expr.Any
	if onlyNew {
		isNew = ctStateIn(expr.CtStateBitNEW)
	}
	cat := func(parts ...[]expr.Any) []expr.Any {
		var ex []expr.Any
		for _, p := range parts {
			ex = append(ex, p...)
		}
		return ex
	}
	var guestKnown []expr.Any
	var first [][]expr.Any
	if k == guestByIface {
		guestKnown = env.loadGuest(k) // no session's interface: nothing to log
		first = [][]expr.Any{env.markGuest()}
	}
	return append(first,
		cat(v4, env.countReason(k, d.code)),
		cat(isNew, v4, env.overLogRate(k), env.countReason(k, codeUnlogged), final),
		cat(isNew, v4, guestKnown, env.logAs(d.reason)),
		final,
	)
}

// lookupSessionOut matches oifname . ip daddr in (invert: not in) @sessions.
func (env ruleEnv) lookupSessionOut(invert bool) []expr.Any {
	ex := []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: reg1}}
	ex = append(ex, loadDaddr(reg32(4))...)
	return append(ex, env.lookup(setSessions, reg1, invert)...)
}
