package daemon

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/internal/nfnetlink"
	"github.com/enforcerd/enforcerd/namecheck"
	"github.com/enforcerd/enforcerd/netpolicy"
)

// The name check's test is the DNS proxy's: an allow entry matching the
// name with no port or this one, deny entries winning, any name in public
// mode but the denied ones; a name that does not normalise is refused.
func TestNameAllowed(t *testing.T) {
	allow := netpolicy.Policy{Egress: netpolicy.ModeAllowlist, Allow: []netpolicy.Entry{
		netpolicy.MustParseEntry("pkgs.example.org"),
		netpolicy.MustParseEntry("*.cdn.example.com"),
		netpolicy.MustParseEntry("api.example.com:8443"),
		netpolicy.MustParseEntry("dns.example.net:853"),
	}, Deny: []netpolicy.Entry{netpolicy.MustParseEntry("bad.cdn.example.com")}}
	public := netpolicy.Policy{Egress: netpolicy.ModePublic, Deny: allow.Deny}
	for _, c := range []struct {
		p      netpolicy.Policy
		name   string
		port   uint16
		lacked string
	}{
		{allow, "pkgs.example.org", 443, ""},
		{allow, "PKGS.example.org", 443, ""},
		{allow, "evil.example", 443, "evil.example:443"},
		{allow, "x.cdn.example.com", 443, ""},
		{allow, "bad.cdn.example.com", 443, "bad.cdn.example.com:443"},
		{allow, "api.example.com", 8443, ""},
		{allow, "api.example.com", 443, "api.example.com:443"},
		{allow, "pkgs.example.org", 853, "pkgs.example.org:853"}, // a port-less entry never opens 53 or 853
		{allow, "dns.example.net", 853, ""},
		{allow, "pkgs.example.org\x00", 443, "pkgs.example.org\x00:443"},
		{public, "evil.example", 443, ""},
		{public, "bad.cdn.example.com", 443, "bad.cdn.example.com:443"},
	} {
		lacked, ok := nameAllowed(c.p, c.name, c.port, false)
		if ok != (c.lacked == "") || lacked != c.lacked && !ok {
			t.Errorf("%s nameAllowed(%q, %d) = %q %v, want lacked %q", c.p.Egress, c.name, c.port, lacked, ok, c.lacked)
		}
	}
}

// why --sni: refused names answer name-mismatch with the entry lacked;
// the check off, a destination not admitted by a name, an allowed name
// and an address keep the destination's answer.
func TestWhyNameCheck(t *testing.T) {
	p := netpolicy.Policy{Egress: netpolicy.ModeAllowlist, OnDeny: netpolicy.DenyReject,
		Allow: []netpolicy.Entry{netpolicy.MustParseEntry("pkgs.example.org")}}
	d := whyDest{addr: netip.MustParseAddr("198.18.1.10"), port: 443, proto: netpolicy.ProtoTCP}
	attested := api.WhyAnswer{Dest: "198.18.1.10:443", Verdict: api.WhyAllowed, Reason: "attested"}
	if a := whyNameCheck(p, d, attested, "evil.example"); a.Verdict != api.WhyRejected || a.Reason != netpolicy.ReasonNameMismatch || a.Entry != "evil.example:443" {
		t.Errorf("evil.example: %+v", a)
	}
	for _, c := range []struct {
		p    netpolicy.Policy
		ans  api.WhyAnswer
		sni  string
		what string
	}{
		{p, attested, "pkgs.example.org", "allowed name"},
		{p, attested, "198.18.1.10", "address"},
		{netpolicy.Policy{Egress: netpolicy.ModeAllowlist, NameCheck: netpolicy.NameCheckOff}, attested, "evil.example", "check off"},
		{p, api.WhyAnswer{Verdict: api.WhyAllowed, Reason: "static"}, "evil.example", "static"},
		{netpolicy.Policy{Egress: netpolicy.ModePublic}, api.WhyAnswer{Verdict: api.WhyAllowed, Reason: "public"}, "evil.example", "public without deny names"},
	} {
		if a := whyNameCheck(c.p, d, c.ans, c.sni); a.Verdict != api.WhyAllowed || a.Reason != c.ans.Reason {
			t.Errorf("%s: %+v, want the destination's answer", c.what, a)
		}
	}
}

