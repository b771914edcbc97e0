package integration

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/dhcpguest"
	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Live tests of a VM session's network (nsmgr.CreateVM) and its DHCP
// responder (dhcpguest), with the test playing the VMM: it attaches to the
// tap through /dev/net/tun, as QEMU or Firecracker do, and reads and
// writes the guest's frames.

// attachTap opens the tap named ifname in the netns ns as a VMM does
// (TUNSETIFF on an existing persistent tap) and returns its fd, closed at
// cleanup.
func attachTap(t *testing.T, ns netns.NsHandle, ifname string) *os.File {
	t.Helper()
	var f *os.File
	err := nsmgr.Do(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		var req [unix.IFNAMSIZ + 64]byte
		copy(req[:], ifname)
		*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
			unix.Close(fd)
			return errno
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), ifname)
		return nil
	})
	if err != nil {
		t.Fatalf("attach to tap %s: %v", ifname, err)
	}
	t.Cleanup(func() { f.Close() })
	waitTapActive(t, ns, ifname)
	return f
}

// waitTapActive waits until the kernel has brought the tap's carrier up
// after an attach. The attach turns the carrier on at once, but the tap's
// transmit queue is activated later, by the link-watch worker, which runs
// at most once a second: a frame the responder sends before that is
// dropped without an error (a real guest's DHCP client retransmits; a test
// sends once). The worker sets the operational state up just before it
// activates the queue, so the test waits for that state and a margin.
func waitTapActive(t *testing.T, ns netns.NsHandle, ifname string) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink in the tap's netns: %v", err)
	}
	defer h.Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		l, err := h.LinkByName(ifname)
		if err != nil {
			t.Fatalf("find tap %s: %v", ifname, err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			time.Sleep(20 * time.Millisecond)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tap %s: operational state %s 3 s after the attach, want up", ifname, l.Attrs().OperState)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readDHCPReply reads frames from the tap until a DHCP reply for xid
// arrives or wait passes (nil).
func readDHCPReply(t *testing.T, tap *os.File, xid dhcpv4.TransactionID, wait time.Duration) *dhcpv4.DHCPv4 {
	t.Helper()
	deadline := time.Now().Add(wait)
	buf := make([]byte, 2048)
	for time.Now().Before(deadline) {
		tap.SetReadDeadline(deadline)
		n, err := tap.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil
		}
		if err != nil {
			t.Fatalf("read tap: %v", err)
		}
		if r, err := dhcpguest.ParseReply(buf[:n]); err == nil && r.TransactionID == xid {
			return r
		}
	}
	return nil
}

// arpRequest is an ARP request from mac and addr for target, broadcast.
func arpRequest(mac net.HardwareAddr, addr, target netip.Addr) []byte {
	f := make([]byte, 14+28)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], mac)
	f[12], f[13] = 0x08, 0x06
	a := f[14:]
	copy(a, []byte{0, 1, 8, 0, 6, 4, 0, 1})
	copy(a[8:14], mac)
	s4, t4 := addr.As4(), target.As4()
	copy(a[14:18], s4[:])
	copy(a[24:28], t4[:])
	return f
}

// captureSrcMACs counts, by source MAC, the frames ifname (in ns)
// receives while during runs.
func captureSrcMACs(t *testing.T, ns netns.NsHandle, ifname string, during func()) map[string]int {
	t.Helper()
	var fd int
	err := nsmgr.Do(ns, func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		proto := uint16(unix.ETH_P_ALL)<<8 | uint16(unix.ETH_P_ALL)>>8
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto)); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index})
	})
	if err != nil {
		t.Fatalf("capture on %s: %v", ifname, err)
	}
	defer unix.Close(fd)
	during()
	time.Sleep(100 * time.Millisecond)
	seen := map[string]int{}
	buf := make([]byte, 2048)
	for {
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		if err != nil {
			return seen
		}
		if n >= 12 {
			seen[net.HardwareAddr(buf[6:12]).String()]++
		}
	}
}

