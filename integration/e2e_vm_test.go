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
