package integration

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/world"
)

// e2eZone6 is the IPv6 part of a dual-stack world's zone.
var e2eZone6 = []string{
	"web6.e2e.test. 300 IN AAAA 2001:2:0:1::10",
	"doc6.e2e.test. 300 IN AAAA 2001:db8::10",
}

// e2ePool6 is the dual-stack daemons' --pool6 (a /112 for the default /16
// pool): ULA, masqueraded to the world's uplink.
const e2ePool6 = "fd00:20::/112"

// newDualStackE2E starts a daemon with --pool6 in a world with IPv6
// (2001:2::/48 public for it, as 198.18.0.0/15 is) and a ULA server
// fd99::10 (TCP echo :7) on the simulated internet: a special-purpose
// destination that is reachable, so its refusal is the table's.
func newDualStackE2E(t *testing.T, extra ...string) (*e2eEnv, netip.AddrPort) {
	t.Helper()
	e := prepareE2E(t, "", append([]string{"--pool6", e2ePool6, "--public-override", world.World6Prefix.String()}, extra...)...)
	if err := e.w.EnableIPv6(); err != nil {
		t.Fatal(err)
	}
	for _, rr := range e2eZone6 {
		e.w.DNS.AddRR(rr)
	}
	ula := netip.MustParseAddrPort("[fd99::10]:7")
	ih, err := netlink.NewHandleAt(e.w.Net)
	if err != nil {
		t.Fatal(err)
	}
	defer ih.Close()
	lo, err := ih.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	ipnet := &net.IPNet{IP: ula.Addr().AsSlice(), Mask: net.CIDRMask(128, 128)}
	if err := ih.AddrAdd(lo, &netlink.Addr{IPNet: ipnet, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	l, err := world.ListenTCP(e.w.NetPath, ula)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go world.ServeTCPEcho(l)
	// The control of every refusal below: without enforcerd in the way,
	// the simulated host reaches each v6 server.
	for _, dst := range []netip.AddrPort{ula, netip.MustParseAddrPort("[2001:2:0:1::10]:7"), netip.MustParseAddrPort("[2001:2:0:1::11]:7"), netip.MustParseAddrPort("[2001:2:0:1::11]:80")} {
		if err := world.TCPEcho(e.w.HostPath, dst, 2*time.Second); err != nil && dst.Port() == 7 {
			t.Fatalf("control: simulated host to %s: %v", dst, err)
		}
	}
	e.start()
	return e, ula
}

// TestE2EDualStackAllowlist: a dual-stack allowlist session reaches an
// allowed name over IPv6 once its AAAA answer is attested (not before),
// and an allowed v6 literal on its port; it is refused an unlisted v6
// address, the literal on another protocol, a special-purpose v6
// destination (from a public session, whose control reaches the public
// one), and a spoofed v6 source (another session's v6 address, next to
// the same dial from its own). Each refusal next to its passing control.
func TestE2EDualStackAllowlist(t *testing.T) {
	e, ula := newDualStackE2E(t)
	a := e.createNetOnly("a6", "--allow", "web6.e2e.test", "--allow", "[2001:2:0:1::11]:7/tcp", "--name-check", "off")
	b := e.createNetOnly("b6", "--allow", "web6.e2e.test", "--name-check", "off")
	pool6 := netip.MustParsePrefix(e2ePool6)
	for _, s := range []struct{ name, g6, dns6 string }{{"a6", a.Guest6IP, a.DNS6}, {"b6", b.Guest6IP, b.DNS6}} {
		g6, err := netip.ParseAddr(s.g6)
		if err != nil || !pool6.Contains(g6) {
			t.Fatalf("%s: guest6_ip %q, want an address of %s", s.name, s.g6, pool6)
		}
		if d, err := netip.ParseAddr(s.dns6); err != nil || !pool6.Contains(d) {
			t.Fatalf("%s: dns6 %q, want an address of %s", s.name, s.dns6, pool6)
		}
	}
	ns := e.nsPath("a6")
	web6 := netip.MustParseAddrPort("[2001:2:0:1::10]:7")
	dns6 := netip.AddrPortFrom(netip.MustParseAddr(a.DNS6), 53)

	// Before the answer: not attested, refused.
	if err := world.TCPEcho(ns, web6, time.Second); err == nil {
		t.Error("web6 reached before its AAAA answer")
	}
	m, err := world.Lookup(ns, dns6, "web6.e2e.test", dns.TypeAAAA, false, 3*time.Second)
	if err != nil {
		t.Fatalf("AAAA web6.e2e.test over the v6 proxy: %v", err)
	}
	if got := world.Addrs6Of(m); len(got) != 1 || got[0] != web6.Addr() {
		t.Fatalf("AAAA web6.e2e.test = %v, want %s", got, web6.Addr())
	}
	if got := e2eNftAttested6(t, e.w, e.d.Prefix, netip.MustParseAddr(a.Guest6IP)); !slices.Contains(got, web6.Addr()) {
		t.Errorf("kernel set attested6 of %s holds %v, want %s", a.Guest6IP, got, web6.Addr())
	}
	if got := e2eAttested(e.inspect("a6")); !slices.Contains(got, web6.Addr().String()) {
		t.Errorf("inspect's attested %v lacks %s", got, web6.Addr())
	}
	if err := world.TCPEcho(ns, web6, 3*time.Second); err != nil {
		t.Errorf("allowed name over v6 (AAAA attested): %v", err)
	}
	if err := world.UDPEcho(ns, web6, 3*time.Second); err != nil {
		t.Errorf("allowed name over v6, UDP: %v", err)
	}
	// A special-purpose AAAA is dropped from the answer.
	m, err = world.Lookup(ns, dns6, "doc6.e2e.test", dns.TypeAAAA, false, 3*time.Second)
	if err == nil && len(world.Addrs6Of(m)) != 0 {
		t.Errorf("AAAA doc6.e2e.test (2001:db8::/32) released: %v", world.Addrs6Of(m))
	}

	lit := netip.MustParseAddrPort("[2001:2:0:1::11]:7")
	if err := world.TCPEcho(ns, lit, 3*time.Second); err != nil {
		t.Errorf("allowed v6 literal [%s]:7/tcp: %v", lit.Addr(), err)
	}
	if err := world.UDPEcho(ns, lit, time.Second); err == nil {
		t.Error("v6 literal reached over UDP, allowed on TCP only")
	}
	// The refusals are answered as --on-deny says: reject (the default)
	// with ICMPv6 administratively prohibited (connect: EACCES), reset
	// with a TCP reset (ECONNREFUSED), drop with silence (a timeout).
	unlisted := netip.AddrPortFrom(lit.Addr(), 80)
	if _, err := world.DialTCP(ns, unlisted, 2*time.Second); err == nil || !errors.Is(err, unix.EACCES) {
		t.Errorf("unlisted port 80 of the v6 literal, --on-deny reject: %v, want EACCES (ICMPv6 admin-prohibited)", err)
	}
	e.createNetOnly("r6", "--allow", "web6.e2e.test", "--on-deny", "reset", "--name-check", "off")
	if _, err := world.DialTCP(e.nsPath("r6"), unlisted, 2*time.Second); err == nil || !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("unlisted v6 address, --on-deny reset: %v, want ECONNREFUSED (a TCP reset)", err)
	}
	e.createNetOnly("s6", "--allow", "web6.e2e.test", "--on-deny", "drop", "--name-check", "off")
	if _, err := world.DialTCP(e.nsPath("s6"), unlisted, time.Second); err == nil || !errors.Is(err, os.ErrDeadlineExceeded) && !strings.Contains(err.Error(), "timeout") {
		t.Errorf("unlisted v6 address, --on-deny drop: %v, want a timeout", err)
	}

	// Spoofing: a's netns takes b's v6 address (as a guest with NET_ADMIN
	// can) and dials from it; the same dial from its own address passes.
	b6 := netip.MustParseAddr(b.Guest6IP)
	aNS, err := netns.GetFromPath(ns)
	if err != nil {
		t.Fatal(err)
	}
	eth, err := netlink.NewHandleAt(aNS)
	if err != nil {
		aNS.Close()
		t.Fatal(err)
	}
	link, err := eth.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := eth.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: b6.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatal(err)
	}
	for _, src := range []netip.Addr{netip.MustParseAddr(a.Guest6IP), b6} {
		err := world.DoPath(ns, func() error {
			d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
			c, err := d.Dial("tcp6", web6.String())
			if err == nil {
				c.Close()
			}
			return err
		})
		switch {
		case src == b6 && err == nil:
			t.Errorf("spoofed v6 source %s (session b6's) reached %s", b6, web6)
		case src != b6 && err != nil:
			t.Errorf("control: own v6 source %s to %s: %v", src, web6, err)
		}
	}

	if err := eth.AddrDel(link, &netlink.Addr{IPNet: &net.IPNet{IP: b6.AsSlice(), Mask: net.CIDRMask(128, 128)}}); err != nil {
		t.Fatal(err)
	}
	eth.Close()
	aNS.Close() // nothing of the test keeps a's netns once it is removed

	// Removal: nothing keyed by a's v6 address outlives it. An open v6
	// flow of a's is in the host's conntrack table, then gone once the
	// session is removed (and its v6 set elements with it: the cleanup's
	// object check lists the v6 sets too).
	g6 := netip.MustParseAddr(a.Guest6IP)
	conn, err := world.DialTCP(ns, web6, 3*time.Second)
	if err != nil {
		t.Fatalf("control: open a v6 flow: %v", err)
	}
	if n := e2eConntrack6From(t, e.w, g6); n == 0 {
		t.Fatalf("control: no v6 conntrack entry from %s while its flow is open", g6)
	}
	e.cli("session", "rm", "a6")
	// An abortive close: the socket goes at once (an orphan retrying its
	// FIN would keep a's netns, and its veth, alive for minutes); its RST
	// cannot leave a removed session, so the entry stays ESTABLISHED
	// unless the removal flushed it.
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	for e2eConntrack6From(t, e.w, g6) > 0 {
		if time.Now().After(deadline) {
			t.Errorf("v6 conntrack entries of removed session a6 (%s) still there", g6)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Special-purpose: a public session reaches any public v6 address but
	// not a ULA server the world routes.
	e.createNetOnly("p6", "--egress", "public")
	pns := e.nsPath("p6")
	if err := world.TCPEcho(pns, netip.MustParseAddrPort("[2001:2:0:1::11]:7"), 3*time.Second); err != nil {
		t.Errorf("control: public session to a public v6 address: %v", err)
	}
	if err := world.TCPEcho(pns, ula, time.Second); err == nil {
		t.Errorf("public session reached the special-purpose %s", ula)
	}
}

// TestE2ENoPool6NoIPv6: the same dual-stack world, a daemon without
// --pool6: the session has no IPv6 at all (disabled on eth0, no v6
// address, no guest6 in inspect), its AAAA answers are emptied (with the
// name check off or on), and the v6
// web server is unreachable, while the simulated host reaches it (the
// control) and the session reaches the same name's v4 address.
func TestE2ENoPool6NoIPv6(t *testing.T) {
	e := prepareE2E(t, "")
	if err := e.w.EnableIPv6(); err != nil {
		t.Fatal(err)
	}
	for _, rr := range e2eZone6 {
		e.w.DNS.AddRR(rr)
	}
	e.w.DNS.AddRR("web6.e2e.test. 300 IN A 198.18.1.10")
	e.start()
	web6 := netip.MustParseAddrPort("[2001:2:0:1::10]:7")
	if err := world.TCPEcho(e.w.HostPath, web6, 2*time.Second); err != nil {
		t.Fatalf("control: simulated host to %s: %v", web6, err)
	}
	info := e.createNetOnly("v4only", "--allow", "web6.e2e.test", "--name-check", "off")
	if info.Guest6IP != "" || info.DNS6 != "" {
		t.Errorf("IPv4-only daemon: guest6_ip %q dns6 %q, want none", info.Guest6IP, info.DNS6)
	}
	ns := e.nsPath("v4only")
	nsh := mustNetns(t, ns)
	if v := readSysctl(t, nsh, "/proc/sys/net/ipv6/conf/eth0/disable_ipv6"); v != "1" {
		t.Errorf("eth0 disable_ipv6 = %s, want 1", v)
	}
	m, err := world.Lookup(ns, netip.AddrPortFrom(netip.MustParseAddr(info.DNS), 53), "web6.e2e.test", dns.TypeAAAA, false, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := world.Addrs6Of(m); len(got) != 0 {
		t.Errorf("AAAA released to an IPv4-only session: %v", got)
	}
	if _, err := world.Lookup(ns, netip.AddrPortFrom(netip.MustParseAddr(info.DNS), 53), "web6.e2e.test", dns.TypeA, false, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := world.TCPEcho(ns, netip.MustParseAddrPort("198.18.1.10:7"), 3*time.Second); err != nil {
		t.Errorf("control: the name's v4 address: %v", err)
	}
	err = world.TCPEcho(ns, web6, time.Second)
	if err == nil || !strings.Contains(err.Error(), "unreachable") && !strings.Contains(err.Error(), "address") {
		t.Logf("v6 dial: %v", err)
	}
	if err == nil {
		t.Errorf("IPv4-only session reached %s", web6)
	}
	// A name-checked session (the default) of the same IPv4-only daemon:
	// its AAAA stays emptied too (a dual-stack one's is attested:
	// TestE2EDualStackNameCheckFronting).
	nc := e.createNetOnly("v4nc", "--allow", "web6.e2e.test")
	m, err = world.Lookup(e.nsPath("v4nc"), netip.AddrPortFrom(netip.MustParseAddr(nc.DNS), 53), "web6.e2e.test", dns.TypeAAAA, false, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := world.Addrs6Of(m); len(got) != 0 {
		t.Errorf("AAAA released to a name-checked IPv4-only session: %v", got)
	}
}

// mustNetns opens the netns at path, closed at cleanup.
func mustNetns(t *testing.T, path string) netns.NsHandle {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatalf("open netns %s: %v", path, err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// e2eNftAttested6 reads the destinations attested for guest6 from the
// kernel's attested6 set.
func e2eNftAttested6(t *testing.T, w *world.World, prefix string, guest6 netip.Addr) []netip.Addr {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(w.Host)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	table := &nftables.Table{Name: prefix, Family: nftables.TableFamilyINet}
	set, err := c.GetSetByName(table, "attested6")
	if err != nil {
		t.Fatalf("set attested6: %v", err)
	}
	elems, err := c.GetSetElements(set)
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, el := range elems {
		if len(el.Key) == 32 && netip.AddrFrom16([16]byte(el.Key[:16])) == guest6 {
			out = append(out, netip.AddrFrom16([16]byte(el.Key[16:32])))
		}
	}
	return out
}

// e2eConntrack6From counts the simulated host's IPv6 conntrack entries
// whose original source is src.
func e2eConntrack6From(t *testing.T, w *world.World, src netip.Addr) int {
	t.Helper()
	h, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var flows []*netlink.ConntrackFlow
	for i := 0; i < 5; i++ { // an interrupted dump is retried
		if flows, err = h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET6); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("conntrack v6 dump: %v", err)
	}
	n := 0
	for _, f := range flows {
		if a, ok := netip.AddrFromSlice(f.Forward.SrcIP.To16()); ok && a == src {
			n++
		}
	}
	return n
}

// TestE2EDualStackFlowBudget: a dual-stack session's v6 flows have a
// conntrack budget (--max-flows) as its v4 ones do: with 3, three v6
// connections open and a fourth is dropped; the v4 budget is its own (a v4
// connection still opens: each family holds up to --max-flows).
func TestE2EDualStackFlowBudget(t *testing.T) {
	e, _ := newDualStackE2E(t, "--max-flows", "3")
	e.createNetOnly("f6", "--allow", "[2001:2:0:1::10]:7/tcp", "--allow", "198.18.1.10:7/tcp")
	ns := e.nsPath("f6")
	web6 := netip.MustParseAddrPort("[2001:2:0:1::10]:7")
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := 0; i < 3; i++ {
		c, err := world.DialTCP(ns, web6, 3*time.Second)
		if err != nil {
			t.Fatalf("control: v6 flow %d of 3: %v", i+1, err)
		}
		open = append(open, c)
	}
	if c, err := world.DialTCP(ns, web6, time.Second); err == nil {
		c.Close()
		t.Error("a fourth v6 flow opened past --max-flows 3")
	}
	if err := world.TCPEcho(ns, netip.MustParseAddrPort("198.18.1.10:7"), 3*time.Second); err != nil {
		t.Errorf("v4 flow beside a full v6 budget: %v", err)
	}
}

// TestE2EDualStackNDNotForwarded: a guest with raw sockets sends a
// neighbour solicitation (hop limit 255) with a spoofed source to an
// allowed v6 address: raw_session6 lets NS past anti-spoofing for the host
// side, and from_session6 must still never forward it. The control: the
// same packet from the simulated host reaches the server's namespace.
func TestE2EDualStackNDNotForwarded(t *testing.T) {
	e, _ := newDualStackE2E(t)
	info := e.createNetOnly("n6", "--allow", "[2001:2:0:1::10]:7/tcp", "--allow", "2001:2:0:1::10")
	web6 := netip.MustParseAddr("2001:2:0:1::10")
	spoofed := netip.MustParseAddr("fd00:20::6") // the next slot's guest6
	for _, tc := range []struct {
		what, ns string
		src      netip.Addr
		want     bool
	}{
		{"control: from the simulated host", e.w.HostPath, e.w.Uplink6, true},
		{"spoofed from the session", e.nsPath("n6"), spoofed, false},
		{"own source from the session", e.nsPath("n6"), netip.MustParseAddr(info.Guest6IP), false},
	} {
		target := netip.MustParseAddr(fmt.Sprintf("2001:2:0:1::%x", 0xa0+len(tc.what)))
		pkt := world.NeighborSolicitation6(tc.src, web6, target)
		got, err := world.WatchNS6(e.w.NetPath, target, 2*time.Second, func() {
			if err := world.SendRaw6(tc.ns, pkt); err != nil {
				t.Errorf("%s: send: %v", tc.what, err)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%s: NS reached %s = %v, want %v", tc.what, web6, got, tc.want)
		}
	}
}
