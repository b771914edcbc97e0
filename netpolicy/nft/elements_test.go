package nft

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/enforcerd/enforcerd/netpolicy"
)

func b(parts ...[]byte) []byte { return concat(parts...) }

func TestSessionElements(t *testing.T) {
	guest := netip.MustParseAddr("10.20.0.6")
	g := []byte{10, 20, 0, 6}
	r := SessionRules{
		Name: "s", HostIface: "enf1h", Guest: guest, Egress: netpolicy.ModePublic,
		Static: []netpolicy.Target{
			{Prefix: netip.MustParsePrefix("8.8.8.0/24")},
			{Prefix: netip.MustParsePrefix("1.2.3.4/32"), Port: 443},
			{Prefix: netip.MustParsePrefix("8.8.8.8/32")}, // covered by the /24
			{Prefix: netip.MustParsePrefix("9.9.9.9/32")},
		},
		Peers: []netip.Addr{netip.MustParseAddr("10.20.0.10")},
	}
	got := map[string][]nftables.SetElement{}
	var order []string
	for _, se := range sessionElements(r) {
		got[se.set] = se.elems
		order = append(order, se.set)
	}
	wantOrder := []string{setSessions, setIfaces, setPublic, setPeers, setStatic, setStaticPorts, setStaticCIDR, setPortHosts, setAcctAccept, setAcctDrop, setAcctLimited, setAcctReturn}
	if len(order) != len(wantOrder) {
		t.Fatalf("sets = %v, want %v", order, wantOrder)
	}
	for i := range order {
		if order[i] != wantOrder[i] {
			t.Fatalf("sets = %v, want %v", order, wantOrder)
		}
	}
	ifname := append([]byte("enf1h"), make([]byte, 11)...)
	check := func(set string, want []nftables.SetElement) {
		t.Helper()
		have := got[set]
		if len(have) != len(want) {
			t.Fatalf("%s: %d elements, want %d: %+v", set, len(have), len(want), have)
		}
		for i := range want {
			if !bytes.Equal(have[i].Key, want[i].Key) || !bytes.Equal(have[i].KeyEnd, want[i].KeyEnd) || have[i].IntervalEnd {
				t.Errorf("%s[%d] = key %v end %v, want key %v end %v", set, i, have[i].Key, have[i].KeyEnd, want[i].Key, want[i].KeyEnd)
			}
		}
	}
	check(setSessions, []nftables.SetElement{{Key: b(ifname, g)}})
	check(setIfaces, []nftables.SetElement{{Key: ifname}})
	if v := got[setIfaces][0].Val; !bytes.Equal(v, g) {
		t.Errorf("ifaces data = %v, want the guest %v", v, g)
	}
	// 1.2.3.4 on port 443 (TCP and UDP): once, without the port.
	check(setPortHosts, []nftables.SetElement{{Key: b(g, []byte{1, 2, 3, 4})}})
	check(setPublic, []nftables.SetElement{{Key: g}})
	check(setPeers, []nftables.SetElement{{Key: b(g, []byte{10, 20, 0, 10})}})
	check(setStaticCIDR, []nftables.SetElement{{Key: b(g, []byte{8, 8, 8, 0}), KeyEnd: b(g, []byte{8, 8, 8, 255})}})
	check(setStatic, []nftables.SetElement{{Key: b(g, []byte{9, 9, 9, 9})}})
	tcp, udp, port := []byte{6, 0, 0, 0}, []byte{17, 0, 0, 0}, []byte{1, 187, 0, 0}
	check(setStaticPorts, []nftables.SetElement{
		{Key: b(g, tcp, []byte{1, 2, 3, 4}, port)},
		{Key: b(g, udp, []byte{1, 2, 3, 4}, port)},
	})

	// A CIDR with a port goes to the interval set with ports.
	r2 := r
	r2.Static = []netpolicy.Target{{Prefix: netip.MustParsePrefix("8.8.8.0/24"), Port: 53, Proto: netpolicy.ProtoUDP},
		{Prefix: netip.MustParsePrefix("8.8.8.128/25"), Port: 443},
		{Prefix: netip.MustParsePrefix("7.0.0.0/8"), Port: 443}}
	for _, se := range sessionElements(r2) {
		if se.set == setPortCIDRs {
			// The /25 is inside the /24: the interval set gets disjoint ranges.
			want := []nftables.SetElement{
				{Key: b(g, []byte{7, 0, 0, 0}), KeyEnd: b(g, []byte{7, 255, 255, 255})},
				{Key: b(g, []byte{8, 8, 8, 0}), KeyEnd: b(g, []byte{8, 8, 8, 255})},
			}
			if len(se.elems) != len(want) {
				t.Fatalf("port_cidrs = %+v", se.elems)
			}
			for i := range want {
				if !bytes.Equal(se.elems[i].Key, want[i].Key) || !bytes.Equal(se.elems[i].KeyEnd, want[i].KeyEnd) {
					t.Errorf("port_cidrs[%d] = %+v, want %+v", i, se.elems[i], want[i])
				}
			}
		}
		if se.set == setStaticCIDRPorts {
			want := nftables.SetElement{Key: b(g, udp, []byte{8, 8, 8, 0}, []byte{0, 53, 0, 0}), KeyEnd: b(g, udp, []byte{8, 8, 8, 255}, []byte{0, 53, 0, 0})}
			found := false
			for _, e := range se.elems {
				found = found || bytes.Equal(e.Key, want.Key) && bytes.Equal(e.KeyEnd, want.KeyEnd)
			}
			if len(se.elems) != 5 || !found {
				t.Errorf("static_cidr_ports = %+v", se.elems)
			}
		}
	}
	check(setAcctAccept, []nftables.SetElement{{Key: g}})
	check(setAcctDrop, []nftables.SetElement{{Key: g}})

	for _, se := range sessionElements(r) {
		for _, e := range se.elems {
			if owner, ok := elemGuest(se.set, e); !ok || owner != guest {
				t.Errorf("%s element %v: keyGuest = %s %v", se.set, e.Key, owner, ok)
			}
		}
	}

	// Allowlist mode: no public element, and no empty sets in the batch.
	r.Egress, r.Static, r.Peers = netpolicy.ModeAllowlist, nil, nil
	var sets []string
	for _, se := range sessionElements(r) {
		sets = append(sets, se.set)
	}
	if len(sets) != 6 || sets[0] != setSessions || sets[1] != setIfaces || sets[2] != setAcctAccept || sets[3] != setAcctDrop || sets[4] != setAcctLimited || sets[5] != setAcctReturn {
		t.Errorf("allowlist without targets: sets %v", sets)
	}
}

