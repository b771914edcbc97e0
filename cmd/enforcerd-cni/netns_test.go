package main

import (
	"bufio"
	"net"
	"net/netip"
	"strings"
	"testing"

	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/enforcerd/enforcerd/api"
)

func TestParseRoutes(t *testing.T) {
	// /proc/net/route of a session's netns on a little-endian machine:
	// default via 10.200.0.1 on eth0, the /30 on eth0.
	const table = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n" +
		"eth0\t0000C80A\t00000000\t0001\t0\t0\t0\tFCFFFFFF\t0\t0\t0\n" +
		"eth0\t00000000\t0100C80A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
	gw, ok, err := parseRoutes(bufio.NewScanner(strings.NewReader(table)), "eth0")
	if err != nil || !ok || gw != netip.MustParseAddr("10.200.0.1") {
		t.Errorf("eth0: %v %v %v, want via 10.200.0.1", gw, ok, err)
	}
	if _, ok, err := parseRoutes(bufio.NewScanner(strings.NewReader(table)), "net1"); ok || err != nil {
		t.Errorf("net1 has no default route; got %v %v", ok, err)
	}
}

func TestCheckIface(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	info := api.SessionInfo{GuestIP: "10.200.0.2", GatewayIP: "10.200.0.1"}
	prev := &types100.Result{Interfaces: []*types100.Interface{{Name: "h"}, {Name: "eth0", Mac: mac.String(), Sandbox: "/run/netns/x"}}}
	good := containerIface{Up: true, MAC: mac, Addr: netip.MustParsePrefix("10.200.0.2/30"), Gateway: netip.MustParseAddr("10.200.0.1"), HasRoute: true}
	if err := checkIface(good, info, prev, "eth0", "/run/netns/x"); err != nil {
		t.Errorf("as returned: %v", err)
	}
	other, _ := net.ParseMAC("02:00:00:00:00:02")
	for _, c := range []struct {
		mod  func(*containerIface)
		want string
	}{
		{func(c *containerIface) { c.Up = false }, "check: eth0 in netns /run/netns/x is down"},
		{func(c *containerIface) { c.Addr = netip.Prefix{} }, "check: eth0 in netns /run/netns/x has address none, want 10.200.0.2/30"},
		{func(c *containerIface) { c.Addr = netip.MustParsePrefix("10.200.0.2/24") }, "check: eth0 in netns /run/netns/x has address 10.200.0.2/24, want 10.200.0.2/30"},
		{func(c *containerIface) { c.MAC = other }, "check: eth0 in netns /run/netns/x has mac 02:00:00:00:00:02, the result said 02:00:00:00:00:01"},
		{func(c *containerIface) { c.HasRoute = false }, "check: eth0 in netns /run/netns/x has default route none, want via 10.200.0.1"},
		{func(c *containerIface) { c.Gateway = netip.MustParseAddr("10.9.9.9") }, "check: eth0 in netns /run/netns/x has default route via 10.9.9.9, want via 10.200.0.1"},
	} {
		ci := good
		c.mod(&ci)
		if err := checkIface(ci, info, prev, "eth0", "/run/netns/x"); err == nil || err.Error() != c.want {
			t.Errorf("got %v, want %s", err, c.want)
		}
	}
}