// TestNsmgrVMSession: CreateVM makes the bridge, the locked tap and no
// address; the responder leases the guest's address to the guest's MAC and
// NAKs another address; another MAC gets no answer and its frames never
// reach the host veth (next to the guest MAC's DHCP and ARP, which do); Recover finds
// the tap and MAC; Delete removes the tap (the VMM's fd goes dead) and is
// idempotent.
func TestNsmgrVMSession(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	m := newManager(t, w, prefix, "10.20.0.0/16", nil)
	mac := net.HardwareAddr{0x02, 0x42, 0x00, 0x00, 0x00, 0x07}
	s, err := m.CreateVM("vm1", nsmgr.VMConfig{Tap: "tapvm", TapOwner: 4242, MAC: mac})
	if err != nil {
		t.Fatalf("CreateVM: %v", err)
	}
	cleanupSession(t, w, prefix, "vm1", s.Slot)
	if s.VM == nil || s.VM.Tap != "tapvm" || s.VM.MAC.String() != mac.String() || s.VM.Bridge != nsmgr.VMBridge {
		t.Fatalf("CreateVM session VM = %+v", s.VM)
	}

	ns, gh, release := sessionHandle(t, s.NetnsPath)
	if got := linkNames(t, gh); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"br0", "eth0", "lo", "tapvm"}) {
		t.Fatalf("links in the session netns = %v, want br0 eth0 lo tapvm", got)
	}
	br, _ := gh.LinkByName("br0")
	for _, name := range []string{"eth0", "tapvm", "br0"} {
		l, err := gh.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if a := v4Addrs(t, gh, l); len(a) != 0 {
			t.Errorf("%s holds addresses %v, want none", name, a)
		}
		if !isUp(l) {
			t.Errorf("%s is down", name)
		}
		if name != "br0" && l.Attrs().MasterIndex != br.Attrs().Index {
			t.Errorf("%s is not a port of br0", name)
		}
	}
	tapLink, _ := gh.LinkByName("tapvm")
	if tt, ok := tapLink.(*netlink.Tuntap); !ok || tt.Owner != 4242 {
		t.Errorf("tap = %T %+v, want a tuntap owned by 4242", tapLink, tapLink)
	}
	if pi, err := gh.LinkGetProtinfo(tapLink); err != nil || pi.Learning {
		t.Errorf("tap port protinfo %+v, %v: want learning off", pi, err)
	}

	lease := dhcpguest.Lease{MAC: mac, Addr: s.Guest, Bits: 30, Gateway: s.Gateway, DNS: m.DNSAddr(), LeaseTime: time.Minute}
	resp, err := dhcpguest.Start(func(fn func() error) error { return nsmgr.Do(ns, fn) }, "tapvm", lease, func(o dhcpguest.Outcome, err error) { t.Logf("responder: %s %v", o, err) })
	if err != nil {
		t.Fatalf("dhcpguest.Start: %v", err)
	}
	t.Cleanup(func() { resp.Close() })

	tap := attachTap(t, ns, "tapvm")
	send := func(src net.HardwareAddr, msg *dhcpv4.DHCPv4) {
		t.Helper()
		if _, err := tap.Write(dhcpguest.ClientFrame(src, msg)); err != nil {
			t.Fatalf("write to tap: %v", err)
		}
	}

	// The guest's MAC: offer, ack, each with the lease.
	disc, _ := dhcpv4.NewDiscovery(mac)
	send(mac, disc)
	offer := readDHCPReply(t, tap, disc.TransactionID, 3*time.Second)
	if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer || offer.YourIPAddr.String() != s.Guest.String() {
		t.Fatalf("DISCOVER from the guest's MAC: got %v, want an OFFER of %s", offer, s.Guest)
	}
	if r := offer.Router(); len(r) != 1 || r[0].String() != s.Gateway.String() {
		t.Errorf("offer router %v, want %s", r, s.Gateway)
	}
	if d := offer.DNS(); len(d) != 1 || d[0].String() != m.DNSAddr().String() {
		t.Errorf("offer dns %v, want %s", d, m.DNSAddr())
	}
	req, _ := dhcpv4.NewRequestFromOffer(offer)
	send(mac, req)
	if ack := readDHCPReply(t, tap, req.TransactionID, 3*time.Second); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.YourIPAddr.String() != s.Guest.String() {
		t.Fatalf("REQUEST of the offer: got %v, want an ACK of %s", ack, s.Guest)
	}
	// Another address: NAK.
	other := netip.MustParseAddr("10.20.0.6")
	stale, _ := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(mac), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(other.AsSlice())))
	send(mac, stale)
	if nak := readDHCPReply(t, tap, stale.TransactionID, 3*time.Second); nak == nil || nak.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("REQUEST of %s: got %v, want a NAK", other, nak)
	}
	// Another MAC: silence, and its frames go nowhere.
	foreign := net.HardwareAddr{0x02, 0x42, 0x00, 0x00, 0x00, 0x08}
	disc2, _ := dhcpv4.NewDiscovery(foreign)
	disc3, _ := dhcpv4.NewDiscovery(mac)
	arp := func(src net.HardwareAddr) {
		t.Helper()
		if _, err := tap.Write(arpRequest(src, s.Guest, s.Gateway)); err != nil {
			t.Fatalf("write to tap: %v", err)
		}
	}
	seen := captureSrcMACs(t, w.Host, s.HostIface, func() {
		for i := 0; i < 3; i++ {
			send(foreign, disc2)
			arp(foreign)
		}
		if r := readDHCPReply(t, tap, disc2.TransactionID, time.Second); r != nil {
			t.Errorf("DISCOVER from another MAC %s got a %s", foreign, r.MessageType())
		}
		send(mac, disc3) // answered on the tap (and flooded to the host, like any broadcast)
		if r := readDHCPReply(t, tap, disc3.TransactionID, 3*time.Second); r == nil {
			t.Errorf("no OFFER for the guest's MAC")
		}
		arp(mac) // control: the guest's own ARP reaches the host
	})
	if seen[foreign.String()] != 0 {
		t.Errorf("host veth received %d frames from another MAC, want 0 (the tap port is locked)", seen[foreign.String()])
	}
	if seen[mac.String()] < 2 {
		t.Errorf("host veth received %d frames from the guest's MAC, want its DISCOVER and ARP request (control); saw %v", seen[mac.String()], seen)
	}
	resp.Close()

	// Recover sees the VM session.
	m.Close()
	m2 := newManager(t, w, prefix, "10.20.0.0/16", nil)
	got, err := m2.Recover()
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if len(got) != 1 || got[0].VM == nil || got[0].VM.Tap != "tapvm" || got[0].VM.MAC.String() != mac.String() || got[0].VM.TapOwner != 4242 {
		t.Fatalf("Recover = %+v (vm %+v), want vm1 with tap tapvm, mac %s, owner 4242", got, got[0].VM, mac)
	}

	// Delete removes the tap at once, though we still hold it and the netns.
	if err := m2.Delete("vm1", s.Slot); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := gh.LinkByName("tapvm"); err == nil {
		t.Error("tap still exists after Delete")
	}
	if _, err := gh.LinkByName("br0"); err == nil {
		t.Error("bridge still exists after Delete")
	}
	if _, err := tap.Write(dhcpguest.ClientFrame(mac, disc)); err == nil {
		t.Error("the VMM's tap fd still writes after Delete")
	}
	if err := m2.Delete("vm1", s.Slot); err != nil {
		t.Errorf("second Delete: %v", err)
	}
	release()
	if _, err := os.Stat(s.NetnsPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns file after Delete: %v", err)
	}
}

