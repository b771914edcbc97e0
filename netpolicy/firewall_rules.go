package netpolicy

import (
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Registers. A 16-byte value (an interface name) loaded into NFT_REG_1 fills
// the 32-bit registers 0..3; concatenations put each following field in the
// next 32-bit register, which is how the kernel reads a concatenated key.
const (
	reg1     = unix.NFT_REG_1
	reg32_00 = unix.NFT_REG32_00
)

func reg32(n uint32) uint32 { return reg32_00 + n }

// publicDeniedPorts are the destination ports a public-mode session may not
// reach anywhere: DNS and DNS over TLS, which only the anycast proxy serves.
var publicDeniedPorts = []PortSpec{
	{Port: 53, Proto: ProtoUDP}, {Port: 53, Proto: ProtoTCP},
	{Port: 853, Proto: ProtoTCP}, {Port: 853, Proto: ProtoUDP},
}

// ruleSpec is one rule of one chain, as plain data.
type ruleSpec struct {
	chain string
	exprs []expr.Any
}

// ruleEnv is what the rules depend on.
type ruleEnv struct {
	prefix string       // interface name prefix of session veths
	pool   netip.Prefix // masquerade source range
	dns    netip.Addr   // DNS anycast address
	set    func(name string) *nftables.Set
}

// Every rule of the table, in order. The chains never change per session.
//
//	forward (filter hook forward, policy accept)
//	  iifname "P*" meta nfproto != ipv4 drop
//	  oifname "P*" meta nfproto != ipv4 drop
//	  ct state established,related iifname "P*" meta nfproto ipv4 iifname . ip saddr @sessions update @acct_accept { ip saddr }
//	  ct state established,related accept
//	  iifname "P*" goto from_session
//	  oifname "P*" drop                                  # new connections into sessions
//	from_session
//	  meta nfproto != ipv4 drop
//	  iifname . ip saddr != @sessions drop                # anti-spoofing, unknown interfaces
//	  ip saddr . ip daddr @peers goto accept_session
//	  ip daddr @blocked goto drop_session                 # SSRF guard, every mode
//	  ip saddr @public meta l4proto {tcp,udp} th dport {53,853} goto drop_session  # resolvers: the proxy only
//	  ip saddr @public goto accept_session
//	  ip saddr . ip daddr @attested goto accept_session
//	  ip saddr . meta l4proto . ip daddr . th dport @attested_ports goto accept_session
//	  ip saddr . ip daddr @static goto accept_session
//	  ip saddr . meta l4proto . ip daddr . th dport @static_ports goto accept_session
//	  ip saddr . ip daddr @static_cidr goto accept_session
//	  ip saddr . meta l4proto . ip daddr . th dport @static_cidr_ports goto accept_session
//	  goto drop_session
//	accept_session: update @acct_accept { ip saddr }; accept
//	drop_session:   update @acct_drop { ip saddr }; drop
//	input (filter hook input, policy accept)
//	  iifname "P*" meta nfproto != ipv4 drop
//	  iifname "P*" iifname . ip saddr != @sessions drop
//	  iifname "P*" ct state established,related accept
//	  iifname "P*" ip daddr DNS meta l4proto udp th dport 53 accept
//	  iifname "P*" ip daddr DNS meta l4proto tcp th dport 53 accept
//	  iifname "P*" goto drop_session
//	postrouting (nat hook postrouting, srcnat)
//	  meta nfproto ipv4 ip saddr POOL oifname != "P*" masquerade
//
// The accounting update and the verdict are separate rules: a dynset that
// cannot insert (a full set) ends its rule, and the verdict must not depend on
// accounting.
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

	// forward
	add(chainForward, ifPrefix(expr.MetaKeyIIFNAME, p, true), nfprotoIs(false), drop)
	add(chainForward, ifPrefix(expr.MetaKeyOIFNAME, p, true), nfprotoIs(false), drop)
	add(chainForward, ctEstablished(), ifPrefix(expr.MetaKeyIIFNAME, p, true), nfprotoIs(true),
		env.lookupSession(false), env.update(setAcctAccept))
	add(chainForward, ctEstablished(), accept)
	add(chainForward, ifPrefix(expr.MetaKeyIIFNAME, p, true), gotoC(chainFromSession))
	add(chainForward, ifPrefix(expr.MetaKeyOIFNAME, p, true), drop)

	// from_session
	add(chainFromSession, nfprotoIs(false), drop)
	// Every rule reading IPv4 headers carries "meta nfproto ipv4" although the
	// first rule already dropped everything else: it costs one compare on
	// new connections only, and nft can then print the rules as ip saddr/daddr.
	v4 := nfprotoIs(true)
	add(chainFromSession, v4, env.lookupSession(true), drop)
	add(chainFromSession, v4, env.lookupPair(setPeers), gotoC(chainAccept))
	add(chainFromSession, v4, loadDaddr(reg1), env.lookup(setBlocked, reg1, false), gotoC(chainDrop))
	// Public mode reaches every public destination except other resolvers:
	// DNS (53) and DNS over TLS (853) go to the anycast proxy only, so even a
	// public session cannot resolve, or leak data through lookups, behind
	// the proxy's back (PITFALLS 5).
	for _, pp := range publicDeniedPorts {
		add(chainFromSession, v4, loadSaddr(reg1), env.lookup(setPublic, reg1, false),
			l4protoIs(pp.Proto), loadDport(reg1), []expr.Any{cmpEq(reg1, portKey(pp.Port)[:2])}, gotoC(chainDrop))
	}
	add(chainFromSession, v4, loadSaddr(reg1), env.lookup(setPublic, reg1, false), gotoC(chainAccept))
	add(chainFromSession, v4, env.lookupPair(setAttested), gotoC(chainAccept))
	add(chainFromSession, v4, env.lookupPorts(setAttestedPorts), gotoC(chainAccept))
	add(chainFromSession, v4, env.lookupPair(setStatic), gotoC(chainAccept))
	add(chainFromSession, v4, env.lookupPorts(setStaticPorts), gotoC(chainAccept))
	add(chainFromSession, v4, env.lookupPair(setStaticCIDR), gotoC(chainAccept))
	add(chainFromSession, v4, env.lookupPorts(setStaticCIDRPorts), gotoC(chainAccept))
	add(chainFromSession, gotoC(chainDrop))

	// accounting chains
	add(chainAccept, v4, env.update(setAcctAccept))
	add(chainAccept, accept)
	add(chainDrop, v4, env.update(setAcctDrop))
	add(chainDrop, drop)

	// input
	add(chainInput, ifPrefix(expr.MetaKeyIIFNAME, p, true), nfprotoIs(false), drop)
	add(chainInput, ifPrefix(expr.MetaKeyIIFNAME, p, true), nfprotoIs(true), env.lookupSession(true), drop)
	add(chainInput, ifPrefix(expr.MetaKeyIIFNAME, p, true), ctEstablished(), accept)
	for _, proto := range []Proto{ProtoUDP, ProtoTCP} {
		add(chainInput, ifPrefix(expr.MetaKeyIIFNAME, p, true), nfprotoIs(true),
			loadDaddr(reg1), []expr.Any{cmpEq(reg1, ipKey(env.dns))},
			l4protoIs(proto), loadDport(reg1), []expr.Any{cmpEq(reg1, portKey(53)[:2])}, accept)
	}
	add(chainInput, ifPrefix(expr.MetaKeyIIFNAME, p, true), gotoC(chainDrop))

	// postrouting
	add(chainPostrouting, nfprotoIs(true), saddrIn(env.pool), ifPrefix(expr.MetaKeyOIFNAME, p, false),
		[]expr.Any{&expr.Masq{}})
	return rs
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

func l4protoIs(p Proto) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p.Number()}},
	}
}

