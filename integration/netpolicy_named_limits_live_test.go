package integration

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// TestNetpolicyNamedLimitAttest: a name entry's count, through the
// Firewall. AttestName of an answer for the name returns only once the
// answered address is in the entry's address set (read back from the
// kernel at once); an answer for another name, and another session's
// answer for the same name, leave the set alone. The grant lets two new
// flows to the name's address through and refuses the third, while the
// session's other name and the other session's flows to its own answer
// pass (the controls). An update that limits a name the session resolved
// before fills the new set from what is attested. A restarted Firewall
// (AddSession again) keeps the count and fills the set from new answers.
func TestNetpolicyNamedLimitAttest(t *testing.T) {
	e := newNPEnv(t, time.Second)
	web0, web1, web2 := e.w.Web[0], e.w.Web[1], e.w.Web[2]
	api, err := netpolicy.ParseEntry("api.example.com:7/tcp", e.guard)
	if err != nil {
		t.Fatal(err)
	}
	other, err := netpolicy.ParseEntry("other.example.com", e.guard)
	if err != nil {
		t.Fatal(err)
	}
	s, r := e.session(t, "nl", netpolicy.ModeAllowlist, nil)
	c, _ := e.session(t, "nlc", netpolicy.ModeAllowlist, nil)
	limited := r
	limited.Limits = nft.SessionLimits{Entries: []nft.EntryLimit{{ID: "aa", Name: &api, Connections: 2, Grant: "0"}}}
	if err := e.fw.UpdateSession(nft.SessionUpdate{Old: r, New: limited}); err != nil {
		t.Fatalf("limit the name: %v", err)
	}
	t.Cleanup(func() {
		if err := e.fw.RemoveSession(limited); err != nil {
			t.Errorf("remove the limited session: %v", err)
		}
	})
	addrs := func(l nft.SessionLimits, id string) []netip.Addr {
		t.Helper()
		u, err := e.fw.LimitUsage(s.Guest, l)
		if err != nil {
			t.Fatalf("limit usage: %v", err)
		}
		return u.Entries[id].Addrs
	}
	used := func() uint32 {
		t.Helper()
		u, err := e.fw.LimitUsage(s.Guest, limited.Limits)
		if err != nil {
			t.Fatalf("limit usage: %v", err)
		}
		return u.Entries["aa"].Used
	}
	port7 := []netpolicy.PortSpec{{Port: 7, Proto: netpolicy.ProtoTCP}}
	if _, err := e.fw.AttestName(s.Guest, "other.example.com", []netip.Addr{web1}, 30*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fw.AttestName(c.Guest, "api.example.com", []netip.Addr{web2}, 30*time.Second, port7); err != nil {
		t.Fatal(err)
	}
	if got := addrs(limited.Limits, "aa"); len(got) != 0 {
		t.Fatalf("address set after another name's answer and another session's: %v, want empty", got)
	}
	if _, err := e.fw.AttestName(s.Guest, "API.example.com", []netip.Addr{web0}, 30*time.Second, port7); err != nil {
		t.Fatal(err)
	}
	if got := addrs(limited.Limits, "aa"); !slices.Equal(got, []netip.Addr{web0}) {
		t.Fatalf("address set right after the name's answer: %v, want [%s]", got, web0)
	}
	// A known element still waits for a batch when it fills a set.
	before := e.fw.AttestRoundTrips()
	if _, err := e.fw.AttestName(s.Guest, "api.example.com", []netip.Addr{web0}, 30*time.Second, port7); err != nil {
		t.Fatal(err)
	}
	if e.fw.AttestRoundTrips() == before {
		t.Errorf("an answer for a limited name was released without a batch")
	}

	ns := s.NetnsPath
	for i := range 2 {
		conn, err := world.DialTCP(ns, netip.AddrPortFrom(web0, 7), world.ReachTimeout)
		if err != nil {
			t.Fatalf("granted connection %d: %v", i+1, err)
		}
		conn.Close()
	}
	expectBlocked(t, "the third connection to the name", tcpProbe(ns, netip.AddrPortFrom(web0, 7)))
	expectReach(t, "the controls", tcpProbe(ns, netip.AddrPortFrom(web1, 7)),
		tcpProbe(c.NetnsPath, netip.AddrPortFrom(web2, 7)), tcpProbe(c.NetnsPath, netip.AddrPortFrom(web2, 7)), tcpProbe(c.NetnsPath, netip.AddrPortFrom(web2, 7)))
	if n := used(); n != 2 {
		t.Errorf("used: %d, want 2", n)
	}

	// A name resolved before its limit: the update fills its set from the
	// attested addresses.
	both := limited
	both.Limits = nft.SessionLimits{Entries: append(slices.Clone(limited.Limits.Entries), nft.EntryLimit{ID: "bb", Name: &other, Budget: 1 << 20})}
	if err := e.fw.UpdateSession(nft.SessionUpdate{Old: limited, New: both}); err != nil {
		t.Fatalf("limit the second name: %v", err)
	}
	if got := addrs(both.Limits, "bb"); !slices.Contains(got, web1) {
		t.Errorf("the new limit's address set: %v, want %s (attested before the update)", got, web1)
	}
	if err := e.fw.UpdateSession(nft.SessionUpdate{Old: both, New: limited}); err != nil {
		t.Fatalf("drop the second limit: %v", err)
	}

	// A restarted Firewall: the count stays, new answers fill the set.
	e.reopenFirewall(t)
	if err := e.fw.AddSession(limited); err != nil {
		t.Fatalf("add the session again: %v", err)
	}
	if n := used(); n != 2 {
		t.Errorf("used after a restart: %d, want 2", n)
	}
	if _, err := e.fw.AttestName(s.Guest, "api.example.com", []netip.Addr{web1}, 30*time.Second, port7); err != nil {
		t.Fatal(err)
	}
	if got := addrs(limited.Limits, "aa"); !slices.Contains(got, web1) {
		t.Errorf("address set after the restart's answer: %v, want %s in it", got, web1)
	}
	expectBlocked(t, "the name's new address, the grant used up", tcpProbe(ns, netip.AddrPortFrom(web1, 7)))
}
