package integration

// The refresh of AAAA-attested addresses by new connections over IPv6, on
// a dual-stack daemon (--dns-min-ttl 5s in the test daemon), the twin of
// e2e_attest_refresh_test.go: a name answered with TTL 1 lives 5 s; each
// new v6 connection to it keeps it alive 5 s more (attested6_live), up to
// --attest-max-lifetime after the answer; an update's revoke and the
// session's removal end it.

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// dial6 opens (and closes) a TCP connection from the session's netns to
// dst, and reports whether it connected.
func (e *e2eEnv) dial6(name string, dst netip.AddrPort) bool {
	e.t.Helper()
	c, err := world.DialTCP(e.nsPath(name), dst, 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// resolve6To looks host up (AAAA) over the session's v6 DNS proxy address
// dns6 and fails unless the answer is want alone.
func (e *e2eEnv) resolve6To(name, dns6, host string, want netip.Addr) {
	e.t.Helper()
	m, err := world.Lookup(e.nsPath(name), netip.AddrPortFrom(netip.MustParseAddr(dns6), 53), host, dns.TypeAAAA, false, 3*time.Second)
	if err != nil {
		e.t.Fatalf("%s: AAAA %s: %v", name, host, err)
	}
	if got := world.Addrs6Of(m); len(got) != 1 || got[0] != want {
		e.t.Fatalf("%s: AAAA %s = %v, want %s", name, host, got, want)
	}
}

// TestE2EDualStackAttestRefresh: a v6 address used every 1.5 s stays
// allowed for 12 s although its AAAA attestation lives 5 s; the control,
// attested at the same moment and left idle, is refused (an event with
// reason expired); a session whose update revokes the name is not
// refreshed back by its connections, while another session's use of the
// same address goes on; removing the session deletes its live element.
// (The name check stays on: a live hit goes through accept_named6 as the
// attested hit does, TestNetpolicyDualStackTableReadsAsDocumented.)
func TestE2EDualStackAttestRefresh(t *testing.T) {
	e, _ := newDualStackE2E(t)
	used, idle := web6Echo, lit6Echo
	e.w.DNS.AddRR("used.refresh6.e2e.test. 1 IN AAAA " + used.Addr().String())
	e.w.DNS.AddRR("idle.refresh6.e2e.test. 1 IN AAAA " + idle.Addr().String())
	rf := e.createNetOnly("rf6", "--allow", "used.refresh6.e2e.test", "--allow", "idle.refresh6.e2e.test")
	rv := e.createNetOnly("rv6", "--allow", "used.refresh6.e2e.test")
	fe := e.followFlows("rf6")
	fr := e.followFlows("rv6")

	e.resolve6To("rf6", rf.DNS6, "used.refresh6.e2e.test", used.Addr())
	e.resolve6To("rf6", rf.DNS6, "idle.refresh6.e2e.test", idle.Addr())
	e.resolve6To("rv6", rv.DNS6, "used.refresh6.e2e.test", used.Addr())
	start := time.Now()
	for i := 0; time.Since(start) < 12*time.Second; i++ {
		if !e.dial6("rf6", used) {
			t.Fatalf("connection %d, %s after the answer: the used v6 address is no longer allowed", i, time.Since(start).Round(time.Millisecond))
		}
		if i == 0 && !e.dial6("rf6", idle) {
			t.Fatalf("control: the idle v6 address is unreachable right after its answer")
		}
		if !e.dial6("rv6", used) {
			t.Fatalf("rv6, connection %d: the used v6 address is no longer allowed", i)
		}
		time.Sleep(1500 * time.Millisecond)
	}
	fe.drain(t, 200*time.Millisecond)
	// rf6 keeps using the address (a connection at least every 5 s)
	// throughout what follows.
	stillUsed := func(when string) {
		t.Helper()
		if !e.dial6("rf6", used) {
			t.Fatalf("%s: the used v6 address is no longer allowed", when)
		}
	}
	stillUsed("after the loop")
	if got := e2eNftAttested6(t, e.w, e.d.Prefix, netip.MustParseAddr(rf.Guest6IP)); slices.Contains(got, used.Addr()) {
		t.Errorf("attested6 of %s still holds %s 12 s after a 5 s answer: the loop proved nothing of the refresh", rf.Guest6IP, used.Addr())
	}

	// The control: left idle for 12 s, its attestation (5 s) ran out.
	if e.dial6("rf6", idle) {
		t.Fatalf("control: the idle v6 address is still allowed 12 s after a 5 s attestation")
	}
	stillUsed("after the control")
	fe.expect(t, "idle v6 address", map[string]any{"reason": "expired", "dst": idle.Addr().String(), "dport": float64(7)})
	stillUsed("after the event")

	// Revoked: rv6's refreshed element goes with the update, and its own
	// connections do not bring it back; rf6's use of the address goes on.
	e.update("rv6", "--revoke", "used.refresh6.e2e.test")
	fr.drain(t, 200*time.Millisecond)
	stillUsed("after the revoke")
	for i := 0; i < 4; i++ {
		if e.dial6("rv6", used) {
			t.Fatalf("rv6, attempt %d after the revoke: the revoked v6 address is reachable", i)
		}
		if !e.dial6("rf6", used) {
			t.Fatalf("rf6, attempt %d after rv6's revoke: its own refreshed v6 address is no longer allowed", i)
		}
		time.Sleep(time.Second)
	}
	fr.expect(t, "revoked v6 address", map[string]any{"reason": "not-allowed", "dst": used.Addr().String()})

	// Deleting rf6 removes its refreshed element with it (rv6's went with
	// the revoke): nothing in the live set names the address.
	list := func() string {
		return run(t, "ip", "netns", "exec", e.w.HostName, "nft", "list", "set", "inet", e.d.Prefix, "attested6_live")
	}
	if out := list(); !strings.Contains(out, rf.Guest6IP+" . "+used.Addr().String()) {
		t.Fatalf("positive control: rf6's refreshed element is not in attested6_live:\n%s", out)
	}
	if out := list(); strings.Contains(out, rv.Guest6IP+" . ") {
		t.Errorf("rv6's revoked element is still in attested6_live:\n%s", out)
	}
	e.cli("session", "rm", "rf6")
	if out := list(); strings.Contains(out, used.Addr().String()) {
		t.Errorf("after rm rf6 and rv6's revoke, attested6_live still lists %s:\n%s", used.Addr(), out)
	}
}

// TestE2EDualStackAttestMaxLifetime: with --attest-max-lifetime 10s a v6
// address used every second stops being allowed within the maximum plus
// one sweep period (2.5 s) and one refresh (5 s), whatever the use; the
// drop says expired.
func TestE2EDualStackAttestMaxLifetime(t *testing.T) {
	e, _ := newDualStackE2E(t, "--attest-max-lifetime", "10s")
	dst := web6Echo
	e.w.DNS.AddRR("max.refresh6.e2e.test. 1 IN AAAA " + dst.Addr().String())
	info := e.createNetOnly("mx6", "--allow", "max.refresh6.e2e.test")
	fe := e.followFlows("mx6")
	e.resolve6To("mx6", info.DNS6, "max.refresh6.e2e.test", dst.Addr())
	start := time.Now()
	var lastOK, firstFail time.Duration
	for time.Since(start) < 20*time.Second {
		at := time.Since(start)
		ok := e.dial6("mx6", dst)
		switch {
		case ok && firstFail != 0:
			t.Fatalf("connected %s after the answer, after a failure at %s: the v6 element came back", at.Round(time.Millisecond), firstFail.Round(time.Millisecond))
		case ok:
			lastOK = at
		case firstFail == 0:
			firstFail = at
		}
		time.Sleep(time.Second)
	}
	t.Logf("last v6 connection %s, first refusal %s after the answer", lastOK.Round(time.Millisecond), firstFail.Round(time.Millisecond))
	if lastOK < 8*time.Second {
		t.Errorf("the used v6 address stopped at %s, before the maximum lifetime (10 s)", firstFail)
	}
	if firstFail == 0 || firstFail > 18*time.Second {
		t.Errorf("the used v6 address was still allowed %s after the answer (maximum 10 s, sweep 2.5 s, refresh 5 s)", lastOK)
	}
	fe.expect(t, "past the maximum", map[string]any{"reason": "expired", "dst": dst.Addr().String()})
}

// TestNetpolicyDualStackRefreshSweep: the sweep of the v6 live sets at the
// table's level, with the datapath's writes stood in for by elements added
// to attested6_live: an element an answer of this Firewall justifies stays
// (the control), one no answer attested goes; after a restart (a second
// Firewall on the same table) the first goes too until a new answer
// attests it again; removing the session deletes its live element.
func TestNetpolicyDualStackRefreshSweep(t *testing.T) {
	world.RequireTool(t, "nft")
	w := world.New(t)
	prefix := "t" + w.ID[:4]
	cfg := dualStackFirewallConfig(t, w, prefix)
	cfg.AttestMaxLifetime = time.Hour
	open := func() *nft.Firewall { return openEnsured(t, cfg, false) }
	fw := open()
	t.Cleanup(func() {
		if err := fw.DeleteTable(); err != nil {
			t.Errorf("delete table: %v", err)
		}
		fw.Close()
	})
	r := nft.SessionRules{Name: "sw6", HostIface: prefix + "0h", Guest: netip.MustParseAddr("10.20.0.2"), Egress: netpolicy.ModeAllowlist, OnDeny: netpolicy.DenyReject}
	if err := fw.AddSession(r); err != nil {
		t.Fatal(err)
	}
	g6 := netip.MustParseAddr("fd00:20::2")
	answered, unanswered := web6Echo.Addr(), lit6Echo.Addr()
	c, err := nftables.New(nftables.WithNetNSFd(int(w.Host)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	live, err := c.GetSetByName(&nftables.Table{Name: prefix, Family: nftables.TableFamilyINet}, "attested6_live")
	if err != nil {
		t.Fatalf("set attested6_live: %v", err)
	}
	// use stands in for the datapath: a new flow to dst refreshed it.
	use := func(dst netip.Addr) {
		t.Helper()
		if err := c.SetAddElements(live, []nftables.SetElement{{Key: pairKey(g6, dst), Timeout: time.Minute}}); err != nil {
			t.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			t.Fatalf("add to attested6_live: %v", err)
		}
	}
	held := func() map[netip.Addr]bool {
		t.Helper()
		elems, err := c.GetSetElements(live)
		if err != nil {
			t.Fatal(err)
		}
		out := map[netip.Addr]bool{}
		for _, e := range elems {
			if len(e.Key) == 32 && netip.AddrFrom16([16]byte(e.Key[:16])) == g6 {
				out[netip.AddrFrom16([16]byte(e.Key[16:]))] = true
			}
		}
		return out
	}
	sweep := func(fw *nft.Firewall, when string, want map[netip.Addr]bool) {
		t.Helper()
		if _, err := fw.SweepRefreshed(); err != nil {
			t.Fatalf("%s: sweep: %v", when, err)
		}
		got := held()
		for _, a := range []netip.Addr{answered, unanswered} {
			if got[a] != want[a] {
				t.Errorf("%s: attested6_live holds %s . %s: %v, want %v", when, g6, a, got[a], want[a])
			}
		}
	}

	if _, err := fw.Attest(r.Guest, []netip.Addr{answered}, 30*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	use(answered)
	use(unanswered)
	sweep(fw, "after an answer for one of two", map[netip.Addr]bool{answered: true})

	// A restart: the new Firewall attested nothing yet.
	fw2 := open()
	defer fw2.Close()
	use(answered)
	sweep(fw2, "after a restart", map[netip.Addr]bool{})
	if _, err := fw2.Attest(r.Guest, []netip.Addr{answered}, 30*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	use(answered)
	sweep(fw2, "after an answer since the restart", map[netip.Addr]bool{answered: true})

	if err := fw2.RemoveSession(r); err != nil {
		t.Fatal(err)
	}
	if got := held(); got[answered] {
		t.Errorf("attested6_live keeps the removed session's element %s . %s", g6, answered)
	}
}
