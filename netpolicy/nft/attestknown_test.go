package nft

import (
	"net/netip"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// TestKnownIndex: what is learned is covered while its life lasts (less
// the slack), a forget during a batch makes it learn nothing, and every
// forget (a guest, keys, all) makes its elements unknown.
func TestKnownIndex(t *testing.T) {
	g, g2 := netip.MustParseAddr("10.20.0.2"), netip.MustParseAddr("10.20.0.6")
	ip := []netip.Addr{netip.MustParseAddr("198.18.1.1")}
	plan := attestElements(g, ip, 30*time.Second, nil)
	plan2 := attestElements(g2, ip, 30*time.Second, nil)
	var k knownIndex
	now := time.Now()
	k.learn(k.begin(), plan, now)
	if _, ok := k.covers(g, 30*time.Second, now, plan); ok {
		t.Fatal("covered before the monitor is on")
	}
	k.forgetAll(true)
	k.learn(k.begin(), append(append([]setElems(nil), plan...), plan2...), now)
	left, ok := k.covers(g, 30*time.Second, now.Add(500*time.Millisecond), plan)
	if !ok || left > 30*time.Second-500*time.Millisecond || left < 29*time.Second {
		t.Fatalf("covers after learn: %s %v", left, ok)
	}
	if _, ok := k.covers(g, 30*time.Second, now.Add(3800*time.Millisecond), plan); ok {
		t.Error("covered with more than the slack (30 s / 8) of the timeout gone")
	}
	if _, ok := k.covers(g, time.Minute, now, plan); ok {
		t.Error("covered for a longer timeout than learned")
	}
	if _, ok := k.covers(g, 30*time.Second, now, attestElements(g, ip, 30*time.Second, []netpolicy.PortSpec{{Port: 443, Proto: netpolicy.ProtoTCP}})); ok {
		t.Error("a port-constrained element covered by a port-less one")
	}
	// A batch in flight while a forget runs learns nothing.
	ep := k.begin()
	k.forgetGuest(g)
	k.learn(ep, plan, now)
	if _, ok := k.covers(g, 30*time.Second, now, plan); ok {
		t.Error("a batch that overlapped a forget was learned")
	}
	if _, ok := k.covers(g2, 30*time.Second, now, plan2); !ok {
		t.Error("forgetting one guest forgot another")
	}
	k.forgetKeys(plan2[0].elems)
	if _, ok := k.covers(g2, 30*time.Second, now, plan2); ok {
		t.Error("a deleted key still covered")
	}
	k.learn(k.begin(), plan, now)
	k.forgetAll(false)
	k.learn(k.begin(), plan, now)
	if _, ok := k.covers(g, 30*time.Second, now, plan); ok {
		t.Error("covered with the monitor down")
	}
}

// TestKnownIndexV6: a dual-stack guest's v6 elements (guest6 . addr6 and
// guest6 . proto . addr6 . port keys) are known under its v4 address, so
// one covers call answers for an answer's elements of both families,
// forgetting the v4 guest forgets its v6 elements, and a deleted v6 key
// (a notification of 32 or 40 bytes) is forgotten; without the v6 mapping
// nothing v6 is ever known.
func TestKnownIndexV6(t *testing.T) {
	f := &Firewall{cfg: FirewallConfig{Pool: netip.MustParsePrefix("10.20.0.0/16"), Pool6: netip.MustParsePrefix("fd00:20::/112")}}
	g, g2 := netip.MustParseAddr("10.20.0.2"), netip.MustParseAddr("10.20.0.6")
	ips := []netip.Addr{netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("2001:db8::1")}
	https := []netpolicy.PortSpec{{Port: 443, Proto: netpolicy.ProtoTCP}}
	plan, plan6 := attestElements(g, ips, 30*time.Second, nil), f.attestElements6Of(g, ips, 30*time.Second, nil)
	ported6 := f.attestElements6Of(g, ips, 30*time.Second, https)
	other6 := f.attestElements6Of(g2, ips, 30*time.Second, nil)
	if len(plan6) != 1 || len(plan6[0].elems[0].Key) != 32 || len(ported6) != 1 || len(ported6[0].elems[0].Key) != 40 {
		t.Fatalf("v6 plans %v / %v, want one attested6 (32-byte) and one attested6_ports (40-byte) element", plan6, ported6)
	}
	// Keys: each set takes only its family's lengths.
	for _, c := range []struct {
		set string
		n   int
		ok  bool
	}{{setAttested, 8, true}, {setAttestedPorts, 16, true}, {setAttested6, 32, true}, {setAttested6Ports, 40, true},
		{setAttested, 32, false}, {setAttested6, 8, false}, {setAttested6Ports, 16, false}, {setStatic6, 32, false}} {
		if _, ok := newKnownKey(c.set, make([]byte, c.n)); ok != c.ok {
			t.Errorf("newKnownKey(%s, %d bytes) ok=%v, want %v", c.set, c.n, ok, c.ok)
		}
	}

	var off knownIndex // no v6 mapping: v6 elements are never known
	off.forgetAll(true)
	off.learn(off.begin(), append(append([]setElems(nil), plan...), plan6...), time.Now())
	if _, ok := off.covers(g, 30*time.Second, time.Now(), plan, plan6); ok {
		t.Error("v6 elements covered without the guest6 -> guest mapping")
	}
	if _, ok := off.covers(g, 30*time.Second, time.Now(), plan); !ok {
		t.Error("the v4 elements of the same batch not covered")
	}

	k := knownIndex{guest4Of6: f.guest4Of6}
	k.forgetAll(true)
	now := time.Now()
	k.learn(k.begin(), mergeAttests([]attestReq{{guest: g, plan: plan, plan6: plan6}, {guest: g, plan6: ported6}, {guest: g2, plan6: other6}}), now)
	if left, ok := k.covers(g, 30*time.Second, now.Add(time.Second), plan, plan6); !ok || left > 29*time.Second || left < 28*time.Second {
		t.Fatalf("a dual-stack answer's elements after learn: %s %v", left, ok)
	}
	if _, ok := k.covers(g, 30*time.Second, now, ported6); !ok {
		t.Error("attested6_ports element not covered after learn")
	}
	if _, ok := k.covers(g, 30*time.Second, now, plan, f.attestElements6Of(g, []netip.Addr{netip.MustParseAddr("2001:db8::2")}, 30*time.Second, nil)); ok {
		t.Error("an answer with an unknown v6 address covered")
	}
	if _, ok := k.covers(g2, 30*time.Second, now, plan6); ok {
		t.Error("one guest's v6 elements covered another guest's answer")
	}
	// A deleted v6 key is forgotten; the rest stays known.
	k.forgetKeys(ported6[0].elems)
	if _, ok := k.covers(g, 30*time.Second, now, ported6); ok {
		t.Error("a deleted attested6_ports key still covered")
	}
	if _, ok := k.covers(g, 30*time.Second, now, plan, plan6); !ok {
		t.Error("deleting one v6 key forgot others")
	}
	k.forgetKeys(plan6[0].elems)
	if _, ok := k.covers(g, 30*time.Second, now, plan6); ok {
		t.Error("a deleted attested6 key still covered")
	}
	// Forgetting the v4 guest forgets its v6 elements, not another's.
	k.learn(k.begin(), plan6, now)
	k.forgetGuest(g)
	if _, ok := k.covers(g, 30*time.Second, now, plan6); ok {
		t.Error("v6 elements covered after their guest was forgotten")
	}
	if _, ok := k.covers(g2, 30*time.Second, now, other6); !ok {
		t.Error("forgetting one guest forgot another's v6 elements")
	}
}
