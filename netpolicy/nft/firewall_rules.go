package nft

import (
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// Registers. A 16-byte value (an interface name) loaded into NFT_REG_1 fills
// the 32-bit registers 0..3; concatenations put each following field in the
// next 32-bit register, which is how the kernel reads a concatenated key.
const (
	reg1     = unix.NFT_REG_1
	reg32_00 = unix.NFT_REG32_00
)

func reg32(n uint32) uint32 { return reg32_00 + n }

// icmpAdminProhibited is ICMP destination unreachable code 13,
// "communication administratively prohibited" (RFC 1812).
const icmpAdminProhibited = 13

// connlimitOver is NFT_CONNLIMIT_F_INV: "ct count over N" matches when the
// count exceeds N (golang.org/x/sys/unix does not define it).
const connlimitOver = 1

// resolverPorts are the destination ports no session reaches through a
// port-less entry or public mode: DNS and DNS over TLS, which only the
// anycast proxy serves.
var resolverPorts = []netpolicy.PortSpec{
	{Port: 53, Proto: netpolicy.ProtoUDP}, {Port: 53, Proto: netpolicy.ProtoTCP},
	{Port: 853, Proto: netpolicy.ProtoTCP}, {Port: 853, Proto: netpolicy.ProtoUDP},
}

// ruleSpec is one rule of one chain, as plain data.
type ruleSpec struct {
	chain string
	exprs []expr.Any
}

// ruleEnv is what the rules depend on.
type ruleEnv struct {
	prefix   string        // interface name prefix of session veths
	pool     netip.Prefix  // masquerade source range
	dns      netip.Addr    // DNS anycast address
	maxFlows uint32        // per-session concurrent flows
	flowRate uint32        // per-session new flows per second
	logRate  uint32        // per-session drop-log lines per second
	logGroup uint16        // NFLOG group of the drop log
	queue    uint16        // NFQUEUE number of the name check
	refresh  time.Duration // life of a live element after the flow that refreshed it; 0: no refresh
	pool6    netip.Prefix  // dual-stack sessions' pool (firewall6.go); invalid: IPv4-only
	dns6     netip.Addr    // the v6 DNS anycast address
	set      func(name string) *nftables.Set
}

// Every rule of the table, in order. The chains never change per session
// (a session's counted limits have chains of their own: limits.go).
//
//	raw_prerouting (filter hook prerouting, priority raw: before conntrack)
//	  iifname "P*" meta nfproto != ipv4 drop
//	  iifname "P*" iifname . ip saddr != @sessions goto drop_spoofed  # anti-spoofing, before conntrack sees the packet
//	  iifname "P*" ip daddr DNS udp dport 53 notrack       # queries to the proxy cost no conntrack entry
//	raw_output (filter hook output, priority raw)
//	  oifname "P*" ip saddr DNS udp sport 53 notrack       # the proxy's answers, likewise
//	forward (filter hook forward, policy accept)
//	  meta mark NAME_OK ct mark set NAME_OK meta mark set 0      # the name check's verdict (NF_REPEAT)
//	  meta mark NAME_REFUSED ct mark set NAME_REFUSED meta mark set 0
//	  iifname "P*" goto from_session
//	  oifname "P*" meta nfproto != ipv4 drop
//	  oifname "P*" ct mark NAME_PENDING goto name_queue    # the server's ACK confirms a checked flow
//	  oifname "P*" ct state established,related goto accept_return  # return traffic into a session
//	  oifname "P*" goto drop_inbound                       # new connections into sessions
//	from_session
//	  ct mark NAME_PENDING goto name_queue                 # held for the name check
//	  ct mark NAME_REFUSED goto drop_name                  # refused: answered, counted as name-mismatch
//	  ct state established goto accept_session
//	  ct state related goto related_session
//	  ct state invalid goto drop_session
//	  goto policy
//	related_session                                        # ICMP errors a session sends
//	  meta l4proto != icmp goto drop_session               # nothing else is related (no helpers)
//	  iifname . @th,192,32 != @sessions goto drop_session  # about anyone else's flow
//	  ip daddr . ip saddr @peers goto accept_session       # back to a lab peer
//	  goto policy                                          # about its own flow: judged like a new packet
//	policy
//	  ip saddr . ip daddr @denied goto drop_denied           # deny entries: before every accept
//	  ip saddr . meta l4proto . ip daddr . th dport @denied_ports goto drop_denied
//	  ip saddr . ip daddr @peers goto accept_new            # lab peers (before the guard: they are in the pool)
//	  ip daddr @blocked goto drop_special                   # SSRF guard, every mode
//	  meta l4proto {tcp,udp} th dport {53,853} goto resolver
//	  ip saddr @namecheck_public goto accept_named          # public, deny entries by name: every flow checked
//	  ip saddr @public goto accept_new
//	  ip saddr . ip daddr @attested update @attested_live { ip saddr . ip daddr timeout REFRESH }
//	  ip saddr . ip daddr @attested goto accept_named
//	  ip saddr . ip daddr @attested_live update @attested_live { ip saddr . ip daddr timeout REFRESH } goto accept_named
//	  (the same three for the ports: KEY = ip saddr . meta l4proto . ip daddr . th dport)
//	  KEY @attested_ports update @attested_ports_live { KEY timeout REFRESH }
//	  KEY @attested_ports goto accept_new
//	  KEY @attested_ports_live update @attested_ports_live { KEY timeout REFRESH } goto accept_new
//	  ip saddr . ip daddr @pinned goto accept_named        # pinned names under the name check (also in static)
//	  ip saddr . meta l4proto . ip daddr . th dport @pinned_ports goto accept_named
//	  ip saddr . ip daddr @static goto accept_new
//	  ip saddr . meta l4proto . ip daddr . th dport @static_ports goto accept_new
//	  ip saddr . ip daddr @static_cidr goto accept_new
//	  ip saddr . meta l4proto . ip daddr . th dport @static_cidr_ports goto accept_new
//	  ip saddr . ip daddr @port_hosts goto drop_port        # allowed on other ports only
//	  ip saddr . ip daddr @port_attested goto drop_port
//	  ip saddr . ip daddr @port_cidrs goto drop_port
//	  goto drop_not_allowed
//	resolver                                               # DNS and DoT: only entries that name the port
//	  the three attested_ports rules of policy
//	  ip saddr . meta l4proto . ip daddr . th dport @static_ports goto accept_new
//	  ip saddr . meta l4proto . ip daddr . th dport @static_cidr_ports goto accept_new
//	  goto drop_resolver
//	flow_limit                                             # the session's conntrack budget
//	  ct state new add @flows { ip saddr ct count over MAXFLOWS } goto drop_limited
//	  ct state new update @flowrate { ip saddr limit rate over RATE/second burst 2*RATE packets } goto drop_limited
//	accept_named                                           # admitted because of a name
//	  meta l4proto udp ct mark NAME_OK accept              # a QUIC datagram the check passed (NF_REPEAT), counted when queued
//	  udp dport 443 ip saddr @namecheck_quic jump flow_limit   # --quic check: held like TCP
//	  udp dport 443 ip saddr @namecheck_quic ct mark set NAME_PENDING
//	  meta l4proto tcp ip saddr @namecheck jump flow_limit
//	  meta l4proto tcp ip saddr @namecheck ct mark set NAME_PENDING
//	  ct mark NAME_PENDING update @acct_accept { ip saddr }
//	  ct mark NAME_PENDING goto name_queue                 # the SYN too: the checker learns where the bytes start
//	  udp dport 443 ip saddr @namecheck goto drop_quic     # --quic refuse: QUIC's name is not read, clients fall back to TCP
//	  goto accept_new
//	name_queue:     xt NFQUEUE num Q (no bypass: nobody reading means dropped)
//	accept_new:     jump flow_limit; goto accept_session
//	accept_session: update @acct_accept { ip saddr }; accept
//	accept_return:  update @acct_return { ip daddr }; accept  # counted: downloads are replies
//	drop_session:   update @acct_drop { ip saddr }; drop
//	drop_limited:   update @acct_limited { ip saddr }; LOG(rate-limit); goto drop_session
//	drop_not_allowed, drop_port, drop_special, drop_resolver, drop_denied, drop_name, drop_quic:
//	                update @acct_reason { ip saddr . CODE }; LOG(reason); goto drop_policy
//	drop_policy:    ip saddr @reject goto reject_session; goto drop_session
//	reject_session: update @acct_drop { ip saddr }    # --on-deny reject or reset: the session's own packets only
//	                ip saddr @reset meta l4proto tcp reject with tcp reset   # reset: connect says ECONNREFUSED
//	                ct mark NAME_REFUSED meta l4proto tcp reject with tcp reset  # an established flow: ICMP would be a soft error
//	                reject with icmp admin-prohibited      # reject (and reset's non-TCP): connect says EHOSTUNREACH
//	drop_spoofed:   update @acct_reason { iifname map @ifaces . 5 }; LOG(spoofed); drop
//	drop_inbound:   oifname . ip daddr != @sessions drop
//	                update @acct_reason { ip daddr . 6 }; LOG(inbound); drop
//	  LOG(reason) is the log budget and the NFLOG line of reasonRules (droprules.go)
//	input (filter hook input, policy accept)
//	  iifname "P*" goto input_session
//	  ip daddr DNS drop                                    # the anycast address answers session veths only
//	input_session
//	  ip daddr DNS udp dport 53 accept                     # untracked (raw_prerouting)
//	  ct state established accept                          # the session's own DNS over TCP
//	  ct state related meta l4proto icmp iifname . @th,192,32 @sessions ip daddr DNS accept
//	  ip daddr DNS tcp dport 53 jump flow_limit
//	  ip daddr DNS tcp dport 53 accept
//	  goto drop_not_allowed                                # the daemon's API, host services, other gateways
//	postrouting (nat hook postrouting, srcnat)
//	  meta nfproto ipv4 ip saddr POOL oifname != "P*" masquerade
//
// Why this order is sound: every packet from a session veth passes the
// anti-spoofing check before conntrack looks at it, so the tuple conntrack
// matches carries the session's own address: it can only ever hit the
// session's own flows. The one exception is an ICMP error, whose conntrack
// match is the flow its quoted header names (anyone's); related_session
// accepts such an error only when that flow is the session's own (original
// source) or one a lab peer opened into it (reply source), and then judges
// its destination by the policy and the guard like a new packet.
//
// The accounting update and the verdict are separate rules: a dynset that
// cannot insert (a full set) ends its rule, and the verdict must not depend on
// accounting. The same holds for the refresh of an attested element: the
// update of its live set is a rule of its own before the verdict.
//
// The refresh (REFRESH > 0, see FirewallConfig.AttestMaxLifetime): a new
// flow accepted by a DNS-attested element creates or refreshes the same key
// in the live set, with a timeout of REFRESH; a live element accepts new
// flows and refreshes itself. The DNS answers' elements keep their own
// expiry (a refresh never shortens what an answer allowed), and only new
// flows pass here, so only they refresh. The datapath can only write keys it
// just found in an attested set (or in the live set itself); the daemon's
// sweep deletes every live element whose attestation is older than the
// maximum lifetime, was revoked, or belongs to no session. A packet that
// found a key just before its deletion may create it again after it: the
// sweep removes such an element too.
func buildRules(env ruleEnv) []ruleSpec {
	var rs []ruleSpec
	add := func(chain string, parts ...[]expr.Any) {
		var ex []expr.Any
		for _, p := range parts {
			ex = append(ex, p...)
		}
		rs = append(rs, ruleSpec{chain, ex})
	}
	p := env.prefix
	accept := verdict(expr.VerdictAccept, "")
	drop := verdict(expr.VerdictDrop, "")
	gotoC := func(c string) []expr.Any { return verdict(expr.VerdictGoto, c) }
	jump := func(c string) []expr.Any { return verdict(expr.VerdictJump, c) }
	fromSession := ifPrefix(expr.MetaKeyIIFNAME, p, true)
	toSession := ifPrefix(expr.MetaKeyOIFNAME, p, true)
	// Every rule reading IPv4 headers carries "meta nfproto ipv4" although
	// raw_prerouting already dropped everything else from sessions: it costs
	// one compare, and nft can then print the rules as ip saddr/daddr.
	v4 := nfprotoIs(true)
	toDNS := append(loadDaddr(reg1), cmpEq(reg1, ipKey(env.dns)))
	fromDNS := append(loadSaddr(reg1), cmpEq(reg1, ipKey(env.dns)))
	dnsPort := func(proto netpolicy.Proto, dport bool) []expr.Any {
		port := loadDport(reg1)
		if !dport {
			port = loadSport(reg1)
		}
		return append(append(l4protoIs(proto), port...), cmpEq(reg1, portKey(53)[:2]))
	}

	// raw_prerouting
	buildRules6(env, chainRawPrerouting, add)
	add(chainRawPrerouting, fromSession, nfprotoIs(false), drop)
	add(chainRawPrerouting, fromSession, v4, env.lookupSession(true), gotoC(chainDropSpoofed))
	add(chainRawPrerouting, fromSession, v4, toDNS, dnsPort(netpolicy.ProtoUDP, true), []expr.Any{&expr.Notrack{}})
	// raw_output
	add(chainRawOutput, toSession, v4, fromDNS, dnsPort(netpolicy.ProtoUDP, false), []expr.Any{&expr.Notrack{}})

	// forward. The name check's verdict comes back as the packet's mark
	// (NF_REPEAT re-enters this chain): it becomes the flow's conntrack
	// mark, and the packet's mark goes. One rule for both verdicts (they
	// differ in the lowest bit only): every forwarded packet of the host
	// passes this test.
	add(chainForward, verdictMarkIs(), ctMarkFromMetaMark(), metaMarkSet(0))
	buildRules6(env, chainForward, add)
	add(chainForward, fromSession, gotoC(chainFromSession))
	add(chainForward, toSession, nfprotoIs(false), drop)
	// The server's packets of a pending flow: the checker reads its
	// acknowledgement of the checked bytes.
	add(chainForward, toSession, ctMarkIs(CtMarkNamePending), gotoC(chainNameQueue))
	add(chainForward, toSession, ctStateIn(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), gotoC(chainAcceptReturn))
	add(chainForward, toSession, gotoC(chainDropInbound))

	// from_session. A session with a byte budget jumps to its own chain
	// first (limits.go): its established packets are counted and cut too,
	// a flow the name check holds included. Then a pending flow's packets
	// go to the checker; a refused flow's are answered as the policy's drops.
	add(chainFromSession, v4, loadSaddr(reg1), env.vmap(setBudgetChains))
	add(chainFromSession, ctMarkIs(CtMarkNamePending), gotoC(chainNameQueue))
	add(chainFromSession, ctMarkIs(CtMarkNameRefused), gotoC(chainDropName))
	add(chainFromSession, ctStateIn(expr.CtStateBitESTABLISHED), gotoC(chainAccept))
	add(chainFromSession, ctStateIn(expr.CtStateBitRELATED), gotoC(chainRelated))
	add(chainFromSession, ctStateIn(expr.CtStateBitINVALID), gotoC(chainDrop))
	add(chainFromSession, gotoC(chainPolicy))

	// related_session: conntrack relates an ICMP error to the flow its
	// quoted header names, whoever's it is; no helpers are assigned, so
	// nothing else is related.
	icmp := l4protoNumIs(unix.IPPROTO_ICMP)
	// Each test once: not ICMP, or about another's flow, drop; back to a lab
	// peer, accept; else the policy.
	add(chainRelated, l4protoNumIsNot(unix.IPPROTO_ICMP), gotoC(chainDrop))
	add(chainRelated, v4, env.lookupSessionQuoted(true), gotoC(chainDrop))
	add(chainRelated, v4, env.lookupPeerOf(), gotoC(chainAccept))
	add(chainRelated, gotoC(chainPolicy))

	// policy. Deny entries first: a deny wins over every accept below (lab
	// peers, public mode, attested and static elements).
	add(chainPolicy, v4, env.lookupPair(setDenied), gotoC(chainDropDenied))
	add(chainPolicy, v4, env.lookupPorts(setDeniedPorts), gotoC(chainDropDenied))
	add(chainPolicy, v4, env.lookupPair(setPeers), gotoC(chainAcceptNew))
	add(chainPolicy, v4, loadDaddr(reg1), env.lookup(setBlocked, reg1, false), gotoC(chainDropSpecial))
	// DNS (53) and DNS over TLS (853) go to the anycast proxy only, in
	// every mode, unless an entry names that port explicitly: a port-less
	// address, CIDR or name that happens to be a resolver must not let the
	// session resolve, or leak data through lookups, behind the proxy's back
	// (PITFALLS 5 and 17).
	for _, pp := range resolverPorts {
		add(chainPolicy, v4, l4protoIs(pp.Proto), loadDport(reg1), []expr.Any{cmpEq(reg1, portKey(pp.Port)[:2])}, gotoC(chainResolver))
	}
	// A session's connection grants (limits.go): before every accept, so a
	// grant's count holds whatever else allows its entry; after the
	// resolver dispatch, so a grant never opens DNS behind the proxy.
	add(chainPolicy, v4, loadSaddr(reg1), env.vmap(setGrantChains))
	add(chainPolicy, v4, loadSaddr(reg1), env.lookup(setNameCheckPublic, reg1, false), gotoC(chainAcceptNamed))
	add(chainPolicy, v4, loadSaddr(reg1), env.lookup(setPublic, reg1, false), gotoC(chainAcceptNew))
	env.attestedRules(func(parts ...[]expr.Any) { add(chainPolicy, parts...) }, false)
	env.attestedRules(func(parts ...[]expr.Any) { add(chainPolicy, parts...) }, true)
	// Pinned names' addresses (also in static) under the name check.
	add(chainPolicy, v4, env.lookupPair(setPinned), gotoC(chainAcceptNamed))
	add(chainPolicy, v4, env.lookupPorts(setPinnedPorts), gotoC(chainAcceptNamed))
	add(chainPolicy, v4, env.lookupPair(setStatic), gotoC(chainAcceptNew))
	add(chainPolicy, v4, env.lookupPorts(setStaticPorts), gotoC(chainAcceptNew))
	add(chainPolicy, v4, env.lookupPair(setStaticCIDR), gotoC(chainAcceptNew))
	add(chainPolicy, v4, env.lookupPorts(setStaticCIDRPorts), gotoC(chainAcceptNew))
	// Nothing accepts it: "port" when some entry allows the address on
	// other ports, else "not-allowed". Only dropped packets pay these
	// lookups.
	for _, set := range []string{setPortHosts, setPortAttested, setPortCIDRs} {
		add(chainPolicy, v4, env.lookupPair(set), gotoC(chainDropPort))
	}
	add(chainPolicy, gotoC(chainDropNotAllowed))

	// resolver
	env.attestedRules(func(parts ...[]expr.Any) { add(chainResolver, parts...) }, true)
	for _, set := range []string{setStaticPorts, setStaticCIDRPorts} {
		add(chainResolver, v4, env.lookupPorts(set), gotoC(chainAcceptNew))
	}
	add(chainResolver, gotoC(chainDropResolver))

	// flow_limit
	isNew := ctStateIn(expr.CtStateBitNEW)
	add(chainFlowLimit, isNew, v4, env.limitFlows(), gotoC(chainDropLimited))
	add(chainFlowLimit, isNew, v4, env.limitRate(), gotoC(chainDropLimited))

	// accept_named: a new flow admitted because of a name. Under the
	// name check a TCP flow is marked pending, counted, and its SYN
	// queued (the checker learns where the flow's bytes start). QUIC
	// (UDP/443) is, by the session's choice, held the same way (--quic
	// check: its first datagram is queued, the checker reads the Initial
	// packets' ClientHello) or refused (its name is not read: clients
	// fall back to TCP).
	checked := append(append([]expr.Any{}, v4...), append(loadSaddr(reg1), env.lookup(setNameCheck, reg1, false)...)...)
	quicChecked := append(append([]expr.Any{}, v4...), append(loadSaddr(reg1), env.lookup(setNameCheckQUIC, reg1, false)...)...)
	quic := append(l4protoIs(netpolicy.ProtoUDP), append(loadDport(reg1), cmpEq(reg1, portKey(443)[:2]))...)
	// A QUIC datagram the check passed comes back (NF_REPEAT) before its
	// flow is confirmed, as a new packet: it was counted when queued.
	add(chainAcceptNamed, l4protoIs(netpolicy.ProtoUDP), ctMarkIs(CtMarkNameOK), accept)
	add(chainAcceptNamed, quic, quicChecked, jump(chainFlowLimit))
	add(chainAcceptNamed, quic, quicChecked, ctMarkSet(CtMarkNamePending))
	add(chainAcceptNamed, l4protoIs(netpolicy.ProtoTCP), checked, jump(chainFlowLimit))
	add(chainAcceptNamed, l4protoIs(netpolicy.ProtoTCP), checked, ctMarkSet(CtMarkNamePending))
	add(chainAcceptNamed, ctMarkIs(CtMarkNamePending), v4, env.update(setAcctAccept))
	add(chainAcceptNamed, ctMarkIs(CtMarkNamePending), gotoC(chainNameQueue))
	add(chainAcceptNamed, quic, checked, gotoC(chainDropQUIC))
	add(chainAcceptNamed, gotoC(chainAcceptNew))
	// name_queue: to the checker, without bypass: while nobody reads
	// the queue (the daemon is down), the kernel drops what comes here.
	add(chainNameQueue, env.nfqueue())

	// accounting chains
	add(chainAcceptNew, jump(chainFlowLimit))
	add(chainAcceptNew, gotoC(chainAccept))
	add(chainAccept, v4, env.update(setAcctAccept))
	add(chainAccept, accept)
	// Replies into a session (a download is almost all replies): counted per
	// guest, the destination here.
	add(chainAcceptReturn, nfprotoIs(true), env.updateDaddr(setAcctReturn))
	add(chainAcceptReturn, accept)
	add(chainDrop, v4, env.update(setAcctDrop))
	add(chainDrop, drop)
	// The reason chains. rate-limit's count is acct_limited's.
	for _, d := range dropCodes {
		if d.chain == "" {
			continue
		}
		// The session's own packets the policy drops may be answered
		// (drop_policy); spoofed and inbound ones never are.
		k, final := guestIsSaddr, gotoC(chainDropPolicy)
		switch d.reason {
		case netpolicy.ReasonSpoofed:
			k, final = guestByIface, drop
		case netpolicy.ReasonInbound:
			k, final = guestIsDaddr, drop
			add(d.chain, v4, env.lookupSessionOut(true), drop) // not a guest: nothing to count
		}
		// A spent budget cuts established packets: log those too (the
		// first packet over a budget is rarely a flow's first).
		onlyNew := d.reason != netpolicy.ReasonSpoofed && d.reason != netpolicy.ReasonBudget
		for _, r := range env.reasonRules(d, k, onlyNew, final) {
			add(d.chain, r)
		}
	}
	// drop_policy, reject_session: the session chose reject. Only the
	// reason chains above reach here, and only with the session's own
	// address as the source: raw_prerouting's anti-spoofing check passed,
	// so the answer goes to the session that sent the packet, nowhere else.
	add(chainDropPolicy, v4, loadSaddr(reg1), env.lookup(setReject, reg1, false), gotoC(chainReject))
	add(chainDropPolicy, gotoC(chainDrop))
	add(chainReject, v4, env.update(setAcctDrop))
	// reset: TCP gets a reset (a closed port to a scanner); reject, and
	// reset's other protocols, ICMP administratively prohibited (a
	// connect fails with EHOSTUNREACH at once; a scanner says filtered).
	add(chainReject, v4, loadSaddr(reg1), env.lookup(setReset, reg1, false), l4protoNumIs(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
	// A flow the name check refused is established: an ICMP error is a
	// soft error to its socket, which would retransmit for minutes; a
	// reset ends it (reject and reset alike).
	add(chainReject, ctMarkIs(CtMarkNameRefused), l4protoNumIs(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
	add(chainReject, v4, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: icmpAdminProhibited}})
	// A rate-limited flow stays a silent drop: answering a flood would only
	// add to it.
	limited := env.reasonRules(dropCode{reason: netpolicy.ReasonRateLimit}, guestIsSaddr, true, gotoC(chainDrop))
	limited[0] = append(v4, env.update(setAcctLimited)...)
	for _, r := range limited {
		add(chainDropLimited, r)
	}

	// input
	buildRules6(env, chainInput, add)
	add(chainInput, fromSession, gotoC(chainInputSession))
	add(chainInput, v4, toDNS, drop)
	add(chainInputSession, v4, toDNS, dnsPort(netpolicy.ProtoUDP, true), accept)
	add(chainInputSession, ctStateIn(expr.CtStateBitESTABLISHED), accept)
	add(chainInputSession, ctStateIn(expr.CtStateBitRELATED), v4, icmp, env.lookupSessionQuoted(false), toDNS, accept)
	add(chainInputSession, v4, toDNS, dnsPort(netpolicy.ProtoTCP, true), jump(chainFlowLimit))
	add(chainInputSession, v4, toDNS, dnsPort(netpolicy.ProtoTCP, true), accept)
	add(chainInputSession, gotoC(chainDropNotAllowed))

	// output: what the host itself sends into sessions (inbound.go)
	buildRules6(env, chainOutput, add)
	inboundRules(env, add)

	// postrouting
	add(chainPostrouting, nfprotoIs(true), saddrIn(env.pool), ifPrefix(expr.MetaKeyOIFNAME, p, false),
		[]expr.Any{&expr.Masq{}})
	buildRules6(env, chainPostrouting, add)
	return rs
}

// The name check's conntrack marks (and packet marks, for the verdict's
// way back: see from_session). Distinctive values, compared exactly, so a
// mark others set on the host (a CNI's masquerade bit) is never read as
// ours. ct mark is otherwise unused by the table.
const (
	CtMarkNamePending uint32 = 0x6e630001 // "nc" 1: held for the check
	CtMarkNameOK      uint32 = 0x6e630002 // checked, allowed or passed: the plain path
	CtMarkNameRefused uint32 = 0x6e630003 // checked, refused: every packet answered as a policy drop
)

// verdictMarkIs matches a packet whose mark is one of the name check's
// verdicts, CtMarkNameOK or CtMarkNameRefused: meta mark & ~1 == OK.
func verdictMarkIs() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(^(CtMarkNameOK ^ CtMarkNameRefused)), Xor: []byte{0, 0, 0, 0}},
		cmpEq(reg1, binaryutil.NativeEndian.PutUint32(CtMarkNameOK&CtMarkNameRefused)),
	}
}

