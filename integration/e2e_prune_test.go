package integration

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// TestE2ERestartPrunesOrphanedGuestState: state
// keyed by a pool address whose session is gone (an answer attested after
// its session was removed, a conntrack entry a crash left behind) is
// deleted when the daemon starts, so the next session on that address
// inherits nothing; a live session's state is kept (control).
func TestE2ERestartPrunesOrphanedGuestState(t *testing.T) {
	e := newE2E(t)
	agent := e.createNetOnly("agent", "--allow", "api.e2e.test")
	live := netip.MustParseAddr(agent.GuestIP)
	// Slot 100's guest: no session has it.
	orphan := netip.MustParseAddr("10.20.1.146")
	web := e.w.Web[0]

	// The leftovers, planted the way the kernel would hold them.
	fw, err := nft.OpenFirewall(nft.FirewallConfig{NetNS: e.w.Host, Prefix: e.d.Prefix,
		Pool: nsmgr.DefaultPool, DNSAddr: netip.MustParseAddr("10.20.255.254")})
	if err != nil {
		t.Fatalf("open the daemon's table: %v", err)
	}
	defer fw.Close()
	for _, g := range []netip.Addr{orphan, live} {
		if _, err := fw.Attest(g, []netip.Addr{web}, time.Hour, nil); err != nil {
			t.Fatalf("plant attested %s for %s: %v", web, g, err)
		}
	}
	h, err := netlink.NewHandleAt(e.w.Host)
	if err != nil {
		t.Fatalf("netlink handle in the simulated host: %v", err)
	}
	defer h.Close()
	for i, g := range []netip.Addr{orphan, live} {
		flow := &netlink.ConntrackFlow{
			FamilyType: netlink.FAMILY_V4, TimeOut: 600,
			Forward: netlink.IPTuple{Protocol: syscall.IPPROTO_UDP, SrcIP: g.AsSlice(), DstIP: web.AsSlice(), SrcPort: uint16(40000 + i), DstPort: 7},
			Reverse: netlink.IPTuple{Protocol: syscall.IPPROTO_UDP, SrcIP: web.AsSlice(), DstIP: e.w.Uplink.AsSlice(), SrcPort: 7, DstPort: uint16(40000 + i)},
		}
		if err := h.ConntrackCreate(netlink.ConntrackTable, netlink.FAMILY_V4, flow); err != nil {
			t.Fatalf("plant a conntrack entry for %s: %v", g, err)
		}
	}
	state := func() (attested map[netip.Addr]bool, flows map[netip.Addr]bool) {
		t.Helper()
		all, err := fw.AllAttested()
		if err != nil {
			t.Fatalf("list attested: %v", err)
		}
		attested = map[netip.Addr]bool{}
		for g, as := range all {
			attested[g] = slices.ContainsFunc(as, func(a nft.AttestedAddr) bool { return a.IP == web })
		}
		list, err := h.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
		if err != nil {
			t.Fatalf("list conntrack: %v", err)
		}
		flows = map[netip.Addr]bool{}
		for _, f := range list {
			if ip, ok := netip.AddrFromSlice(f.Forward.SrcIP.To4()); ok && f.Forward.DstIP.Equal(net.IP(web.AsSlice())) {
				flows[ip] = true
			}
		}
		return attested, flows
	}
	attested, flows := state()
	if !attested[orphan] || !attested[live] || !flows[orphan] || !flows[live] {
		t.Fatalf("control: planted state missing before the restart: attested %v, flows %v", attested, flows)
	}

	if err := e.d.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	e.start()
	e.expectConsistent("after the restart")
	attested, flows = state()
	if attested[orphan] {
		t.Errorf("the orphan guest %s still has %s attested after the restart", orphan, web)
	}
	if flows[orphan] {
		t.Errorf("the orphan guest %s still has a conntrack entry after the restart", orphan)
	}
	if !attested[live] || !flows[live] {
		t.Errorf("the live session lost its state: attested %t, flow %t", attested[live], flows[live])
	}
	if !strings.Contains(e.d.Log(), "reaped orphaned flows") {
		t.Errorf("the restart did not log the reaped flows")
	}
}