func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{
			SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
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

func loadDport(reg uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}}
}

func saddrIn(p netip.Prefix) []expr.Any {
	mask := make([]byte, 4)
	bits := p.Bits()
	for i := range mask {
		switch {
		case bits >= 8:
			mask[i] = 0xff
			bits -= 8
		case bits > 0:
			mask[i] = byte(0xff << (8 - bits))
			bits = 0
		}
	}
	return append(loadSaddr(reg1),
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		cmpEq(reg1, ipKey(p.Masked().Addr())),
	)
}

func (env ruleEnv) lookup(set string, reg uint32, invert bool) []expr.Any {
	s := env.set(set)
	return []expr.Any{&expr.Lookup{SourceRegister: reg, SetName: s.Name, SetID: s.ID, Invert: invert}}
}

// lookupSession matches iifname . ip saddr in (or, with invert, not in) @sessions.
func (env ruleEnv) lookupSession(invert bool) []expr.Any {
	ex := []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1}}
	ex = append(ex, loadSaddr(reg32(4))...)
	return append(ex, env.lookup(setSessions, reg1, invert)...)
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

// update runs "update @set { ip saddr }", creating the element (with the
// set's per-element counter) if missing and counting the packet.
func (env ruleEnv) update(set string) []expr.Any {
	s := env.set(set)
	ex := loadSaddr(reg1)
	return append(ex, &expr.Dynset{SrcRegKey: reg1, SetName: s.Name, SetID: s.ID, Operation: unix.NFT_DYNSET_OP_UPDATE})
}