// ctMarkFromMetaMark is "ct mark set meta mark".
func ctMarkFromMetaMark() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Ct{Register: reg1, Key: expr.CtKeyMARK, SourceRegister: true},
	}
}

func metaMarkSet(m uint32) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: reg1, Data: binaryutil.NativeEndian.PutUint32(m)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}
}

func ctMarkIs(m uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeyMARK},
		cmpEq(reg1, binaryutil.NativeEndian.PutUint32(m)),
	}
}

func ctMarkSet(m uint32) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: reg1, Data: binaryutil.NativeEndian.PutUint32(m)},
		&expr.Ct{Register: reg1, Key: expr.CtKeyMARK, SourceRegister: true},
	}
}

// nfqueue is the xt NFQUEUE target (revision 1: queue number, one queue;
// no bypass flag) through nft_compat: the kernels this runs on may lack
// nft's own queue expression (CONFIG_NFT_QUEUE), and the compat target is
// what iptables-nft uses. Its info is struct xt_NFQ_info_v1, host order.
func (env ruleEnv) nfqueue() []expr.Any {
	info := binaryutil.NativeEndian.PutUint16(env.queue)
	info = append(info, binaryutil.NativeEndian.PutUint16(1)...)
	u := xt.Unknown(info)
	return []expr.Any{&expr.Target{Name: "NFQUEUE", Rev: 1, Info: &u}}
}

