package integration

// A dual-stack session's IPv6 side follows every policy change, live and
// across restarts: `session update` rewrites its v6 sets in the same batch
// as the v4 ones, a revoke cuts its established v6 flows on both sides,
// and a restarted daemon (SIGKILL) keeps enforcing them.

import (
	"bytes"
	"errors"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// The v6 servers of the dual-stack world (newDualStackE2E): echo on :7.
var (
	web6Echo = netip.MustParseAddrPort("[2001:2:0:1::10]:7")
	lit6Echo = netip.MustParseAddrPort("[2001:2:0:1::11]:7")
)

// refusal6 is how a v6 dial was answered: "reach", "reject" (ICMPv6
// admin-prohibited: EACCES), "reset" (a TCP reset: ECONNREFUSED), "drop"
// (silence: a timeout) or the error itself.
func refusal6(ns string, dst netip.AddrPort) string {
	c, err := world.DialTCP(ns, dst, 1500*time.Millisecond)
	switch {
	case err == nil:
		c.Close()
		return "reach"
	case errors.Is(err, unix.EACCES):
		return "reject"
	case errors.Is(err, unix.ECONNREFUSED):
		return "reset"
	case errors.Is(err, os.ErrDeadlineExceeded) || strings.Contains(err.Error(), "timeout"):
		return "drop"
	}
	return err.Error()
}

// expect6 checks how each destination is answered from ns.
func expect6(t *testing.T, when, ns string, want map[netip.AddrPort]string) {
	t.Helper()
	for dst, w := range want {
		if got := refusal6(ns, dst); got != w {
			t.Errorf("%s: %s from the session: %s, want %s", when, dst, got, w)
		}
	}
}

// e2eNftGuest6Elements counts the elements of the dual-stack table keyed
// by guest6 (first in the key, or after the interface name in sessions6),
// in every set of the table.
func e2eNftGuest6Elements(t *testing.T, w *world.World, prefix string, guest6 netip.Addr) map[string]int {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(w.Host)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	sets, err := c.GetSets(&nftables.Table{Name: prefix, Family: nftables.TableFamilyINet})
	if err != nil {
		t.Fatalf("list the sets of table inet %s: %v", prefix, err)
	}
	g := guest6.AsSlice()
	out := map[string]int{}
	for _, s := range sets {
		elems, err := c.GetSetElements(s)
		if err != nil {
			t.Fatalf("set %s: %v", s.Name, err)
		}
		for _, el := range elems {
			if el.IntervalEnd {
				continue
			}
			if bytes.HasPrefix(el.Key, g) || len(el.Key) >= 32 && s.Name == "sessions6" && bytes.Equal(el.Key[16:32], g) {
				out[s.Name]++
			}
		}
	}
	return out
}

// TestE2EDualStackUpdateLiteral: `session update` adds a v6 literal (before:
// refused, after: reachable, next to an allowed v6 destination that is
// reachable throughout); a revoke with --keep-established leaves an open v6
// flow to it working (the control) while new ones are refused; a revoke
// without it cuts the open flow (conntrack entry and the guest's socket: a
// blocked read in the session's netns fails with ECONNABORTED within a
// second), and the kept destination's flow stays open. (Both sides of a
// sandbox's cut v6 flows: TestE2EDualStackRevokeResetsBothSides.)
func TestE2EDualStackUpdateLiteral(t *testing.T) {
	e, _ := newDualStackE2E(t)
	e.createNetOnly("l6", "--allow", "[2001:2:0:1::10]:7/tcp", "--name-check", "off")
	ns := e.nsPath("l6")
	expect6(t, "before the update", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reject"})

	e.update("l6", "--allow", "2001:2:0:1::11")
	expect6(t, "after adding 2001:2:0:1::11", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reach"})

	// The control: --keep-established.
	kept := e2eDial(t, ns, web6Echo.String())
	open := e2eDial(t, ns, lit6Echo.String())
	e2eEcho(t, "v6 flow before the revoke", open)
	e.update("l6", "--revoke", "2001:2:0:1::11", "--keep-established")
	expect6(t, "revoked with --keep-established", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reject"})
	e2eEcho(t, "--keep-established: the revoked destination's open v6 flow", open)

	// The revoke that cuts.
	e.update("l6", "--allow", "2001:2:0:1::11")
	open = e2eDial(t, ns, lit6Echo.String())
	e2eEcho(t, "v6 flow before the cutting revoke", open)
	readErr := make(chan error, 1)
	go func() {
		open.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := open.Read(make([]byte, 1))
		readErr <- err
	}()
	start := time.Now()
	e.update("l6", "--revoke", "2001:2:0:1::11")
	select {
	case err := <-readErr:
		if took := time.Since(start); !errors.Is(err, syscall.ECONNABORTED) || took > time.Second {
			t.Errorf("the guest's v6 reader: %v after %v, want ECONNABORTED within 1 s", err, took)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the guest's v6 reader still waits 2 s after the revoke")
	}
	e2eEcho(t, "after the revoke, the kept v6 destination", kept)
	expect6(t, "after the cutting revoke", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reject"})
	evs := e.eventLines("l6", "policy_updated")
	if len(evs) == 0 || strings.Contains(evs[len(evs)-1], `"flows_cut":0`) || strings.Contains(evs[len(evs)-1], `"sockets_aborted":0`) {
		t.Errorf("the cutting revoke's event: %v, want flows cut and sockets aborted", evs)
	}
}

// TestE2EDualStackUpdateModeAndOnDeny: an update's --egress and --on-deny
// reach the v6 side: allowlist -> public opens any public v6 address (the
// special-purpose ULA server stays refused), a v6 deny entry added live
// refuses its address (and its revoke reopens it), public -> allowlist
// closes it again; each --on-deny change is the v6 refusal's kind (reject:
// EACCES, reset: ECONNREFUSED, drop: a timeout), the allowed destination
// reachable throughout (the control).
func TestE2EDualStackUpdateModeAndOnDeny(t *testing.T) {
	e, ula := newDualStackE2E(t)
	e.createNetOnly("m6", "--allow", "[2001:2:0:1::10]:7/tcp", "--name-check", "off")
	ns := e.nsPath("m6")
	expect6(t, "allowlist", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reject"})

	e.update("m6", "--egress", "public")
	expect6(t, "public", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reach", ula: "reject"})
	e.update("m6", "--deny", "2001:2:0:1::11")
	expect6(t, "public, 2001:2:0:1::11 denied", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reject"})
	e.update("m6", "--revoke-deny", "2001:2:0:1::11")
	expect6(t, "public, the deny revoked", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reach"})
	e.update("m6", "--egress", "allowlist")
	expect6(t, "back to allowlist", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reject"})

	for _, mode := range []string{"reset", "drop", "reject"} {
		e.update("m6", "--on-deny", mode)
		expect6(t, "--on-deny "+mode, ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: mode})
	}
}

// TestE2EDualStackUpdateRevokeName: revoking an allowed name removes the
// v6 addresses its AAAA answer attested (attested6 of the guest6), so the
// name's v6 server is refused at once, while a v6 literal the update keeps
// stays reachable (the control); before the revoke the same server is
// reachable (attested).
func TestE2EDualStackUpdateRevokeName(t *testing.T) {
	e, _ := newDualStackE2E(t)
	info := e.createNetOnly("n6", "--allow", "web6.e2e.test", "--allow", "[2001:2:0:1::11]:7/tcp", "--name-check", "off")
	ns := e.nsPath("n6")
	g6 := netip.MustParseAddr(info.Guest6IP)
	m, err := world.Lookup(ns, netip.AddrPortFrom(netip.MustParseAddr(info.DNS6), 53), "web6.e2e.test", dns.TypeAAAA, false, 3*time.Second)
	if err != nil || !slices.Contains(world.Addrs6Of(m), web6Echo.Addr()) {
		t.Fatalf("AAAA web6.e2e.test: %v %v, want %s", m, err, web6Echo.Addr())
	}
	if got := e2eNftAttested6(t, e.w, e.d.Prefix, g6); !slices.Contains(got, web6Echo.Addr()) {
		t.Fatalf("attested6 of %s: %v, want %s", g6, got, web6Echo.Addr())
	}
	expect6(t, "the name allowed", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reach"})

	e.update("n6", "--revoke", "web6.e2e.test")
	if got := e2eNftAttested6(t, e.w, e.d.Prefix, g6); slices.Contains(got, web6Echo.Addr()) {
		t.Errorf("attested6 of %s after the revoke: %v, still holds %s", g6, got, web6Echo.Addr())
	}
	expect6(t, "the name revoked", ns, map[netip.AddrPort]string{web6Echo: "reject", lit6Echo: "reach"})
}

// TestE2EDualStackRestartKill9 and TestE2EDualStackRestartSIGTERM: a
// dual-stack session's v6 enforcement survives enforcerd's SIGKILL (or
// SIGTERM) and restart: its v6 elements are the same
// after the restart, the allowed v6 destinations are reachable and the
// unlisted one refused, the DNS proxy answers AAAA over v6 again (and the
// name's v6 server is reachable), and an update after the restart still
// reaches the v6 side. A session whose record is removed while the daemon
// is down (gone, as far as the restarted daemon knows) leaves no element
// keyed by its v6 address.
func TestE2EDualStackRestartKill9(t *testing.T) { e2eDualStackRestart(t, syscall.SIGKILL) }

func TestE2EDualStackRestartSIGTERM(t *testing.T) { e2eDualStackRestart(t, syscall.SIGTERM) }

func e2eDualStackRestart(t *testing.T, sig syscall.Signal) {
	e, _ := newDualStackE2E(t)
	info := e.createNetOnly("k6", "--allow", "web6.e2e.test", "--allow", "[2001:2:0:1::10]:7/tcp", "--name-check", "off")
	gone := e.createNetOnly("g6", "--allow", "[2001:2:0:1::11]:7/tcp", "--egress", "public", "--on-deny", "reset")
	ns := e.nsPath("k6")
	g6, gone6 := netip.MustParseAddr(info.Guest6IP), netip.MustParseAddr(gone.Guest6IP)
	dns6 := netip.AddrPortFrom(netip.MustParseAddr(info.DNS6), 53)
	before := e2eNftGuest6Elements(t, e.w, e.d.Prefix, g6)
	if before["sessions6"] != 1 || before["static6_ports"] != 1 || before["reject6"] != 1 {
		t.Fatalf("k6's v6 elements before the restart: %v, want sessions6, static6_ports and reject6", before)
	}
	if n := e2eNftGuest6Elements(t, e.w, e.d.Prefix, gone6); n["public6"] != 1 || n["reset6"] != 1 {
		t.Fatalf("g6's v6 elements before the restart: %v, want public6 and reset6", n)
	}
	expect6(t, "before the restart", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reject"})

	if err := e.d.Signal(sig); err != nil {
		t.Fatal(err)
	}
	if done, _ := e.d.Exited(); !done {
		t.Fatalf("enforcerd still runs after %s", sig)
	}
	expect6(t, "while the daemon is down", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reject"})
	if err := os.Remove(filepath.Join(e.d.StateDir, "sessions", "g6.json")); err != nil {
		t.Fatal(err)
	}
	e.start()

	after := e2eNftGuest6Elements(t, e.w, e.d.Prefix, g6)
	for set, n := range before {
		if set != "flows6" && set != "flowrate6" && after[set] != n {
			t.Errorf("k6's v6 elements after the restart: %v, want %v", after, before)
			break
		}
	}
	if n := e2eNftGuest6Elements(t, e.w, e.d.Prefix, gone6); len(n) != 0 {
		t.Errorf("elements keyed by %s (g6, removed while the daemon was down) after the restart: %v, want none", gone6, n)
	}
	expect6(t, "after the restart", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reject"})
	m, err := world.Lookup(ns, dns6, "web6.e2e.test", dns.TypeAAAA, false, 3*time.Second)
	if err != nil || !slices.Equal(world.Addrs6Of(m), []netip.Addr{web6Echo.Addr()}) {
		t.Errorf("AAAA web6.e2e.test over the v6 proxy after the restart: %v %v, want %s", m, err, web6Echo.Addr())
	}
	if got := e2eNftAttested6(t, e.w, e.d.Prefix, g6); !slices.Contains(got, web6Echo.Addr()) {
		t.Errorf("attested6 of %s after the restart's answer: %v, want %s", g6, got, web6Echo.Addr())
	}
	// Still enforced after the restart: an update reaches the v6 side.
	e.update("k6", "--allow", "[2001:2:0:1::11]:7/tcp")
	expect6(t, "updated after the restart", ns, map[netip.AddrPort]string{web6Echo: "reach", lit6Echo: "reach"})
}

// TestE2EDualStackRevokeResetsBothSides is TestE2ERevokeResetsBothSides
// over IPv6: a dual-stack sandbox holds an idle connection (nc) and a
// running download (wget) to v6 servers of the simulated internet; with
// --keep-established a revoke of both leaves both working (the control),
// without it each client ends within a second and each server's side
// fails too.
func TestE2EDualStackRevokeResetsBothSides(t *testing.T) {
	e, _ := newDualStackE2E(t)
	e.create("rv6", "--allow", "2001:2:0:1::10", "--allow", "2001:2:0:1::11", "--name-check", "off")
	rs := startRevokeServersAt(t, e, netip.MustParseAddrPort("[2001:2:0:1::11]:8083"), netip.MustParseAddrPort("[2001:2:0:1::10]:8082"))

	revokeCutsBothSides(t, e, "rv6", rs, "2001:2:0:1::10", "2001:2:0:1::11")
}

// TestNetpolicyDualStackUpdateConverges: UpdateSession on a dual-stack
// table, at the table's level: the update's batch rewrites the session's
// v6 elements (a v6 literal, public mode, --on-deny reset, a v6 deny
// entry) and removes a stale attestation's attested6 element while a kept
// one's stays; the same update applied again (the kernel already holds the
// new rules, as after a crash between the batch and the record: the
// by-key batch meets missing elements and the dump path converges)
// succeeds and leaves the same elements; the way back deletes every v6
// element the first update added and no other (sessions6 stays).
func TestNetpolicyDualStackUpdateConverges(t *testing.T) {
	w := world.New(t)
	prefix := "t" + w.ID[:4]
	cfg := dualStackFirewallConfig(t, w, prefix)
	fw := openEnsured(t, cfg, true)
	guest, g6 := netip.MustParseAddr("10.20.0.2"), netip.MustParseAddr("fd00:20::2")
	old := nft.SessionRules{Name: "c6", HostIface: prefix + "0h", Guest: guest, Egress: netpolicy.ModeAllowlist, OnDeny: netpolicy.DenyReject,
		Static: []netpolicy.Target{{Prefix: netip.MustParsePrefix("2001:2:0:1::10/128")}}}
	next := old
	next.Egress, next.OnDeny = netpolicy.ModePublic, netpolicy.DenyReset
	next.Static = []netpolicy.Target{{Prefix: netip.MustParsePrefix("2001:2:0:1::11/128"), Port: 7, Proto: netpolicy.ProtoTCP}}
	next.Deny = []netpolicy.Target{{Prefix: netip.MustParsePrefix("2001:2:0:2::/64")}}
	if err := fw.AddSession(old); err != nil {
		t.Fatal(err)
	}
	stale, kept := netip.MustParseAddr("2001:2:0:1::20"), netip.MustParseAddr("2001:2:0:1::21")
	if _, err := fw.Attest(guest, []netip.Addr{stale, kept}, time.Minute, nil); err != nil {
		t.Fatal(err)
	}
	before := e2eNftGuest6Elements(t, w, prefix, g6)
	if before["static6"] != 1 || before["reject6"] != 1 || before["attested6"] != 2 || before["public6"] != 0 {
		t.Fatalf("v6 elements before the update: %v, want static6, reject6 and two attested6", before)
	}
	u := nft.SessionUpdate{Old: old, New: next,
		Stale: []netpolicy.Attestation{{Addrs: []netip.Addr{guest.Next(), stale, kept}}},
		Keep:  []netpolicy.Attestation{{Addrs: []netip.Addr{kept}}}}
	want := map[string]int{"sessions6": 1, "static6_ports": 1, "public6": 1, "reject6": 1, "reset6": 1, "denied6": 1, "attested6": 1}
	check := func(when string) {
		t.Helper()
		got := e2eNftGuest6Elements(t, w, prefix, g6)
		delete(got, "flows6")
		delete(got, "flowrate6")
		if !maps.Equal(got, want) {
			t.Errorf("%s: v6 elements %v, want %v", when, got, want)
		}
		if a := e2eNftAttested6(t, w, prefix, g6); !slices.Equal(a, []netip.Addr{kept}) {
			t.Errorf("%s: attested6 %v, want only the kept %s", when, a, kept)
		}
	}
	if err := fw.UpdateSession(u); err != nil {
		t.Fatal(err)
	}
	check("after the update")
	if err := fw.UpdateSession(u); err != nil {
		t.Fatalf("the same update again (the kernel holds the new rules): %v", err)
	}
	check("after the same update again")
	if err := fw.UpdateSession(nft.SessionUpdate{Old: next, New: old}); err != nil {
		t.Fatal(err)
	}
	want = map[string]int{"sessions6": 1, "static6": 1, "reject6": 1, "attested6": 1}
	check("after the way back")
	// An in-between state neither side names (a v6 literal and public
	// mode of a third policy added on top): an update whose old rules the
	// kernel lacks goes the dump way, which deletes every v6 element of the
	// guest its new rules lack.
	third := old
	third.Egress = netpolicy.ModePublic
	third.Static = []netpolicy.Target{{Prefix: netip.MustParsePrefix("2001:2:0:1::12/128")}}
	if err := fw.AddSession(third); err != nil {
		t.Fatal(err)
	}
	if got := e2eNftGuest6Elements(t, w, prefix, g6); got["static6"] != 2 || got["public6"] != 1 {
		t.Fatalf("the in-between state: %v, want two static6 and public6", got)
	}
	if err := fw.UpdateSession(nft.SessionUpdate{Old: next, New: old}); err != nil {
		t.Fatal(err)
	}
	check("after an update from an in-between state")
}
