package integration

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// Live tests of Attest's knowledge (netpolicy/nft/attestknown.go): an element
// the Firewall inserted and nothing removed since, with enough life left,
// is answered without a kernel round trip; an element removed in any way
// is never vouched for again without one (the external delete within the
// monitor's window, which the test measures and bounds).

// knownWindowBound bounds the measured window between another writer's
// delete and the monitor forgetting the element (normally well under a
// millisecond; the bound leaves room for a loaded CI machine).
const knownWindowBound = 250 * time.Millisecond

// liveCopyLife outlasts the refresh's copy of an element a probe used
// (attested_live, for the floor of 1 s): an external delete of the DNS
// element alone leaves it.
const liveCopyLife = 1500 * time.Millisecond

// attestCounted attests ips for guest and reports whether it took a kernel
// round trip, with the effective timeout.
func attestCounted(t *testing.T, fw *nft.Firewall, guest netip.Addr, ips []netip.Addr, ttl time.Duration, ports []netpolicy.PortSpec) (time.Duration, bool) {
	t.Helper()
	before := fw.AttestRoundTrips()
	eff, err := fw.Attest(guest, ips, ttl, ports)
	if err != nil {
		t.Fatalf("attest %v for %s: %v", ips, guest, err)
	}
	return eff, fw.AttestRoundTrips() != before
}

// expiresOf returns the kernel's remaining life of guest's attested
// element for ip (port 0: the port-less one).
func expiresOf(t *testing.T, fw *nft.Firewall, guest, ip netip.Addr, port uint16) (time.Duration, bool) {
	t.Helper()
	list, err := fw.Attested(guest)
	if err != nil {
		t.Fatalf("attested: %v", err)
	}
	for _, a := range list {
		if a.IP == ip && a.Port == port {
			return a.Expires, true
		}
	}
	return 0, false
}

// waitKnown attests until a call is answered without a round trip (the
// monitor may still be joining right after Ensure).
func waitKnown(t *testing.T, fw *nft.Firewall, guest netip.Addr, ips []netip.Addr, ttl time.Duration, ports []netpolicy.PortSpec) time.Duration {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		eff, rt := attestCounted(t, fw, guest, ips, ttl, ports)
		if !rt {
			return eff
		}
		if time.Now().After(deadline) {
			t.Fatalf("attest of %v for %s never skipped the kernel (the positive control: a known element)", ips, guest)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// externalDelete deletes guest's element for ip from set with a netlink
// connection of its own, as another writer of the table (an operator's
// tooling) would; flush empties the whole set instead.
func externalDelete(t *testing.T, e *npEnv, set string, key []byte, flush bool) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(e.w.Host)))
	if err != nil {
		t.Fatalf("nftables: %v", err)
	}
	s, err := c.GetSetByName(&nftables.Table{Name: e.prefix, Family: nftables.TableFamilyINet}, set)
	if err != nil {
		t.Fatalf("set %s: %v", set, err)
	}
	if flush {
		c.FlushSet(s)
	} else if err := c.SetDeleteElements(s, []nftables.SetElement{{Key: key}}); err != nil {
		t.Fatalf("encode delete: %v", err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("delete from set %s: %v", set, err)
	}
}

func pairKey(a, b netip.Addr) []byte { return append(a.AsSlice(), b.AsSlice()...) }

