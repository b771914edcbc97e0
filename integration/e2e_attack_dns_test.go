package integration

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/world"
)

// TestE2EAttackICMPSweepOnProxyUpstream: a session with
// CAP_NET_RAW sweeps port-unreachable errors quoting every UDP flow the DNS
// proxy has with its upstream (every source port of the ephemeral range,
// and the ports read from the conntrack table for good measure). Conntrack
// relates each to the proxy's socket; the table drops them all, because
// they are about a flow that is not the session's, so no other session's
// query fails during or after the sweep. Control: the victim resolves before
// the sweep, and the sweep's packets leave the attacker (the kernel accepts
// them).
func TestE2EAttackICMPSweepOnProxyUpstream(t *testing.T) {
	e := newE2E(t)
	e.createNetOnly("victim", "--allow", "api.e2e.test")
	attacker := e.createNetOnly("attacker", "--allow", "198.18.1.11")
	vns, ans := e.nsPath("victim"), e.nsPath("attacker")
	guest := netip.MustParseAddr(attacker.GuestIP)
	upstream := e.w.DNS.Addr()

	resolve := func(when string) {
		t.Helper()
		for i := 0; i < 10; i++ {
			if rcode, addrs := e2eLookup(t, vns, "api.e2e.test"); rcode != dns.RcodeSuccess || len(addrs) == 0 {
				t.Fatalf("%s: victim's lookup %d: %s %v", when, i, dns.RcodeToString[rcode], addrs)
			}
		}
	}
	resolve("control, before the sweep")
	ports := map[uint16]bool{}
	for _, f := range atkConntrack(t, e.w) {
		if f.Forward.Protocol == unix.IPPROTO_UDP && atkIP(f.Forward.SrcIP) == e.w.Uplink &&
			atkIP(f.Forward.DstIP) == upstream.Addr() && f.Forward.DstPort == upstream.Port() {
			ports[f.Forward.SrcPort] = true
		}
	}
	if len(ports) == 0 {
		t.Fatalf("control: no conntrack entry of the proxy's upstream sockets (%s -> %s)", e.w.Uplink, upstream)
	}
	raw, err := world.OpenRaw(ans)
	if err != nil {
		t.Fatalf("raw socket in the attacker's netns: %v", err)
	}
	defer raw.Close()
	sweep := func() error {
		send := func(p uint16) error {
			return raw.Send(world.ICMPPortUnreachable(guest, e.w.Uplink, netip.AddrPortFrom(e.w.Uplink, p), upstream, []byte("sweep")))
		}
		for p := range ports {
			if err := send(p); err != nil {
				return err
			}
		}
		for p := 32768; p < 61000; p++ {
			if err := send(uint16(p)); err != nil {
				return err
			}
		}
		return nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
			if err := sweep(); err != nil {
				t.Errorf("send the sweep: %v", err)
				return
			}
		}
	}()
	// During the sweep, many queries in flight at once (an error that
	// kills a socket fails the queries waiting on it), and after it.
	var mu sync.Mutex
	var failed, answered int
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				m, err := world.Lookup(vns, e2eAnycastDNS, "api.e2e.test", dns.TypeA, false, world.ReachTimeout)
				mu.Lock()
				if err != nil || m.Rcode != dns.RcodeSuccess {
					failed++
				} else {
					answered++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failed > 0 || answered == 0 {
		t.Errorf("during the sweep the victim got %d failed lookups and %d answers, want none failed", failed, answered)
	}
	resolve("after the sweep")
}
