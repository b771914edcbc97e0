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