func verdict(kind expr.VerdictKind, chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: kind, Chain: chain}}
}

func cmpEq(reg uint32, data []byte) expr.Any {
	return &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: data}
}

// ifPrefix matches (eq) or excludes (!eq) interface names starting with
// prefix: comparing only len(prefix) bytes is how nft encodes "P*".
func ifPrefix(key expr.MetaKey, prefix string, eq bool) []expr.Any {
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg1},
		&expr.Cmp{Op: op, Register: reg1, Data: []byte(prefix)},
	}
}

// nfprotoIs matches IPv4 (v4) or anything but IPv4 (!v4).
func nfprotoIs(v4 bool) []expr.Any {
	op := expr.CmpOpEq
	if !v4 {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: op, Register: reg1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

func l4protoIs(p netpolicy.Proto) []expr.Any { return l4protoNumIs(p.Number()) }

func l4protoNumIs(n uint8) []expr.Any { return l4protoCmp(expr.CmpOpEq, n) }

func l4protoNumIsNot(n uint8) []expr.Any { return l4protoCmp(expr.CmpOpNeq, n) }

func l4protoCmp(op expr.CmpOp, n uint8) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: op, Register: reg1, Data: []byte{n}},
	}
}

// ctStateIn matches packets whose conntrack state is one of bits.
func ctStateIn(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{
			SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits),
			Xor:  binaryutil.NativeEndian.PutUint32(0),
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{0, 0, 0, 0}},
	}
}

