package integration

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// TestNetpolicyDualStackAttestOneBatch: a dual-stack answer's v4 and v6
// elements are inserted in ONE acked batch (a round trip for both), an
// answer whose elements are all known needs none (the positive control of
// the skip, for both families), another writer's delete of the v6 element
// alone makes the next answer a round trip again (the monitor forgets
// 32-byte guest6 . address6 keys), and an answer refused by the v6 cap
// inserts neither family's elements while one within it passes. (A
// v6-only answer counts one round trip: AttestRoundTrips counts the
// batches holding v6 elements, so the dual-stack answer's one is one
// batch for both.)
func TestNetpolicyDualStackAttestOneBatch(t *testing.T) {
	w := world.New(t)
	prefix := "t" + w.ID[:4]
	cfg := dualStackFirewallConfig(t, w, prefix)
	cfg.AttestFloor, cfg.MaxAttested = time.Second, 3
	fw := openEnsured(t, cfg, true)
	guest, guest6 := netip.MustParseAddr("10.20.0.2"), netip.MustParseAddr("fd00:20::2")
	r := nft.SessionRules{Name: "a6", HostIface: prefix + "0h", Guest: guest, Egress: netpolicy.ModeAllowlist}
	if err := fw.AddSession(r); err != nil {
		t.Fatal(err)
	}
	v4, v6 := w.Web[0], netip.MustParseAddr("2001:2:0:1::11")
	answer := []netip.Addr{v4, v6}
	const ttl = 30 * time.Second

	rounds := func(ips []netip.Addr) uint64 {
		t.Helper()
		before := fw.AttestRoundTrips()
		if _, err := fw.Attest(guest, ips, ttl, nil); err != nil {
			t.Fatalf("attest %v: %v", ips, err)
		}
		return fw.AttestRoundTrips() - before
	}
	inKernel := func(ip netip.Addr) bool {
		t.Helper()
		list, err := fw.Attested(guest)
		if err != nil {
			t.Fatalf("attested: %v", err)
		}
		for _, a := range list {
			if a.IP == ip {
				return true
			}
		}
		return false
	}
	waitSkipped := func(what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for rounds(answer) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: a known dual-stack answer never skipped the kernel", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	if n := rounds(answer); n != 1 {
		t.Fatalf("a new dual-stack answer took %d round trips, want 1 (both families in one batch)", n)
	}
	if !inKernel(v4) || !inKernel(v6) {
		t.Fatalf("after the batch: %s in the kernel %v, %s %v; want both", v4, inKernel(v4), v6, inKernel(v6))
	}
	waitSkipped("positive control")
	if fw.AttestSkipped() == 0 {
		t.Error("AttestSkipped is 0 after a skipped dual-stack answer")
	}

	// Another writer deletes the v6 element alone: the answer waits for
	// the kernel again (within the monitor's window) and puts it back.
	c, err := nftables.New(nftables.WithNetNSFd(int(w.Host)))
	if err != nil {
		t.Fatal(err)
	}
	set, err := c.GetSetByName(&nftables.Table{Name: prefix, Family: nftables.TableFamilyINet}, "attested6")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetDeleteElements(set, []nftables.SetElement{{Key: append(guest6.AsSlice(), v6.AsSlice()...)}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("delete the v6 element: %v", err)
	}
	deleted := time.Now()
	for rounds(answer) == 0 {
		if time.Since(deleted) > knownWindowBound {
			t.Fatalf("a deleted v6 element was still vouched for %s after the delete", time.Since(deleted))
		}
		time.Sleep(50 * time.Microsecond)
	}
	if !inKernel(v6) {
		t.Fatalf("the round trip after the delete did not put %s back", v6)
	}
	waitSkipped("after the re-insert")

	// The v6 cap (3): one new v6 address passes (2 held), then an answer
	// with a new v4 and two new v6 addresses is refused, and inserts
	// neither family's (the v4 one would have fitted its own cap).
	v6b, v6c, v6d := netip.MustParseAddr("2001:2:0:1::12"), netip.MustParseAddr("2001:2:0:1::13"), netip.MustParseAddr("2001:2:0:1::14")
	if n := rounds([]netip.Addr{v6b}); n != 1 {
		t.Errorf("a new v6 address within the cap took %d round trips, want 1", n)
	}
	v4b := w.Web[1]
	if _, err := fw.Attest(guest, []netip.Addr{v4b, v6c, v6d}, ttl, nil); !errors.Is(err, netpolicy.ErrAttestCap) {
		t.Fatalf("an answer past the v6 cap: %v, want %v", err, netpolicy.ErrAttestCap)
	}
	if inKernel(v4b) || inKernel(v6c) || inKernel(v6d) {
		t.Errorf("an answer refused by the v6 cap inserted elements: %s %v, %s %v, %s %v", v4b, inKernel(v4b), v6c, inKernel(v6c), v6d, inKernel(v6d))
	}
}