func TestParseIPv6Proc(t *testing.T) {
	// /proc/net/if_inet6 and /proc/net/ipv6_route of a dual-stack
	// session's netns: fd00:20::2/126 and a link-local on eth0, lo's ::1;
	// the /126, the link-local /64 and the default via fd00:20::1.
	const addrs = "fd000020000000000000000000000002 02 7e 00 80     eth0\n" +
		"fe80000000000000000000fffe000001 02 40 20 80     eth0\n" +
		"00000000000000000000000000000001 01 80 10 80       lo\n"
	got, err := parseIfInet6(bufio.NewScanner(strings.NewReader(addrs)), "eth0")
	if err != nil || len(got) != 1 || got[0] != netip.MustParsePrefix("fd00:20::2/126") {
		t.Errorf("eth0's global IPv6 addresses: %v %v, want [fd00:20::2/126]", got, err)
	}
	const routes = "fd000020000000000000000000000000 7e 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n" +
		"fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n" +
		"00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000020000000000000000000000001 00000400 00000001 00000000 00000003     eth0\n"
	gw, ok, err := parseRoutes6(bufio.NewScanner(strings.NewReader(routes)), "eth0")
	if err != nil || !ok || gw != netip.MustParseAddr("fd00:20::1") {
		t.Errorf("eth0's IPv6 default route: %v %v %v, want via fd00:20::1", gw, ok, err)
	}
	if _, ok, err := parseRoutes6(bufio.NewScanner(strings.NewReader(routes)), "net1"); ok || err != nil {
		t.Errorf("net1 has no IPv6 default route; got %v %v", ok, err)
	}
}

// TestDualStackResultAndCheck: on a dual-stack daemon ADD's result carries
// both addresses with their gateways, both default routes and both
// resolvers; CHECK wants the /126 and the v6 route as well.
func TestDualStackResultAndCheck(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	info := api.SessionInfo{Name: "s", HostVeth: "p0h", GuestIP: "10.200.0.2", GatewayIP: "10.200.0.1", DNS: "10.200.255.254",
		Guest6IP: "fd00:20::2", Gateway6IP: "fd00:20::1", DNS6: "fd00:20::fffe"}
	res, err := result(info, "eth0", "/run/netns/x", mac)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 2 || res.IPs[0].Address.String() != "10.200.0.2/30" || res.IPs[1].Address.String() != "fd00:20::2/126" ||
		res.IPs[1].Gateway.String() != "fd00:20::1" || len(res.Routes) != 2 || res.Routes[1].Dst.String() != "::/0" ||
		res.Routes[1].GW.String() != "fd00:20::1" || len(res.DNS.Nameservers) != 2 || res.DNS.Nameservers[1] != "fd00:20::fffe" {
		t.Errorf("dual-stack result: IPs %v routes %v dns %v", res.IPs, res.Routes, res.DNS)
	}
	v4only := info
	v4only.Guest6IP, v4only.Gateway6IP, v4only.DNS6 = "", "", ""
	if res, err := result(v4only, "eth0", "/run/netns/x", mac); err != nil || len(res.IPs) != 1 || len(res.Routes) != 1 || len(res.DNS.Nameservers) != 1 {
		t.Errorf("IPv4-only result: %v %v", res, err)
	}
	prev := &types100.Result{Interfaces: []*types100.Interface{{Name: "p0h"}, {Name: "eth0", Mac: mac.String(), Sandbox: "/run/netns/x"}}}
	good := containerIface{Up: true, MAC: mac, Addr: netip.MustParsePrefix("10.200.0.2/30"), Gateway: netip.MustParseAddr("10.200.0.1"), HasRoute: true,
		Addrs6: []netip.Prefix{netip.MustParsePrefix("fd00:20::2/126")}, Gateway6: netip.MustParseAddr("fd00:20::1"), HasRoute6: true}
	if err := checkIface(good, info, prev, "eth0", "/run/netns/x"); err != nil {
		t.Errorf("as returned: %v", err)
	}
	for _, c := range []struct {
		mod  func(*containerIface)
		want string
	}{
		{func(c *containerIface) { c.Addrs6 = nil }, "check: eth0 in netns /run/netns/x has IPv6 addresses [], want fd00:20::2/126 among them"},
		{func(c *containerIface) { c.HasRoute6 = false }, "check: eth0 in netns /run/netns/x has IPv6 default route none, want via fd00:20::1"},
	} {
		ci := good
		c.mod(&ci)
		if err := checkIface(ci, info, prev, "eth0", "/run/netns/x"); err == nil || err.Error() != c.want {
			t.Errorf("got %v, want %s", err, c.want)
		}
	}
}