func loadSaddr(reg uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}}
}

func loadDaddr(reg uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}}
}

func loadSport(reg uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2}}
}

func loadDport(reg uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}}
}

func saddrIn(p netip.Prefix) []expr.Any {
	mask := prefixMask(p.Bits())
	return append(loadSaddr(reg1),
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		cmpEq(reg1, ipKey(p.Masked().Addr())),
	)
}

func (env ruleEnv) lookup(set string, reg uint32, invert bool) []expr.Any {
	s := env.set(set)
	return []expr.Any{&expr.Lookup{SourceRegister: reg, SetName: s.Name, SetID: s.ID, Invert: invert}}
}

// vmap is "vmap @set" on the key in reg1: the element's verdict.
func (env ruleEnv) vmap(set string) []expr.Any {
	s := env.set(set)
	return []expr.Any{&expr.Lookup{SourceRegister: reg1, DestRegister: 0, IsDestRegSet: true, SetName: s.Name, SetID: s.ID}}
}

// lookupSession matches iifname . ip saddr in (or, with invert, not in) @sessions.
func (env ruleEnv) lookupSession(invert bool) []expr.Any {
	ex := []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1}}
	ex = append(ex, loadSaddr(reg32(4))...)
	return append(ex, env.lookup(setSessions, reg1, invert)...)
}

