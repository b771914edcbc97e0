package integration

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/vishvananda/netns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/dhcpguest"
)

// VM sessions through the real binary, the test playing the VMM on the tap
// (TestE2EVMGuestQEMU boots a real guest).

// e2eLeaseOf runs DISCOVER and REQUEST from mac on the tap and returns the
// ACK (nil when no answer came).
func e2eLeaseOf(t *testing.T, tap interface {
	Write([]byte) (int, error)
}, read func(dhcpv4.TransactionID) *dhcpv4.DHCPv4, mac net.HardwareAddr) (offer, ack *dhcpv4.DHCPv4) {
	t.Helper()
	disc, _ := dhcpv4.NewDiscovery(mac)
	if _, err := tap.Write(dhcpguest.ClientFrame(mac, disc)); err != nil {
		t.Fatalf("write to tap: %v", err)
	}
	if offer = read(disc.TransactionID); offer == nil {
		return nil, nil
	}
	req, _ := dhcpv4.NewRequestFromOffer(offer)
	if _, err := tap.Write(dhcpguest.ClientFrame(mac, req)); err != nil {
		t.Fatalf("write to tap: %v", err)
	}
	return offer, read(req.TransactionID)
}

// TestE2EVMSession: create --vm (with a policy) answers the guest's
// attachment; the daemon's responder leases the guest address to the
// session's MAC, before and after a restart, and never to another MAC;
// --tap/--mac without --vm and --vm with egress none are refused; rm
// removes the tap.
func TestE2EVMSession(t *testing.T) {
	e := newE2E(t)
	if msg := e.expectFail(1, "session", "create", "x", "--network-only", "--allow", "api.e2e.test", "--tap", "tap1"); !strings.Contains(msg, "needs vm") {
		t.Errorf("--tap without --vm: %q", msg)
	}
	if msg := e.expectFail(1, "session", "create", "x", "--vm"); !strings.Contains(msg, "egress none") {
		t.Errorf("--vm with egress none: %q", msg)
	}
	if msg := e.expectFail(1, "session", "create", "x", "--vm", "--allow", "api.e2e.test", "--mac", "01:00:5e:00:00:01"); !strings.Contains(msg, "want") {
		t.Errorf("--mac multicast: %q", msg)
	}

	info := e.createWith([]string{"--vm", "--tap", "tapg", "--tap-owner", "1234", "--allow", "api.e2e.test", "--deny", "198.18.1.11"}, "vm1")
	vm := info.VM
	if vm == nil {
		t.Fatalf("create --vm --json has no vm: %+v", info)
	}
	wantArg := "ip=" + info.GuestIP + "::" + info.GatewayIP + ":255.255.255.252::eth0:off:" + e2eAnycastDNS.Addr().String()
	if vm.Tap != "tapg" || vm.TapOwner == nil || *vm.TapOwner != 1234 || vm.NetnsPath != e.nsPath("vm1") || vm.Address != info.GuestIP+"/30" ||
		vm.Gateway != info.GatewayIP || vm.DNS != e2eAnycastDNS.Addr().String() || vm.MTU != 1500 || vm.KernelIPArg != wantArg || vm.Bridge != "br0" {
		t.Errorf("create --json vm = %+v, want tap tapg owned by 1234, netns %s, %s/30 via %s, %s", vm, e.nsPath("vm1"), info.GuestIP, info.GatewayIP, wantArg)
	}
	if info.Sandbox {
		t.Error("a VM session has a sandbox")
	}
	var inspected api.SessionInfo
	if err := json.Unmarshal([]byte(e.cli("session", "inspect", "vm1")), &inspected); err != nil || inspected.VM == nil || *inspected.VM.TapOwner != 1234 || inspected.VM.MAC != vm.MAC {
		t.Errorf("inspect vm1: %+v %v", inspected.VM, err)
	}
	mac, err := net.ParseMAC(vm.MAC)
	if err != nil || mac[0]&0x03 != 0x02 {
		t.Fatalf("derived mac %q: want locally administered unicast (%v)", vm.MAC, err)
	}

	ns, err := netns.GetFromPath(vm.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	tap := attachTap(t, ns, "tapg")
	read := func(xid dhcpv4.TransactionID) *dhcpv4.DHCPv4 { return readDHCPReply(t, tap, xid, 3*time.Second) }
	check := func(when string) {
		t.Helper()
		offer, ack := e2eLeaseOf(t, tap, read, mac)
		if offer == nil || ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.YourIPAddr.String() != info.GuestIP {
			t.Fatalf("%s: lease of %s: offer %v, ack %v; want an ACK of %s", when, mac, offer, ack, info.GuestIP)
		}
		if d := ack.DNS(); len(d) != 1 || d[0].String() != vm.DNS {
			t.Errorf("%s: ack dns %v, want %s", when, d, vm.DNS)
		}
		other := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
		if offer, _ := e2eLeaseOf(t, tap, func(xid dhcpv4.TransactionID) *dhcpv4.DHCPv4 { return readDHCPReply(t, tap, xid, time.Second) }, other); offer != nil {
			t.Errorf("%s: another MAC %s got an offer of %s", when, other, offer.YourIPAddr)
		}
	}
	check("after create")

	if err := e.d.Stop(); err != nil {
		t.Fatalf("stop enforcerd: %v", err)
	}
	disc, _ := dhcpv4.NewDiscovery(mac)
	tap.Write(dhcpguest.ClientFrame(mac, disc))
	if r := readDHCPReply(t, tap, disc.TransactionID, time.Second); r != nil {
		t.Errorf("a %s while the daemon is down", r.MessageType())
	}
	e.start()
	check("after a restart")

	e.cli("session", "rm", "vm1")
	if _, err := tap.Write(dhcpguest.ClientFrame(mac, disc)); err == nil {
		t.Error("the VMM's tap still works after rm")
	}
}

// TestE2EVMFork: session fork copies the source's policy as updated, its
// labels and its tap, with its own slot, netns and MAC and nothing
// attested; a guest keeping the source's MAC (a resumed snapshot) that
// asks for the source's address is NAK'd and leases the fork's, while the
// source keeps leasing its own (control).
func TestE2EVMFork(t *testing.T) {
	e := newE2E(t)
	src := e.createWith([]string{"--vm", "--tap", "tapf", "--allow", "api.e2e.test", "--deny", "198.18.1.11", "--on-deny", "drop", "--label", "team=a"}, "src")
	e.cli("session", "update", "src", "--allow", "other.e2e.test")
	want := e.inspect("src")
	if msg := e.expectFail(1, "session", "fork", "src", "x", "--mac", "01:00:5e:00:00:01"); !strings.Contains(msg, "want") {
		t.Errorf("fork with a multicast mac: %q", msg)
	}
	if msg := e.expectFail(1, "session", "fork", "nosuch", "x"); !strings.Contains(msg, "nosuch") {
		t.Errorf("fork of a missing session: %q", msg)
	}

	out := e.cli("session", "fork", "src", "dst", "--mac", src.VM.MAC, "--json")
	var f api.SessionInfo
	if err := json.Unmarshal([]byte(out), &f); err != nil || f.VM == nil {
		t.Fatalf("fork --json: %v\n%s", err, out)
	}
	if f.GuestIP == src.GuestIP || f.Netns == src.Netns || f.VM.Tap != "tapf" || f.VM.MAC != src.VM.MAC {
		t.Errorf("fork: guest %s netns %s tap %s mac %s; want its own address and netns, tap tapf, mac %s", f.GuestIP, f.Netns, f.VM.Tap, f.VM.MAC, src.VM.MAC)
	}
	fp, wp := f.Policy, want.Policy
	if strings.Join(fp.Allow, ",") != strings.Join(wp.Allow, ",") || strings.Join(fp.Deny, ",") != strings.Join(wp.Deny, ",") || fp.OnDeny != "drop" || f.Labels["team"] != "a" || fp.Generation != 1 {
		t.Errorf("fork policy %+v labels %v, want the source's as updated %+v, labels team=a, generation 1", fp, f.Labels, wp)
	}
	if len(e.inspect("dst").Attested) != 0 {
		t.Error("the fork has attested addresses")
	}
	// Without --mac the fork's MAC is its own.
	g := e.inspect("src")
	out = e.cli("session", "fork", "src", "dst2", "--json")
	var f2 api.SessionInfo
	if err := json.Unmarshal([]byte(out), &f2); err != nil || f2.VM == nil || f2.VM.MAC == g.VM.MAC {
		t.Errorf("fork without --mac: %v, mac %+v, want one of its own", err, f2.VM)
	}

	// The resumed guest: the source's MAC on the fork's tap, asking for the
	// source's address.
	mac, _ := net.ParseMAC(src.VM.MAC)
	ns, err := netns.GetFromPath(f.VM.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	tap := attachTap(t, ns, "tapf")
	stale, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(mac), dhcpv4.WithClientIP(net.ParseIP(src.GuestIP)))
	if _, err := tap.Write(dhcpguest.ClientFrame(mac, stale)); err != nil {
		t.Fatal(err)
	}
	if nak := readDHCPReply(t, tap, stale.TransactionID, 3*time.Second); nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("renewal of the source's %s in the fork: %v, want a NAK", src.GuestIP, nak)
	}
	read := func(xid dhcpv4.TransactionID) *dhcpv4.DHCPv4 { return readDHCPReply(t, tap, xid, 3*time.Second) }
	if _, ack := e2eLeaseOf(t, tap, read, mac); ack == nil || ack.YourIPAddr.String() != f.GuestIP {
		t.Errorf("after the NAK: %v, want an ACK of the fork's %s", ack, f.GuestIP)
	}
	// Control: the source still leases its own address to the same MAC.
	sns, err := netns.GetFromPath(src.VM.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer sns.Close()
	stap := attachTap(t, sns, "tapf")
	sread := func(xid dhcpv4.TransactionID) *dhcpv4.DHCPv4 { return readDHCPReply(t, stap, xid, 3*time.Second) }
	if _, ack := e2eLeaseOf(t, stap, sread, mac); ack == nil || ack.YourIPAddr.String() != src.GuestIP {
		t.Errorf("the source: %v, want an ACK of %s", ack, src.GuestIP)
	}
}