func TestAttestElements(t *testing.T) {
	guest := netip.MustParseAddr("10.20.0.6")
	g := []byte{10, 20, 0, 6}
	ips := []netip.Addr{netip.MustParseAddr("1.2.3.4"), netip.MustParseAddr("::ffff:5.6.7.8"), netip.MustParseAddr("2001:db8::1")}

	plain := attestElements(guest, ips, 30*time.Second, nil)
	if len(plain) != 1 || plain[0].set != setAttested || len(plain[0].elems) != 2 {
		t.Fatalf("plain attest = %+v", plain)
	}
	if e := plain[0].elems[1]; !bytes.Equal(e.Key, b(g, []byte{5, 6, 7, 8})) || e.Timeout != 30*time.Second {
		t.Errorf("mapped address element = %+v", e)
	}
	// A port-less spec among others means every port.
	if any := attestElements(guest, ips[:1], time.Second, []netpolicy.PortSpec{{Port: 443, Proto: netpolicy.ProtoTCP}, {}}); len(any) != 1 || any[0].set != setAttested {
		t.Errorf("port-less spec: %+v", any)
	}
	// ... but the resolver ports, which a port-less element never opens:
	// those named beside it are attested with their ports.
	res := attestElements(guest, ips[:1], time.Second, []netpolicy.PortSpec{{}, {Port: 53, Proto: netpolicy.ProtoUDP}, {Port: 853, Proto: netpolicy.ProtoAny}, {Port: 443, Proto: netpolicy.ProtoTCP}})
	if len(res) != 2 || res[0].set != setAttested || res[1].set != setAttestedPorts || len(res[1].elems) != 3 ||
		!bytes.Equal(res[1].elems[0].Key, b(g, []byte{17, 0, 0, 0}, []byte{1, 2, 3, 4}, []byte{0, 53, 0, 0})) {
		t.Errorf("port-less spec with resolver ports: %+v", res)
	}

	ported := attestElements(guest, ips[:1], time.Minute, []netpolicy.PortSpec{{Port: 53, Proto: netpolicy.ProtoAny}, {Port: 443, Proto: netpolicy.ProtoTCP}})
	if len(ported) != 2 || ported[0].set != setAttestedPorts || len(ported[0].elems) != 3 {
		t.Fatalf("ported attest = %+v", ported)
	}
	if h := ported[1]; h.set != setPortAttested || len(h.elems) != 1 || !bytes.Equal(h.elems[0].Key, b(g, []byte{1, 2, 3, 4})) || h.elems[0].Timeout != time.Minute {
		t.Errorf("ported attest, the address without its ports = %+v", h)
	}
	want := [][]byte{
		b(g, []byte{6, 0, 0, 0}, []byte{1, 2, 3, 4}, []byte{0, 53, 0, 0}),
		b(g, []byte{17, 0, 0, 0}, []byte{1, 2, 3, 4}, []byte{0, 53, 0, 0}),
		b(g, []byte{6, 0, 0, 0}, []byte{1, 2, 3, 4}, []byte{1, 187, 0, 0}),
	}
	for i, w := range want {
		if !bytes.Equal(ported[0].elems[i].Key, w) {
			t.Errorf("ported[%d] = %v, want %v", i, ported[0].elems[i].Key, w)
		}
		gg, ip, proto, port, ok := decodeGuestPort(ported[0].elems[i].Key)
		if !ok || gg != guest || ip != ips[0] || port != []uint16{53, 53, 443}[i] || proto != []netpolicy.Proto{netpolicy.ProtoTCP, netpolicy.ProtoUDP, netpolicy.ProtoTCP}[i] {
			t.Errorf("decode %d: %s %s %s %d %v", i, gg, ip, proto, port, ok)
		}
	}
	if none := attestElements(guest, ips[2:], time.Minute, nil); none != nil {
		t.Errorf("IPv6 only: %+v, want nothing", none)
	}
}

