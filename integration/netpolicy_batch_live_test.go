package integration

import (
	"errors"
	"net/netip"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// Live tests of the firewall's batching: group-committed attests and
// removal by key.

var errAttestInjected = errors.New("injected attest failure")

// TestNetpolicyAttestGroupCommit: many concurrent attests (coalesced into
// shared batches) all land with their own timeouts; a caller whose batch
// the kernel would reject (the AttestFault seam) fails alone, every time,
// while the calls sharing its batches succeed.
func TestNetpolicyAttestGroupCommit(t *testing.T) {
	e := newNPEnv(t, time.Second)
	bad := fakeSession(e.prefix, 99).Guest
	cfg := e.cfg
	cfg.AttestFault = func(g netip.Addr) error {
		if g == bad {
			return errAttestInjected
		}
		return nil
	}
	fw, err := nft.OpenFirewall(cfg)
	if err != nil {
		t.Fatalf("open firewall: %v", err)
	}
	t.Cleanup(func() { fw.Close() })
	if err := fw.Ensure(); err != nil {
		t.Fatalf("ensure: %v", err)
	}
	const workers, calls = 16, 40
	ttlOf := func(i int) time.Duration { return time.Duration(120+60*i) * time.Second }
	var wg sync.WaitGroup
	errs := make(chan error, (workers+4)*calls)
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := fakeSession(e.prefix, i).Guest
			var ports []netpolicy.PortSpec
			if i%2 == 1 {
				ports = []netpolicy.PortSpec{{Port: 443, Proto: netpolicy.ProtoTCP}}
			}
			for j := 0; j < calls; j++ {
				eff, err := fw.Attest(g, world.PublicAddrs(j + 1)[j:], ttlOf(i), ports)
				if err != nil {
					errs <- err
				} else if eff != ttlOf(i) {
					errs <- errors.New("effective timeout " + eff.String() + ", want " + ttlOf(i).String())
				}
			}
		}()
	}
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < calls; j++ {
				if _, err := fw.Attest(bad, world.PublicAddrs(1), time.Minute, nil); !errors.Is(err, errAttestInjected) {
					errs <- errors.New("attest for the faulty guest: want the injected error, got " + errString(err))
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	all, err := fw.AllAttested()
	if err != nil {
		t.Fatalf("all attested: %v", err)
	}
	for i := 0; i < workers; i++ {
		list := all[fakeSession(e.prefix, i).Guest]
		if len(list) != calls {
			t.Errorf("worker %d: %d attested elements, want %d", i, len(list), calls)
		}
		for _, a := range list {
			if a.Expires > ttlOf(i) || a.Expires < ttlOf(i)-30*time.Second {
				t.Errorf("worker %d: %s expires in %s, want about %s", i, a.IP, a.Expires, ttlOf(i))
				break
			}
			if (a.Port != 0) != (i%2 == 1) {
				t.Errorf("worker %d: element %+v has the wrong shape", i, a)
				break
			}
		}
	}
	if n := len(all[bad]); n != 0 {
		t.Errorf("the faulty guest has %d attested elements, want none", n)
	}
	// The fault did not poison the connection for later batches.
	if _, err := fw.Attest(fakeSession(e.prefix, 0).Guest, world.PublicAddrs(1), time.Minute, nil); err != nil {
		t.Errorf("attest after injected failures: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// TestNetpolicyRemoveSessionByKey: RemoveSession with the rules a session
// was added with removes every element of it (static of each shape,
// public mode, its peers and the peers naming it, attested with and without
// ports, counters) and nothing of others; also when its attested elements
// were inserted before a restart, when one just expired (the by-key batch
// is rejected and the dump takes over), when called again, and with the
// guest only (an orphan).
func TestNetpolicyRemoveSessionByKey(t *testing.T) {
	world.RequireTool(t, "nft")
	e := newNPEnv(t, time.Second)
	table := func() string {
		return run(t, "ip", "netns", "exec", e.w.HostName, "nft", "list", "table", "inet", e.prefix)
	}
	present := func(g netip.Addr) bool {
		return regexp.MustCompile(`(^|[^0-9.])` + regexp.QuoteMeta(g.String()) + `([^0-9]|$)`).MatchString(table())
	}
	rules := make([]nft.SessionRules, 6)
	for i := range rules {
		rules[i] = fakeSession(e.prefix, i)
	}
	a, b := &rules[0], &rules[1]
	a.Egress = netpolicy.ModePublic
	a.Static = append(a.Static,
		netpolicy.Target{Prefix: netip.MustParsePrefix("198.18.2.0/24")},
		netpolicy.Target{Prefix: netip.MustParsePrefix("198.18.3.0/24"), Port: 8443, Proto: netpolicy.ProtoTCP})
	a.Peers = []netip.Addr{b.Guest}
	b.Peers = []netip.Addr{a.Guest}
	for i, r := range rules {
		if err := e.fw.AddSession(r); err != nil {
			t.Fatalf("add session %d: %v", i, err)
		}
		if _, err := e.fw.Attest(r.Guest, world.PublicAddrs(3), time.Hour, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := e.fw.Attest(r.Guest, world.PublicAddrs(2), time.Hour, []netpolicy.PortSpec{{Port: 53, Proto: netpolicy.ProtoAny}}); err != nil {
			t.Fatal(err)
		}
	}
	removed := map[netip.Addr]bool{}
	check := func(step string) {
		t.Helper()
		for _, r := range rules {
			if got := present(r.Guest); got == removed[r.Guest] {
				t.Errorf("%s: guest %s present %t, want %t\n%s", step, r.Guest, got, !removed[r.Guest], table())
			}
		}
	}
	remove := func(step string, fw *nft.Firewall, r nft.SessionRules) {
		t.Helper()
		if err := fw.RemoveSession(r); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		removed[r.Guest] = true
		check(step)
	}
	check("before removals")
	remove("remove by key", e.fw, *a)
	remove("remove again", e.fw, *a)
	if list, err := e.fw.Attested(b.Guest); err != nil || len(list) != 7 {
		t.Errorf("the peer's attested elements after the removal: %d, %v; want 7", len(list), err)
	}

	// Attested 1 s ago with the floor of 1 s: gone from the kernel, not
	// from the index (slack): the by-key batch fails, the dump removes.
	if _, err := e.fw.Attest(rules[2].Guest, world.PublicAddrs(5)[4:], time.Second, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1300 * time.Millisecond)
	remove("remove after an attested element expired", e.fw, rules[2])

	remove("remove an orphan by guest", e.fw, nft.SessionRules{HostIface: rules[3].HostIface, Guest: rules[3].Guest})

	// A restarted daemon: its index is seeded by Ensure.
	e.reopenFirewall(t)
	remove("remove after a restart", e.fw, rules[4])
	remove("remove after a restart, again", e.fw, rules[4])
}