// lookupSessionQuoted matches iifname . (the destination address quoted
// in an ICMP error: the inner IPv4 header starts 8 bytes into the ICMP
// message, its destination 16 bytes into that) in @sessions. An error a
// session may send is about a packet it received, addressed to itself: with
// the outer source pinned to the session (raw_prerouting) and the quoted
// destination pinned too, the flow conntrack relates it to has the
// session's address on its side, so it is the session's own. (Matching on
// "ct original saddr" instead would work in the kernel, but in the inet
// family it loads a 16-byte field whose 4-byte use nft cannot print.)
//
// With invert it matches when the pair is not in @sessions.
func (env ruleEnv) lookupSessionQuoted(invert bool) []expr.Any {
	ex := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Payload{DestRegister: reg32(4), Base: expr.PayloadBaseTransportHeader, Offset: 8 + 16, Len: 4},
	}
	return append(ex, env.lookup(setSessions, reg1, invert)...)
}

// lookupPeerOf matches ip daddr . ip saddr in @peers: the destination is a
// lab session that may open connections to this one.
func (env ruleEnv) lookupPeerOf() []expr.Any {
	ex := append(loadDaddr(reg32(0)), loadSaddr(reg32(1))...)
	return append(ex, env.lookup(setPeers, reg32(0), false)...)
}

