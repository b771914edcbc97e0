package integration

import (
	"bytes"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/enforcerd/enforcerd/integration/world"
)

// TestE2ECNIDualStack drives the real plugin through libcni against a
// dual-stack daemon (--pool6): ADD's result carries the /30 and the /126
// with their gateways, both default routes and both resolvers; the
// container's interface holds the v6 address and route, with IPv6 closed
// down on it (no RA, no autoconf, no redirects, no DAD); the container
// reaches its allowed v6 destination and not an unlisted one nor a
// special-purpose one (controls: the simulated host reaches both, see
// newDualStackE2E); CHECK passes; DEL leaves no interface, no session and
// no v6 set element of the guest behind.
func TestE2ECNIDualStack(t *testing.T) {
	pluginDir := e2eCNIPlugin(t)
	e, ula := newDualStackE2E(t)
	allowed := netip.MustParseAddrPort("[2001:2:0:1::10]:7")
	rtm := newCNIRuntime(t, pluginDir, cniConflist("enf6", e.d.Socket, `{"egress": "allowlist", "allow": ["[2001:2:0:1::10]:7/tcp", "198.18.1.10:7/tcp"]}`))
	ns := runtimeNetns(t, e.w, "d6")
	rt := &libcni.RuntimeConf{ContainerID: "ctr-d6-" + e.w.ID, NetNS: ns, IfName: "eth0"}
	res, err := rtm.add(rt)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	info, ok := e.sessionOf(rt.ContainerID)
	if !ok {
		t.Fatalf("no session carries container %s", rt.ContainerID)
	}
	pool6 := netip.MustParsePrefix(e2ePool6)
	guest6, err := netip.ParseAddr(info.Guest6IP)
	if err != nil || !pool6.Contains(guest6) {
		t.Fatalf("attached session: guest6_ip %q, want an address of %s", info.Guest6IP, pool6)
	}
	if len(res.IPs) != 2 || res.IPs[0].Address.String() != info.GuestIP+"/30" || res.IPs[0].Gateway.String() != info.GatewayIP ||
		res.IPs[1].Address.String() != info.Guest6IP+"/126" || res.IPs[1].Gateway.String() != info.Gateway6IP ||
		len(res.Routes) != 2 || res.Routes[0].Dst.String() != "0.0.0.0/0" || res.Routes[1].Dst.String() != "::/0" ||
		res.Routes[1].GW.String() != info.Gateway6IP || !slices.Equal(res.DNS.Nameservers, []string{info.DNS, info.DNS6}) {
		t.Errorf("ADD result: %s", mustJSON(res))
	}
	nsh, h, release := sessionHandle(t, ns)
	if !linkHasAddr(t, h, "eth0", guest6) {
		t.Errorf("eth0 in the container's netns lacks %s", guest6)
	}
	routes, err := h.RouteList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
		return (r.Dst == nil || r.Dst.String() == "::/0") && net.IP(r.Gw).String() == info.Gateway6IP
	}) {
		t.Errorf("no v6 default route via %s in the container's netns: %v", info.Gateway6IP, routes)
	}
	for _, key := range []string{"accept_ra", "autoconf", "accept_redirects", "accept_dad", "disable_ipv6"} {
		if v := readSysctl(t, nsh, "/proc/sys/net/ipv6/conf/eth0/"+key); v != "0" {
			t.Errorf("eth0 in the container's netns: %s = %s, want 0", key, v)
		}
	}
	release()

	// The allowed v6 destination, and v4 beside it; not an unlisted v6
	// address, nor the special-purpose ULA server.
	if err := world.TCPEcho(ns, allowed, 3*time.Second); err != nil {
		t.Errorf("allowed %s unreachable from the container: %v", allowed, err)
	}
	if err := world.TCPEcho(ns, netip.MustParseAddrPort("198.18.1.10:7"), 3*time.Second); err != nil {
		t.Errorf("allowed 198.18.1.10:7 unreachable from the container: %v", err)
	}
	for _, dst := range []netip.AddrPort{netip.MustParseAddrPort("[2001:2:0:1::11]:7"), ula} {
		if err := world.TCPEcho(ns, dst, time.Second); err == nil {
			t.Errorf("forbidden %s reachable from the container", dst)
		}
	}
	if err := rtm.check(rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	for _, set := range []string{"sessions6", "static6_ports"} {
		if n := e2eNftElemsWith(t, e.w, e.d.Prefix, set, guest6); n == 0 {
			t.Errorf("set %s holds no element of %s while the session lives", set, guest6)
		}
	}

	// DEL: nothing of the attachment stays, the runtime's netns does.
	if err := rtm.del(rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if s, ok := e.sessionOf(rt.ContainerID); ok {
		t.Errorf("session %s still there after DEL", s.Name)
	}
	_, h, release = sessionHandle(t, ns)
	if _, err := h.LinkByName("eth0"); err == nil {
		t.Errorf("eth0 still in the container's netns after DEL")
	}
	release()
	for _, set := range []string{"sessions6", "static6_ports"} {
		if n := e2eNftElemsWith(t, e.w, e.d.Prefix, set, guest6); n != 0 {
			t.Errorf("set %s holds %d elements of %s after DEL", set, n, guest6)
		}
	}
	if err := world.TCPEcho(ns, allowed, time.Second); err == nil {
		t.Errorf("%s reachable from the container's netns after DEL", allowed)
	}
}

// e2eNftElemsWith counts the elements of a set of the daemon's table whose
// key holds the address a.
func e2eNftElemsWith(t *testing.T, w *world.World, prefix, set string, a netip.Addr) int {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(w.Host)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	s, err := c.GetSetByName(&nftables.Table{Name: prefix, Family: nftables.TableFamilyINet}, set)
	if err != nil {
		t.Fatalf("set %s: %v", set, err)
	}
	elems, err := c.GetSetElements(s)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, el := range elems {
		if bytes.Contains(el.Key, a.AsSlice()) {
			n++
		}
	}
	return n
}