// TestRulesReferenceTheSchema: every rule marshals, every set and chain a
// rule names exists, and every concatenated lookup loads exactly the bytes
// of its set's key.
func TestRulesReferenceTheSchema(t *testing.T) {
	t.Run("ipv4", func(t *testing.T) { testRulesReferenceTheSchema(t, netip.Prefix{}) })
	t.Run("dual-stack", func(t *testing.T) { testRulesReferenceTheSchema(t, netip.MustParsePrefix("fd00:20::/112")) })
}

func testRulesReferenceTheSchema(t *testing.T, pool6 netip.Prefix) {
	sc := newSchema("enf", pool16)
	defs := chainDefs()
	if pool6.IsValid() {
		sc.addSets6()
		defs = append(chainDefs6(), defs...)
	}
	env := ruleEnv{prefix: "enf", pool: pool16, dns: netip.MustParseAddr("10.20.255.254"), pool6: pool6, dns6: netip.MustParseAddr("fd00:20::1"), set: func(n string) *nftables.Set {
		s, ok := sc.sets[n]
		if !ok {
			t.Fatalf("rule names unknown set %q", n)
		}
		return s
	}}
	chains := map[string]bool{}
	for _, d := range defs {
		chains[d.name] = true
	}
	for i, r := range buildRules(env) {
		if !chains[r.chain] {
			t.Errorf("rule %d in unknown chain %q", i, r.chain)
		}
		// regs tracks which 4-byte registers hold loaded data (index from NFT_REG32_00).
		loaded := map[uint32]bool{}
		load := func(reg, n uint32) {
			start := reg - reg32_00
			if reg == reg1 {
				start = 0
			}
			for k := uint32(0); k < (n+3)/4; k++ {
				loaded[start+k] = true
			}
		}
		for _, e := range r.exprs {
			if _, err := expr.Marshal(byte(nftables.TableFamilyINet), e); err != nil {
				t.Errorf("rule %d: marshal %T: %v", i, e, err)
			}
			switch x := e.(type) {
			case *expr.Meta:
				n := uint32(4)
				if x.Key == expr.MetaKeyIIFNAME || x.Key == expr.MetaKeyOIFNAME {
					n = 16
				}
				load(x.Register, n)
			case *expr.Payload:
				load(x.DestRegister, x.Len)
			case *expr.Ct:
				n := uint32(4)
				if x.Key == expr.CtKeySRC || x.Key == expr.CtKeyDST {
					n = 16 // the inet family loads the 16-byte address field
				}
				load(x.Register, n)
			case *expr.Verdict:
				if x.Chain != "" && !chains[x.Chain] {
					t.Errorf("rule %d jumps to unknown chain %q", i, x.Chain)
				}
			case *expr.Lookup:
				s := sc.sets[x.SetName]
				start := uint32(0)
				if x.SourceRegister != reg1 {
					start = x.SourceRegister - reg32_00
				}
				for k := uint32(0); k < s.KeyType.Bytes/4; k++ {
					if !loaded[start+k] {
						t.Errorf("rule %d: lookup in %s reads register %d, which nothing loaded", i, x.SetName, start+k)
					}
				}
			case *expr.Dynset:
				if _, ok := sc.sets[x.SetName]; !ok {
					t.Errorf("rule %d: dynset on unknown set %q", i, x.SetName)
				}
			}
		}
	}
}