// limitFlows matches when the session already holds more than maxFlows
// tracked flows: add @flows { ip saddr ct count over N }.
func (env ruleEnv) limitFlows() []expr.Any { return env.flowCount(setFlows, loadSaddr(reg1)) }

// limitRate matches when the session opens new flows faster than flowRate
// per second (burst twice that): update @flowrate { ip saddr limit rate over R/second }.
func (env ruleEnv) limitRate() []expr.Any { return env.flowRateOver(setFlowRate, loadSaddr(reg1)) }

// flowCount is "add @set { KEY ct count over maxFlows }", KEY what load
// puts in reg1 (the session's source, v4 or v6).
func (env ruleEnv) flowCount(set string, load []expr.Any) []expr.Any {
	s := env.set(set)
	return append(load, &expr.Dynset{SrcRegKey: reg1, SetName: s.Name, SetID: s.ID,
		Operation: unix.NFT_DYNSET_OP_ADD,
		Exprs:     []expr.Any{&expr.Connlimit{Count: env.maxFlows, Flags: connlimitOver}}})
}

// flowRateOver is "update @set { KEY limit rate over flowRate/second
// burst 2*flowRate }".
func (env ruleEnv) flowRateOver(set string, load []expr.Any) []expr.Any {
	s := env.set(set)
	return append(load, &expr.Dynset{SrcRegKey: reg1, SetName: s.Name, SetID: s.ID,
		Operation: unix.NFT_DYNSET_OP_UPDATE,
		Exprs: []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(env.flowRate), Over: true,
			Unit: expr.LimitTimeSecond, Burst: 2 * env.flowRate}}})
}