// TestNsmgrVMFaultAtEveryStep: a failure at each step of CreateVM unwinds
// everything: no netns, no host veth, the slot free.
func TestNsmgrVMFaultAtEveryStep(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	var failAt string
	m := newManager(t, w, prefix, "10.20.0.0/16", func(step string) error {
		if step == failAt {
			return errInjected
		}
		return nil
	})
	hh := hostHandle(t, w)
	for _, step := range nsmgr.VMCreateSteps {
		failAt = step
		_, err := m.CreateVM("f", nsmgr.VMConfig{TapOwner: nsmgr.NoTapOwner})
		if !errors.Is(err, errInjected) {
			t.Fatalf("fault at %s: err = %v, want the injected failure", step, err)
		}
		if left := netnsFiles(t, prefix); len(left) != 0 {
			t.Fatalf("fault at %s: netns left %v", step, left)
		}
		if _, err := hh.LinkByName(nsmgr.HostIfaceName(prefix, 0)); err == nil {
			waitLinkGone(t, hh, nsmgr.HostIfaceName(prefix, 0))
		}
		if n := m.SlotsInUse(); n != 0 {
			t.Fatalf("fault at %s: %d slots in use", step, n)
		}
	}
	failAt = ""
	s, err := m.CreateVM("f", nsmgr.VMConfig{TapOwner: nsmgr.NoTapOwner})
	if err != nil {
		t.Fatalf("CreateVM without fault: %v", err)
	}
	cleanupSession(t, w, prefix, "f", s.Slot)
	if err := m.Delete("f", s.Slot); err != nil {
		t.Fatal(err)
	}
}
