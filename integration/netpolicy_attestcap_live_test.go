package integration

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// TestNetpolicyAttestCapConcurrent: answers for one guest that arrive
// together cannot pass the attested-element cap between them, in either
// family. 32 answers, each with one new v4 and one new v6 address, are
// released at once against a cap of 8: exactly 8 are admitted, the others
// fail with ErrAttestCap, and the kernel holds 8 elements of each family
// for the guest. Before each answer's elements were reserved at admission,
// every answer passed the check before any was recorded, and the kernel
// took them all. The control: the same answers one at a time fill the cap
// of another guest exactly, the ninth refused.
func TestNetpolicyAttestCapConcurrent(t *testing.T) {
	w := world.New(t)
	prefix := "t" + w.ID[:4]
	cfg := dualStackFirewallConfig(t, w, prefix)
	const limit, answers = 8, 32
	cfg.AttestFloor, cfg.MaxAttested = time.Second, limit
	fw := openEnsured(t, cfg, true)
	addSession := func(name, iface string, guest netip.Addr) {
		t.Helper()
		r := nft.SessionRules{Name: name, HostIface: iface, Guest: guest, Egress: netpolicy.ModeAllowlist}
		if err := fw.AddSession(r); err != nil {
			t.Fatal(err)
		}
	}
	answer := func(i int) []netip.Addr {
		return []netip.Addr{
			netip.MustParseAddr(fmt.Sprintf("198.18.200.%d", 10+i)),
			netip.MustParseAddr(fmt.Sprintf("2001:2:0:1::%x", 0x100+i)),
		}
	}
	held := func(guest netip.Addr) (v4, v6 int) {
		t.Helper()
		list, err := fw.Attested(guest)
		if err != nil {
			t.Fatalf("attested of %s: %v", guest, err)
		}
		for _, a := range list {
			if a.IP.Is4() {
				v4++
			} else {
				v6++
			}
		}
		return v4, v6
	}
	const ttl = 30 * time.Second

	// The control: one answer at a time fills the cap exactly.
	seq := netip.MustParseAddr("10.20.0.6")
	addSession("capseq", prefix+"1h", seq)
	for i := range limit {
		if _, err := fw.Attest(seq, answer(i), ttl, nil); err != nil {
			t.Fatalf("control: answer %d of %d within the cap: %v", i+1, limit, err)
		}
	}
	if _, err := fw.Attest(seq, answer(limit), ttl, nil); !errors.Is(err, netpolicy.ErrAttestCap) {
		t.Fatalf("control: answer %d past the cap of %d: %v, want %v", limit+1, limit, err, netpolicy.ErrAttestCap)
	}
	if v4, v6 := held(seq); v4 != limit || v6 != limit {
		t.Fatalf("control: the kernel holds %d v4 and %d v6 elements, want %d of each", v4, v6, limit)
	}

	// The attack: every answer at once.
	guest := netip.MustParseAddr("10.20.0.2")
	addSession("capcon", prefix+"0h", guest)
	var (
		start    = make(chan struct{})
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted int
		other    []error
	)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := fw.Attest(guest, answer(i), ttl, nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
			case !errors.Is(err, netpolicy.ErrAttestCap):
				other = append(other, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(other) > 0 {
		t.Fatalf("%d answers failed for another reason than the cap, first: %v", len(other), other[0])
	}
	if admitted != limit {
		t.Errorf("%d of %d concurrent answers admitted, want exactly the cap (%d)", admitted, answers, limit)
	}
	if v4, v6 := held(guest); v4 > limit || v6 > limit {
		t.Errorf("after %d concurrent answers the kernel holds %d v4 and %d v6 elements for %s, past the cap of %d", answers, v4, v6, guest, limit)
	}
}