// attestedRules adds the rules accepting new flows by an attested element
// (attested, or with ports attested_ports) and, with a refresh, those
// refreshing and accepting by its live element.
func (env ruleEnv) attestedRules(add func(...[]expr.Any), ports bool) {
	v4 := nfprotoIs(true)
	lookup, set, live := env.lookupPair, setAttested, setAttestedLive
	if ports {
		lookup, set, live = env.lookupPorts, setAttestedPorts, setAttestedPortsLive
	}
	env.refreshedAccepts(func(parts ...[]expr.Any) { add(append([][]expr.Any{v4}, parts...)...) }, lookup, set, live, chainAcceptNamed)
}

// refreshedAccepts adds, through add, the rule accepting new flows by an
// element of set (lookup loads its key; accepted flows go to the chain
// accept) and, with the refresh on, the two before and after it: a hit
// refreshes its element's live copy in live, and a hit of the live copy
// alone, after set's element expired, refreshes and accepts too. Both
// families' attested sets are accepted so (refresh6.go).
func (env ruleEnv) refreshedAccepts(add func(...[]expr.Any), lookup func(string) []expr.Any, set, live, accept string) {
	acc := verdict(expr.VerdictGoto, accept)
	if env.refresh <= 0 {
		add(lookup(set), acc)
		return
	}
	add(lookup(set), env.refreshLive(live))
	add(lookup(set), acc)
	add(lookup(live), env.refreshLive(live), acc)
}