// Every set a session's elements can go to is one RemoveSession scans (a
// set left out keeps a removed session's elements: PITFALLS 14), and one
// an update by dump looks at.
func TestSessionSetsCoverEveryElement(t *testing.T) {
	r := SessionRules{
		Name: "s", HostIface: "enf1h", Guest: netip.MustParseAddr("10.20.0.6"), Egress: netpolicy.ModePublic,
		Static: []netpolicy.Target{
			{Prefix: netip.MustParsePrefix("8.8.8.0/24")}, {Prefix: netip.MustParsePrefix("8.8.4.0/24"), Port: 443, Proto: netpolicy.ProtoTCP},
			{Prefix: netip.MustParsePrefix("1.2.3.4/32"), Port: 443}, {Prefix: netip.MustParsePrefix("9.9.9.9/32")},
		},
		Deny:            []netpolicy.Target{{Prefix: netip.MustParsePrefix("5.5.5.0/24")}, {Prefix: netip.MustParsePrefix("6.6.6.6/32"), Port: 22}},
		Peers:           []netip.Addr{netip.MustParseAddr("10.20.0.10")},
		OnDeny:          netpolicy.DenyReset,
		NameCheck:       true,
		DenyNames:       true,
		Pinned:          []netpolicy.Target{{Prefix: netip.MustParsePrefix("9.9.9.9/32")}, {Prefix: netip.MustParsePrefix("1.2.3.4/32"), Port: 443}},
		InboundFromHost: []netpolicy.PortSpec{{Port: 8080, Proto: netpolicy.ProtoTCP}},
	}
	for _, se := range sessionElements(r) {
		if !slices.Contains(sessionSets, se.set) {
			t.Errorf("set %s holds session elements and is not in sessionSets", se.set)
		}
	}
	for _, want := range []string{setNameCheck, setNameCheckPublic, setPinned, setPinnedPorts} {
		found := false
		for _, se := range sessionElements(r) {
			found = found || se.set == want
		}
		if !found {
			t.Errorf("a public session under the name check with deny names has no element in %s", want)
		}
	}
}
