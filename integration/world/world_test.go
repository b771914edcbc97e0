package world

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
)

// TestWorldServesItsOwnServers checks the world from the simulated host: the
// positive controls every other live test relies on.
func TestWorldServesItsOwnServers(t *testing.T) {
	w := New(t)
	w.DNS.AddRR("web.world.test. 60 IN A 198.18.1.10")
	for _, a := range append(append([]netip.Addr{}, w.Web...), w.Metadata, w.CloudHost, w.Private) {
		if err := TCPEcho(w.HostPath, netip.AddrPortFrom(a, 7), 2*time.Second); err != nil {
			t.Errorf("tcp echo %s from simulated host: %v", a, err)
		}
		if err := UDPEcho(w.HostPath, netip.AddrPortFrom(a, 7), 2*time.Second); err != nil {
			t.Errorf("udp echo %s from simulated host: %v", a, err)
		}
		if err := Ping(w.HostPath, a, 2*time.Second); err != nil {
			t.Errorf("ping %s from simulated host: %v", a, err)
		}
		body, err := HTTPGet(w.HostPath, "http://"+a.String()+"/", 2*time.Second)
		if err != nil || !strings.Contains(body, a.String()) {
			t.Errorf("http %s from simulated host: %q %v", a, body, err)
		}
	}
	for _, tcp := range []bool{false, true} {
		m, err := Lookup(w.HostPath, w.DNS.Addr(), "web.world.test", dns.TypeA, tcp, 2*time.Second)
		if err != nil {
			t.Fatalf("lookup (tcp=%v): %v", tcp, err)
		}
		if got := AddrsOf(m); len(got) != 1 || got[0] != w.Web[0] {
			t.Errorf("lookup (tcp=%v) = %v, want %v", tcp, got, w.Web[0])
		}
	}
	if !w.DNS.QueriedName("web.world.test") {
		t.Errorf("dns query log misses web.world.test: %v", w.DNS.Queries())
	}
	m, err := Lookup(w.HostPath, w.DNS.Addr(), "missing.world.test", dns.TypeA, false, 2*time.Second)
	if err != nil || m.Rcode != dns.RcodeNameError {
		t.Errorf("missing name: %v %v, want NXDOMAIN", m, err)
	}
}

// TestWorldHasNoWayOut checks that the simulated host routes only into the
// world and the world is removed by name.
func TestWorldHasNoWayOut(t *testing.T) {
	w := New(t)
	h, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	if strings.Join(names, ",") != "lo,uplink" {
		t.Errorf("simulated host links = %v, want only lo and uplink", names)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	out, _ := listNetns()
	for _, n := range []string{w.HostName, w.NetName} {
		if strings.Contains(out, n) {
			t.Errorf("netns %s still exists after Close", n)
		}
	}
}

// TestWorldServesIPv6 is the control for every dual-stack test: with IPv6
// enabled, the simulated host reaches the v6 web servers (TCP and UDP echo,
// HTTP) and the world's DNS server answers AAAA, all without enforcerd.
func TestWorldServesIPv6(t *testing.T) {
	w := New(t)
	if err := w.EnableIPv6(); err != nil {
		t.Fatalf("enable IPv6: %v", err)
	}
	if len(w.Web6) == 0 {
		t.Fatal("no IPv6 web servers")
	}
	for _, a := range w.Web6 {
		if !World6Prefix.Contains(a) {
			t.Errorf("web6 %s outside %s", a, World6Prefix)
		}
		if err := TCPEcho(w.HostPath, netip.AddrPortFrom(a, 7), 2*time.Second); err != nil {
			t.Errorf("tcp echo %s from simulated host: %v", a, err)
		}
		if err := UDPEcho(w.HostPath, netip.AddrPortFrom(a, 7), 2*time.Second); err != nil {
			t.Errorf("udp echo %s from simulated host: %v", a, err)
		}
		body, err := HTTPGet(w.HostPath, "http://["+a.String()+"]/", 2*time.Second)
		if err != nil || !strings.Contains(body, a.String()) {
			t.Errorf("http %s from simulated host: %q %v", a, body, err)
		}
	}
	w.DNS.AddRR("web6.world.test. 60 IN AAAA " + w.Web6[0].String())
	m, err := Lookup(w.HostPath, w.DNS.Addr(), "web6.world.test", dns.TypeAAAA, false, 2*time.Second)
	if err != nil {
		t.Fatalf("lookup AAAA: %v", err)
	}
	if got := Addrs6Of(m); len(got) != 1 || got[0] != w.Web6[0] {
		t.Errorf("lookup AAAA = %v, want %v", got, w.Web6[0])
	}
}