// The server's reset is a valid TCP segment: its checksum over the
// pseudo header sums to zero.
func TestTCPResetChecksum(t *testing.T) {
	g, s := netip.MustParseAddr("10.20.0.2"), netip.MustParseAddr("198.18.1.10")
	p := tcpReset(g, 40000, s, 443, 0xfffffff1)
	ga, sa := g.As4(), s.As4()
	pseudo := append(append(append([]byte{}, ga[:]...), sa[:]...), 0, 6, 0, 20)
	var sum uint32
	for _, b := range [][]byte{pseudo, p[20:]} {
		for i := 0; i < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	if sum != 0xffff || p[33] != 0x04 || !bytes.Equal(p[24:28], []byte{0xff, 0xff, 0xff, 0xf1}) {
		t.Errorf("reset % x: checksum sum %#x (want 0xffff), flags %#x, seq % x", p, sum, p[33], p[24:28])
	}
}

// The v6 server's reset is a valid TCP segment too: its checksum over the
// IPv6 pseudo header sums to zero, and its IPv6 header carries TCP with
// the addresses given.
func TestTCPReset6Checksum(t *testing.T) {
	g, s := netip.MustParseAddr("fd00:20::2"), netip.MustParseAddr("2001:2:0:3::10")
	p := tcpReset6(g, 40000, s, 443, 0xfffffff1)
	ga, sa := g.As16(), s.As16()
	pseudo := append(append(append([]byte{}, ga[:]...), sa[:]...), 0, 0, 0, 20, 0, 0, 0, 6)
	var sum uint32
	for _, b := range [][]byte{pseudo, p[40:]} {
		for i := 0; i < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	if sum != 0xffff || p[0]>>4 != 6 || p[6] != 6 || !bytes.Equal(p[8:24], ga[:]) || !bytes.Equal(p[24:40], sa[:]) || p[53] != 0x04 {
		t.Errorf("v6 reset % x: checksum sum %#x (want 0xffff)", p, sum)
	}
}

// The reader's backlogs: a flooding guest's packets beyond the bound are
// refused (the reader drops them), a round takes at most a turn of each
// guest in turn, so the quiet guest's packet comes within the first
// round however long the flood's backlog is, and each guest's packets
// keep their order (a flow's, which the checker needs) across rounds.
func TestBacklogsRoundRobin(t *testing.T) {
	flood, quiet := netip.MustParseAddr("10.99.0.2"), netip.MustParseAddr("10.99.0.3")
	b := newBacklogs(10)
	pkt := func(id uint32) queued { return queued{Queued: nfnetlink.Queued{ID: id}} }
	// What the reader reads: IPv4 packets from the flooding guest.
	ip := func(id uint32, src netip.Addr) nfnetlink.Queued {
		p := make([]byte, 20)
		p[0] = 0x45
		copy(p[12:], src.AsSlice())
		copy(p[16:], []byte{198, 18, 3, 10})
		return nfnetlink.Queued{ID: id, Payload: p}
	}
	var read []nfnetlink.Queued
	for id := uint32(1); id <= 14; id++ {
		read = append(read, ip(id, flood))
	}
	fromGuest := func(p []byte) bool { return p[12] == 10 }
	drops := b.take(read, fromGuest, nil, nil)
	if fmt.Sprint(drops) != fmt.Sprint([]namecheck.Verdict{{ID: 11, Action: namecheck.Drop}, {ID: 12, Action: namecheck.Drop},
		{ID: 13, Action: namecheck.Drop}, {ID: 14, Action: namecheck.Drop}}) {
		t.Fatalf("a guest's backlog of 10 gave %v for 14 packets, want Drop for 11-14 (never Accept)", drops)
	}
	if drops := b.take([]nfnetlink.Queued{ip(100, quiet)}, fromGuest, nil, nil); len(drops) != 0 {
		t.Fatalf("the quiet guest's packet got %v beside a full backlog of another, want none", drops)
	}
	var rounds [][]uint32
	for !b.empty() {
		var got []uint32
		b.round(4, func(p queued) { got = append(got, p.ID) })
		rounds = append(rounds, got)
	}
	want := [][]uint32{{1, 2, 3, 4, 100}, {5, 6, 7, 8}, {9, 10}}
	if fmt.Sprint(rounds) != fmt.Sprint(want) {
		t.Fatalf("rounds %v, want %v", rounds, want)
	}
	// Emptied, a guest starts a new backlog (and its turn) on its next packet.
	if !b.add(flood, pkt(20)) || b.empty() {
		t.Fatal("an emptied guest's next packet was not taken")
	}
}

// guestOf keys a packet by its guest: the source of a guest's packet,
// the destination of its server's, over both families.
func TestGuestOf(t *testing.T) {
	v4 := make([]byte, 20)
	v4[0] = 0x45
	copy(v4[12:], []byte{10, 99, 0, 2})
	copy(v4[16:], []byte{198, 18, 0, 1})
	v6 := make([]byte, 40)
	v6[0] = 0x60
	copy(v6[8:], netip.MustParseAddr("fd00::2").AsSlice())
	copy(v6[24:], netip.MustParseAddr("2001:db8::1").AsSlice())
	for _, c := range []struct {
		pkt  []byte
		from bool
		want string
	}{
		{v4, true, "10.99.0.2"}, {v4, false, "198.18.0.1"},
		{v6, true, "fd00::2"}, {v6, false, "2001:db8::1"},
		{[]byte{0x45}, true, "invalid IP"},
	} {
		if got := guestOf(c.pkt, c.from); got.String() != c.want {
			t.Errorf("guestOf(%x…, fromGuest %v) = %v, want %s", c.pkt[0], c.from, got, c.want)
		}
	}
}

// TestSessionOfGuestIndex: the name check's lookup finds each live
// session by its guest address, after an update replaced it too, and
// none once it is deleted; a session without a network is never found.
func TestSessionOfGuestIndex(t *testing.T) {
	w := newWorld(t)
	a := w.create(api.CreateRequest{Name: "g1", NetworkOnly: true, Allow: []string{"93.184.216.7"}})
	b := w.create(api.CreateRequest{Name: "g2", NetworkOnly: true, Allow: []string{"93.184.216.7"}})
	w.create(api.CreateRequest{Name: "g3", NetworkOnly: true}) // egress none: no network
	for _, c := range []api.SessionInfo{a, b} {
		s, ok := w.d.sessionOfGuest(netip.MustParseAddr(c.GuestIP))
		if !ok || s.rec.Name != c.Name {
			t.Fatalf("guest %s: session %v (found %v), want %s", c.GuestIP, s, ok, c.Name)
		}
	}
	if _, err := w.d.UpdatePolicy(context.Background(), "g1", api.PolicyUpdate{Allow: []string{"93.184.216.8"}}, false); err != nil {
		t.Fatal(err)
	}
	if s, ok := w.d.sessionOfGuest(netip.MustParseAddr(a.GuestIP)); !ok || !slices.ContainsFunc(s.policy.Allow, func(e netpolicy.Entry) bool { return e.String() == "93.184.216.8" }) {
		t.Errorf("after an update the lookup of %s found %v (%v), want the updated session", a.GuestIP, s, ok)
	}
	if err := w.d.Delete(context.Background(), "g1"); err != nil {
		t.Fatal(err)
	}
	if s, ok := w.d.sessionOfGuest(netip.MustParseAddr(a.GuestIP)); ok {
		t.Errorf("deleted session's guest %s still finds %s", a.GuestIP, s.rec.Name)
	}
	if s, ok := w.d.sessionOfGuest(netip.MustParseAddr(b.GuestIP)); !ok || s.rec.Name != "g2" {
		t.Errorf("the other session's guest %s after the delete: %v (%v)", b.GuestIP, s, ok)
	}
	if s, ok := w.d.sessionOfGuest(netip.Addr{}); ok {
		t.Errorf("the zero address finds session %s", s.rec.Name)
	}
}

// overrunsQueue is a NameQueue that only counts overruns (the reader is
// not run).
type overrunsQueue struct{ NameQueue }

func (overrunsQueue) Overruns() uint64 { return 0 }

// TestNameCheckOverflowCounted: packets dropped at a flooding session's
// full backlog are counted in that session's inspect and in the total,
// not in another session's; a later session on the same name starts at
// zero, while the total keeps them.
func TestNameCheckOverflowCounted(t *testing.T) {
	w := newWorld(t)
	nc := &nameCheck{e: w.d, q: overrunsQueue{}, counts: map[string]*nameCounts{}, totals: map[string]uint64{},
		c: namecheck.NewChecker(namecheck.Config{Judge: w.d.judgeName})}
	w.d.namecheck = nc
	flood := w.create(api.CreateRequest{Name: "fl", NetworkOnly: true, Allow: []string{"93.184.216.7"}})
	quiet := w.create(api.CreateRequest{Name: "qu", NetworkOnly: true, Allow: []string{"93.184.216.7"}})
	ip := func(id uint32, src string) nfnetlink.Queued {
		p := make([]byte, 20)
		p[0] = 0x45
		copy(p[12:], netip.MustParseAddr(src).AsSlice())
		copy(p[16:], []byte{93, 184, 216, 7})
		return nfnetlink.Queued{ID: id, Payload: p}
	}
	var read []nfnetlink.Queued
	for id := range uint32(backlogPackets + 3) {
		read = append(read, ip(id, flood.GuestIP))
	}
	read = append(read, ip(1000, quiet.GuestIP))
	b := newBacklogs(backlogPackets)
	if drops := b.take(read, nc.fromGuest, nil, nc.countOverflow); len(drops) != 3 {
		t.Fatalf("%d drops for %d packets into a backlog of %d, want 3", len(drops), backlogPackets+3, backlogPackets)
	}
	view := func(name string) api.NameCheckView {
		t.Helper()
		w.d.mu.Lock()
		s := w.d.sessions[name]
		w.d.mu.Unlock()
		return *w.d.nameCheckView(s)
	}
	if got := view("fl").Overflowed; got != 3 {
		t.Errorf("the flooding session's overflowed %d, want 3", got)
	}
	if got := view("qu").Overflowed; got != 0 {
		t.Errorf("the quiet session's overflowed %d, want 0", got)
	}
	if _, _, total := w.d.NameCheckTotals(); total != 3 {
		t.Errorf("total overflows %d, want 3", total)
	}
	if err := w.d.Delete(context.Background(), "fl"); err != nil {
		t.Fatal(err)
	}
	w.create(api.CreateRequest{Name: "fl", NetworkOnly: true, Allow: []string{"93.184.216.7"}})
	if got := view("fl").Overflowed; got != 0 {
		t.Errorf("a new session on the name starts with overflowed %d, want 0", got)
	}
	if _, _, total := w.d.NameCheckTotals(); total != 3 {
		t.Errorf("total overflows after the delete %d, want 3 (a counter)", total)
	}
}
