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
	if _, ok := k.covers(g, plan, 30*time.Second, now); ok {
		t.Fatal("covered before the monitor is on")
	}
	k.forgetAll(true)
	k.learn(k.begin(), append(append([]setElems(nil), plan...), plan2...), now)
	left, ok := k.covers(g, plan, 30*time.Second, now.Add(500*time.Millisecond))
	if !ok || left > 30*time.Second-500*time.Millisecond || left < 29*time.Second {
		t.Fatalf("covers after learn: %s %v", left, ok)
	}
	if _, ok := k.covers(g, plan, 30*time.Second, now.Add(3800*time.Millisecond)); ok {
		t.Error("covered with more than the slack (30 s / 8) of the timeout gone")
	}
	if _, ok := k.covers(g, plan, time.Minute, now); ok {
		t.Error("covered for a longer timeout than learned")
	}
	if _, ok := k.covers(g, attestElements(g, ip, 30*time.Second, []netpolicy.PortSpec{{Port: 443, Proto: netpolicy.ProtoTCP}}), 30*time.Second, now); ok {
		t.Error("a port-constrained element covered by a port-less one")
	}
	// A batch in flight while a forget runs learns nothing.
	ep := k.begin()
	k.forgetGuest(g)
	k.learn(ep, plan, now)
	if _, ok := k.covers(g, plan, 30*time.Second, now); ok {
		t.Error("a batch that overlapped a forget was learned")
	}
	if _, ok := k.covers(g2, plan2, 30*time.Second, now); !ok {
		t.Error("forgetting one guest forgot another")
	}
	k.forgetKeys(plan2[0].elems)
	if _, ok := k.covers(g2, plan2, 30*time.Second, now); ok {
		t.Error("a deleted key still covered")
	}
	k.learn(k.begin(), plan, now)
	k.forgetAll(false)
	k.learn(k.begin(), plan, now)
	if _, ok := k.covers(g, plan, 30*time.Second, now); ok {
		t.Error("covered with the monitor down")
	}
}