// refreshLive is "update @set { KEY timeout REFRESH }" for the key the
// preceding lookup loaded (from register 32_00 on).
func (env ruleEnv) refreshLive(set string) []expr.Any {
	s := env.set(set)
	return []expr.Any{&expr.Dynset{SrcRegKey: reg32(0), SetName: s.Name, SetID: s.ID,
		Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: env.refresh}}
}

// lookupPair matches ip saddr . ip daddr in set.
func (env ruleEnv) lookupPair(set string) []expr.Any {
	ex := append(loadSaddr(reg32(0)), loadDaddr(reg32(1))...)
	return append(ex, env.lookup(set, reg32(0), false)...)
}

// lookupPorts matches ip saddr . meta l4proto . ip daddr . th dport in set.
func (env ruleEnv) lookupPorts(set string) []expr.Any {
	ex := loadSaddr(reg32(0))
	ex = append(ex, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32(1)})
	ex = append(ex, loadDaddr(reg32(2))...)
	ex = append(ex, loadDport(reg32(3))...)
	return append(ex, env.lookup(set, reg32(0), false)...)
}

// updateDaddr is update keyed by the destination: the guest of a packet
// going into its session.
func (env ruleEnv) updateDaddr(set string) []expr.Any {
	s := env.set(set)
	ex := loadDaddr(reg1)
	return append(ex, &expr.Dynset{SrcRegKey: reg1, SetName: s.Name, SetID: s.ID, Operation: unix.NFT_DYNSET_OP_UPDATE})
}

// update runs "update @set { ip saddr }", creating the element (with the
// set's per-element counter) if missing and counting the packet.
func (env ruleEnv) update(set string) []expr.Any {
	s := env.set(set)
	ex := loadSaddr(reg1)
	return append(ex, &expr.Dynset{SrcRegKey: reg1, SetName: s.Name, SetID: s.ID, Operation: unix.NFT_DYNSET_OP_UPDATE})
}
