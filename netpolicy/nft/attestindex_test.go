package nft

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/enforcerd/enforcerd/netpolicy"
)

func keysOf(m map[string][]nftables.SetElement) map[string][]string {
	out := map[string][]string{}
	for set, elems := range m {
		for _, e := range elems {
			out[set] = append(out[set], string(e.Key))
		}
		slices.Sort(out[set])
	}
	return out
}

func TestAttestIndexTake(t *testing.T) {
	g1, g2 := netip.MustParseAddr("10.20.0.2"), netip.MustParseAddr("10.20.0.6")
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	t0 := time.Unix(1000, 0)
	var x attestIndex
	for _, se := range attestElements(g1, []netip.Addr{ip("1.1.1.1"), ip("2.2.2.2")}, time.Minute, nil) {
		x.record(g1, se.set, se.elems, t0)
	}
	for _, se := range attestElements(g1, []netip.Addr{ip("3.3.3.3")}, 10*time.Second, []netpolicy.PortSpec{{Port: 443, Proto: netpolicy.ProtoTCP}}) {
		x.record(g1, se.set, se.elems, t0)
	}
	for _, se := range attestElements(g2, []netip.Addr{ip("1.1.1.1")}, time.Minute, nil) {
		x.record(g2, se.set, se.elems, t0)
	}
	key := func(g netip.Addr, ip string) string { return string(concat(ipKey(g), ipKey(netip.MustParseAddr(ip)))) }
	portKeyOf := string(concat(ipKey(g1), protoKey(netpolicy.ProtoTCP), ipKey(ip("3.3.3.3")), portKey(443)))

	got, taken, complete := x.take(g1, t0.Add(20*time.Second)) // the ported one expired (10s + slack)
	if complete {
		t.Errorf("unseeded index says it is complete")
	}
	want := map[string][]string{setAttested: {key(g1, "1.1.1.1"), key(g1, "2.2.2.2")}}
	if g := keysOf(got); len(g) != 1 || !slices.Equal(g[setAttested], want[setAttested]) {
		t.Errorf("take(g1) = %q, want %q", g, want)
	}
	if len(taken) != 4 {
		t.Errorf("taken records %d, want 4 (expired ones too, for putBack; the ported address in port_attested too)", len(taken))
	}
	if again, _, _ := x.take(g1, t0); len(again) != 0 {
		t.Errorf("second take(g1) = %v, want nothing", keysOf(again))
	}
	x.putBack(g1, taken)
	x.setSeeded(true)
	got, _, complete = x.take(g1, t0)
	if g := keysOf(got); !complete || len(g[setAttested]) != 2 || len(g[setAttestedPorts]) != 1 || g[setAttestedPorts][0] != portKeyOf ||
		len(g[setPortAttested]) != 1 || g[setPortAttested][0] != key(g1, "3.3.3.3") {
		t.Errorf("take after putBack = %q (complete %t)", g, complete)
	}
	if got, _, _ := x.take(g2, t0); len(got[setAttested]) != 1 || string(got[setAttested][0].Key) != key(g2, "1.1.1.1") {
		t.Errorf("take(g2) = %q", keysOf(got))
	}
	x.reset()
	if _, _, complete := x.take(g1, t0); complete {
		t.Errorf("index still complete after reset")
	}
}

// TestAttestIndexRefreshAndSeed: a re-attest keeps the later expiry, a
// seeded element lives for its remaining lifetime, and records expire.
func TestAttestIndexRefreshAndSeed(t *testing.T) {
	g := netip.MustParseAddr("10.20.0.2")
	k := concat(ipKey(g), ipKey(netip.MustParseAddr("1.1.1.1")))
	t0 := time.Unix(1000, 0)
	var x attestIndex
	x.record(g, setAttested, []nftables.SetElement{{Key: k, Timeout: time.Minute}}, t0)
	x.record(g, setAttested, []nftables.SetElement{{Key: k, Timeout: time.Second}}, t0.Add(time.Second))
	if got, _, _ := x.take(g, t0.Add(50*time.Second)); len(got[setAttested]) != 1 {
		t.Errorf("refresh with a shorter timeout lost the record")
	}
	x.seed(setAttested, []nftables.SetElement{{Key: k, Expires: 5 * time.Second}}, t0)
	if got, _, _ := x.take(g, t0.Add(5*time.Second+attestSlack)); len(got) != 0 {
		t.Errorf("seeded record outlived its remaining life and the slack: %q", keysOf(got))
	}
}

// TestAttestIndexPrunes: a guest's expired records are swept as it grows.
func TestAttestIndexPrunes(t *testing.T) {
	g := netip.MustParseAddr("10.20.0.2")
	t0 := time.Unix(1000, 0)
	var x attestIndex
	for i := 0; i < 10*pruneMin; i++ {
		k := concat(ipKey(g), ipKey(netip.AddrFrom4([4]byte{11, 0, byte(i >> 8), byte(i)})))
		x.record(g, setAttested, []nftables.SetElement{{Key: k, Timeout: time.Second}}, t0.Add(time.Duration(i)*time.Second))
	}
	if n := len(x.byGuest[g].exp); n > 2*pruneMin {
		t.Errorf("%d records kept with at most a few live; want them pruned to <= %d", n, 2*pruneMin)
	}
}