// TestNetpolicyAttestKnown: the positive control (a known element is
// answered without a round trip, for no longer than the kernel keeps it),
// then each way an element goes: another writer's delete and flush (the
// window measured), a revoke by UpdateSession, and a session removal with
// a new session on the same guest address.
func TestNetpolicyAttestKnown(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	s, r := e.session(t, "known", netpolicy.ModeAllowlist, nil)
	ns := s.NetnsPath
	web0, web1, web2 := w.Web[0], w.Web[1], w.Web[2]
	const ttl = 30 * time.Second

	// Positive control: the first attest is a round trip, the next ones
	// are not, and promise no more than the kernel's remaining life.
	if _, rt := attestCounted(t, e.fw, s.Guest, []netip.Addr{web0}, ttl, nil); !rt {
		t.Fatalf("the first attest of %s skipped the kernel", web0)
	}
	eff := waitKnown(t, e.fw, s.Guest, []netip.Addr{web0}, ttl, nil)
	asked := time.Now()
	left, ok := expiresOf(t, e.fw, s.Guest, web0, 0)
	if !ok {
		t.Fatalf("%s not in the kernel's attested set", web0)
	}
	if eff > ttl || eff < ttl-ttl/8 {
		t.Errorf("a known attest promised %s, want within the slack (an eighth) below %s", eff, ttl)
	}
	// The kernel's expiry in whole milliseconds, read after the answer.
	if eff > left+time.Since(asked)+10*time.Millisecond {
		t.Errorf("a known attest promised %s, the kernel keeps the element %s (read %s later)", eff, left, time.Since(asked))
	}
	expectReach(t, "known attested address", tcpProbe(ns, netip.AddrPortFrom(web0, 7)))
	if e.fw.AttestSkipped() == 0 {
		t.Errorf("AttestSkipped is 0 after a skipped attest")
	}
	// Port-constrained elements (two sets) too.
	port := []netpolicy.PortSpec{{Port: 7, Proto: netpolicy.ProtoTCP}}
	attestCounted(t, e.fw, s.Guest, []netip.Addr{web1}, ttl, port)
	waitKnown(t, e.fw, s.Guest, []netip.Addr{web1}, ttl, port)
	// A longer timeout than the element has is a round trip.
	if _, rt := attestCounted(t, e.fw, s.Guest, []netip.Addr{web0}, 2*ttl, nil); !rt {
		t.Errorf("an attest for longer than the known element's life skipped the kernel")
	}

	// Another writer deletes the element: the address is dropped, and the
	// next attest waits for the kernel and makes it reachable again.
	externalDelete(t, e, "attested", pairKey(s.Guest, web0), false)
	time.Sleep(liveCopyLife) // the reach probe's refreshed copy (attested_live) expires
	expectBlocked(t, "after an external delete", tcpProbe(ns, netip.AddrPortFrom(web0, 7)))
	if _, rt := attestCounted(t, e.fw, s.Guest, []netip.Addr{web0}, ttl, nil); !rt {
		t.Fatalf("an externally deleted element was vouched for without a round trip")
	}
	expectReach(t, "re-attested after the external delete", tcpProbe(ns, netip.AddrPortFrom(web0, 7)))

	// The window: attest in a loop right after the delete returns.
	waitKnown(t, e.fw, s.Guest, []netip.Addr{web0}, ttl, nil)
	externalDelete(t, e, "attested", pairKey(s.Guest, web0), false)
	deleted, vouched := time.Now(), 0
	for {
		if _, rt := attestCounted(t, e.fw, s.Guest, []netip.Addr{web0}, ttl, nil); rt {
			break
		}
		vouched++
		if time.Since(deleted) > knownWindowBound {
			t.Fatalf("an externally deleted element was still vouched for %s after the delete (%d answers)", time.Since(deleted), vouched)
		}
		time.Sleep(50 * time.Microsecond)
	}
	t.Logf("external delete: forgotten within %s (%d attests vouched in the window)", time.Since(deleted), vouched)
	if _, ok := expiresOf(t, e.fw, s.Guest, web0, 0); !ok {
		t.Errorf("the round trip after the delete did not put %s back", web0)
	}

	// A flush of a set by another writer: every element of it unknown.
	waitKnown(t, e.fw, s.Guest, []netip.Addr{web1}, ttl, port)
	externalDelete(t, e, "attested_ports", nil, true)
	time.Sleep(liveCopyLife)
	expectBlocked(t, "after an external flush", tcpProbe(ns, netip.AddrPortFrom(web1, 7)))
	if _, rt := attestCounted(t, e.fw, s.Guest, []netip.Addr{web1}, ttl, port); !rt {
		t.Fatalf("an element of a flushed set was vouched for without a round trip")
	}
	expectReach(t, "re-attested after the flush", tcpProbe(ns, netip.AddrPortFrom(web1, 7)))

	// A revoke by UpdateSession: blocked at once, and the next attest (a
	// later policy allowing it again) is a round trip.
	waitKnown(t, e.fw, s.Guest, []netip.Addr{web2}, ttl, nil)
	if err := e.fw.UpdateSession(nft.SessionUpdate{Old: r, New: r,
		Stale: []netpolicy.Attestation{{Addrs: []netip.Addr{web2}}}}); err != nil {
		t.Fatalf("update: %v", err)
	}
	expectBlocked(t, "revoked by an update", tcpProbe(ns, netip.AddrPortFrom(web2, 7)))
	if _, rt := attestCounted(t, e.fw, s.Guest, []netip.Addr{web2}, ttl, nil); !rt {
		t.Fatalf("a revoked element was vouched for without a round trip")
	}
	expectReach(t, "re-attested after the revoke", tcpProbe(ns, netip.AddrPortFrom(web2, 7)))

	// Session removal, then a new session on the same guest address: it
	// inherits no knowledge (and no element).
	waitKnown(t, e.fw, s.Guest, []netip.Addr{web2}, ttl, nil)
	if err := e.fw.RemoveSession(r); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, ok := expiresOf(t, e.fw, s.Guest, web2, 0); ok {
		t.Fatalf("the removed session's element for %s is still in the kernel", web2)
	}
	if err := e.fw.AddSession(r); err != nil {
		t.Fatalf("add again: %v", err)
	}
	expectBlocked(t, "a new session on the same address", tcpProbe(ns, netip.AddrPortFrom(web2, 7)))
	if _, rt := attestCounted(t, e.fw, s.Guest, []netip.Addr{web2}, ttl, nil); !rt {
		t.Fatalf("a new session on the same guest address inherited the old one's knowledge")
	}
	if _, ok := expiresOf(t, e.fw, s.Guest, web2, 0); !ok {
		t.Errorf("the new session's attest did not insert %s", web2)
	}
	expectReach(t, "the new session's attested address", tcpProbe(ns, netip.AddrPortFrom(web2, 7)))
}