func TestMergeAttests(t *testing.T) {
	g1, g2 := netip.MustParseAddr("10.20.0.2"), netip.MustParseAddr("10.20.0.6")
	a, b := netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("2.2.2.2")
	reqs := []attestReq{
		{guest: g1, plan: attestElements(g1, []netip.Addr{a, b}, time.Minute, nil)},
		{guest: g1, plan: attestElements(g1, []netip.Addr{a}, time.Hour, nil)},
		{guest: g2, plan: attestElements(g2, []netip.Addr{a}, 30*time.Second, []netpolicy.PortSpec{{Port: 53, Proto: netpolicy.ProtoUDP}})},
	}
	got := mergeAttests(reqs)
	type el struct {
		set, key string
		to       time.Duration
	}
	var flat []el
	for _, se := range got {
		for _, e := range se.elems {
			flat = append(flat, el{se.set, string(e.Key), e.Timeout})
		}
	}
	want := []el{
		{setAttested, string(concat(ipKey(g1), ipKey(a))), time.Hour},
		{setAttested, string(concat(ipKey(g1), ipKey(b))), time.Minute},
		{setAttestedPorts, string(concat(ipKey(g2), protoKey(netpolicy.ProtoUDP), ipKey(a), portKey(53))), 30 * time.Second},
		{setPortAttested, string(concat(ipKey(g2), ipKey(a))), 30 * time.Second},
	}
	if !slices.Equal(flat, want) {
		t.Errorf("merged %+v, want %+v", flat, want)
	}
	if one := mergeAttests(reqs[:1]); len(one) != 1 || len(one[0].elems) != 2 {
		t.Errorf("a single request is not passed through: %v", one)
	}
}

// TestMergeAttestsDualStack: a dual-stack answer's v6 elements ride in the
// batch of its v4 ones and of concurrent answers' elements: one list per
// set, v4 sets first, each key once with its longest timeout; a lone
// request's v4 and v6 elements are both sent.
func TestMergeAttestsDualStack(t *testing.T) {
	f := &Firewall{cfg: FirewallConfig{Pool: netip.MustParsePrefix("10.20.0.0/16"), Pool6: netip.MustParsePrefix("fd00:20::/112")}}
	g1, g2 := netip.MustParseAddr("10.20.0.2"), netip.MustParseAddr("10.20.0.6")
	a, a6, b6 := netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
	https := []netpolicy.PortSpec{{Port: 443, Proto: netpolicy.ProtoTCP}}
	req := func(g netip.Addr, ips []netip.Addr, to time.Duration, ports []netpolicy.PortSpec) attestReq {
		return attestReq{guest: g, plan: attestElements(g, ips, to, ports), plan6: f.attestElements6Of(g, ips, to, ports)}
	}
	reqs := []attestReq{
		req(g1, []netip.Addr{a, a6}, time.Minute, nil),
		req(g1, []netip.Addr{a6, b6}, time.Hour, nil),
		req(g2, []netip.Addr{a6}, 30*time.Second, https),
	}
	type el struct {
		set, key string
		to       time.Duration
	}
	flatten := func(plan []setElems) []el {
		var out []el
		for _, se := range plan {
			for _, e := range se.elems {
				out = append(out, el{se.set, string(e.Key), e.Timeout})
			}
		}
		return out
	}
	k6 := func(g netip.Addr) []byte { return ip6Key(f.guest6Of(g)) }
	want := []el{
		{setAttested, string(concat(ipKey(g1), ipKey(a))), time.Minute},
		{setAttested6, string(concat(k6(g1), ip6Key(a6))), time.Hour},
		{setAttested6, string(concat(k6(g1), ip6Key(b6))), time.Hour},
		{setAttested6Ports, string(concat(k6(g2), protoKey(netpolicy.ProtoTCP), ip6Key(a6), portKey(443))), 30 * time.Second},
	}
	if got := flatten(mergeAttests(reqs)); !slices.Equal(got, want) {
		t.Errorf("merged %+v, want %+v", got, want)
	}
	if got, want := flatten(mergeAttests(reqs[:1])), []el{want[0], {setAttested6, string(concat(k6(g1), ip6Key(a6))), time.Minute}}; !slices.Equal(got, want) {
		t.Errorf("a lone dual-stack request sends %+v, want %+v", got, want)
	}
	if got := mergeAttests([]attestReq{req(g1, []netip.Addr{a6}, time.Minute, nil)}); len(got) != 1 || got[0].set != setAttested6 {
		t.Errorf("a v6-only answer's batch %v, want its attested6 element alone", got)
	}
	// Without Pool6 an answer's v6 addresses have no elements.
	f4 := &Firewall{cfg: FirewallConfig{Pool: netip.MustParsePrefix("10.20.0.0/16")}}
	if plan6 := f4.attestElements6Of(g1, []netip.Addr{a6}, time.Minute, nil); plan6 != nil {
		t.Errorf("v6 elements without Pool6: %v", plan6)
	}
}