// TestNetpolicyAttestKnownRestart: a second Firewall on the table (a
// restarted daemon) knows nothing the first inserted: its first attest is
// a round trip.
func TestNetpolicyAttestKnownRestart(t *testing.T) {
	e := newNPEnv(t, time.Second)
	s, _ := e.session(t, "knownr", netpolicy.ModeAllowlist, nil)
	web0 := e.w.Web[0]
	attestCounted(t, e.fw, s.Guest, []netip.Addr{web0}, time.Minute, nil)
	waitKnown(t, e.fw, s.Guest, []netip.Addr{web0}, time.Minute, nil)
	fw2 := e.openFirewall(t)
	if _, rt := attestCounted(t, fw2, s.Guest, []netip.Addr{web0}, time.Minute, nil); !rt {
		t.Fatalf("a restarted Firewall vouched for an element it never inserted")
	}
	waitKnown(t, fw2, s.Guest, []netip.Addr{web0}, time.Minute, nil)
}

// TestNetpolicyAttestKnownBurst: a burst of a thousand answers for new
// addresses (a thousand insert notifications at once) keeps the monitor,
// and with it the knowledge: the next thousand need no round trip.
func TestNetpolicyAttestKnownBurst(t *testing.T) {
	e := newNPEnv(t, time.Minute)
	s, _ := e.session(t, "burst", netpolicy.ModeAllowlist, nil)
	waitKnown(t, e.fw, s.Guest, []netip.Addr{e.w.Web[0]}, time.Minute, nil) // the monitor has joined
	addrs := world.PublicAddrs(1000)
	attestAll := func() {
		var wg sync.WaitGroup
		for g := range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, a := range addrs[g*10 : g*10+10] {
					if _, err := e.fw.Attest(s.Guest, []netip.Addr{a}, time.Minute, nil); err != nil {
						t.Errorf("attest %s: %v", a, err)
					}
				}
			}()
		}
		wg.Wait()
	}
	attestAll()
	time.Sleep(100 * time.Millisecond) // the notifications are read
	if n := e.fw.AttestMonitorEnded(); n != 0 {
		t.Fatalf("the monitor ended %d times under a burst of 1000 inserts", n)
	}
	before := e.fw.AttestRoundTrips()
	attestAll()
	if n := e.fw.AttestRoundTrips() - before; n != 0 {
		t.Errorf("%d round trips for 1000 known elements, want 0", n)
	}
}
