package dhcpguest

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

var (
	guestMAC  = net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}
	otherMAC  = net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x56}
	serverMAC = net.HardwareAddr{0x02, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa}
	testLease = Lease{
		MAC: guestMAC, Addr: netip.MustParseAddr("10.20.0.2"), Bits: 30,
		Gateway: netip.MustParseAddr("10.20.0.1"), DNS: netip.MustParseAddr("10.20.255.254"),
		MTU: 1500, LeaseTime: 2 * time.Minute,
	}
)

func discover(t testing.TB, mac net.HardwareAddr) *dhcpv4.DHCPv4 {
	t.Helper()
	d, err := dhcpv4.NewDiscovery(mac)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func request(t testing.TB, mac net.HardwareAddr, addr string, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	m := append([]dhcpv4.Modifier{
		dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithHwAddr(mac),
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.ParseIP(addr))),
	}, mods...)
	r, err := dhcpv4.New(m...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func answer(t *testing.T, src net.HardwareAddr, msg *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, Outcome) {
	t.Helper()
	out, o, err := Answer(ClientFrame(src, msg), testLease, serverMAC)
	if err != nil {
		t.Fatalf("Answer: %v", err)
	}
	if out == nil {
		return nil, o
	}
	if got := net.HardwareAddr(out[0:6]); got.String() != guestMAC.String() {
		t.Errorf("reply to MAC %s, want %s", got, guestMAC)
	}
	if got := net.HardwareAddr(out[6:12]); got.String() != serverMAC.String() {
		t.Errorf("reply from MAC %s, want %s", got, serverMAC)
	}
	reply, err := ParseReply(out)
	if err != nil {
		t.Fatalf("ParseReply: %v", err)
	}
	if reply.TransactionID != msg.TransactionID {
		t.Errorf("xid %v, want the request's %v", reply.TransactionID, msg.TransactionID)
	}
	return reply, o
}

func checkLease(t *testing.T, r *dhcpv4.DHCPv4, typ dhcpv4.MessageType) {
	t.Helper()
	if r.MessageType() != typ {
		t.Fatalf("message type %s, want %s", r.MessageType(), typ)
	}
	checks := []struct{ what, got, want string }{
		{"yiaddr", r.YourIPAddr.String(), "10.20.0.2"},
		{"mask", net.IP(r.SubnetMask()).String(), "255.255.255.252"},
		{"router", ipsString(r.Router()), "10.20.0.1"},
		{"dns", ipsString(r.DNS()), "10.20.255.254"},
		{"server id", r.ServerIdentifier().String(), "10.20.0.1"},
		{"lease", r.IPAddressLeaseTime(0).String(), "2m0s"},
		{"mtu", string(r.Options.Get(dhcpv4.OptionInterfaceMTU)), "\x05\xdc"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.what, c.got, c.want)
		}
	}
}

func ipsString(ips []net.IP) string {
	s := ""
	for i, ip := range ips {
		if i > 0 {
			s += ","
		}
		s += ip.String()
	}
	return s
}

func TestAnswerDiscoverRequest(t *testing.T) {
	r, o := answer(t, guestMAC, discover(t, guestMAC))
	if o != Offered {
		t.Fatalf("outcome %s, want offer", o)
	}
	checkLease(t, r, dhcpv4.MessageTypeOffer)

	r, o = answer(t, guestMAC, request(t, guestMAC, "10.20.0.2", dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP("10.20.0.1")))))
	if o != Acked {
		t.Fatalf("outcome %s, want ack", o)
	}
	checkLease(t, r, dhcpv4.MessageTypeAck)
}

func TestAnswerRenewByClientAddr(t *testing.T) {
	renew, err := dhcpv4.New(dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest), dhcpv4.WithHwAddr(guestMAC), dhcpv4.WithClientIP(net.ParseIP("10.20.0.2")))
	if err != nil {
		t.Fatal(err)
	}
	r, o := answer(t, guestMAC, renew)
	if o != Acked {
		t.Fatalf("renewal: outcome %s, want ack", o)
	}
	checkLease(t, r, dhcpv4.MessageTypeAck)
}

// A request for another address (a guest resumed from another session's
// snapshot, or one that picked its own) is NAK'd; the control above ACKs.
func TestAnswerNakOtherAddress(t *testing.T) {
	for _, addr := range []string{"10.20.0.6", "10.20.0.1", "0.0.0.0"} {
		r, o := answer(t, guestMAC, request(t, guestMAC, addr))
		if o != Nacked || r == nil || r.MessageType() != dhcpv4.MessageTypeNak {
			t.Errorf("request for %s: outcome %s, want a NAK", addr, o)
			continue
		}
		if !r.YourIPAddr.IsUnspecified() || r.Router() != nil {
			t.Errorf("NAK for %s carries a lease: yiaddr %s, router %v", addr, r.YourIPAddr, r.Router())
		}
	}
}

// Another MAC gets nothing: as the frame's source, as the client hardware
// address, or both.
func TestAnswerForeignMAC(t *testing.T) {
	for _, c := range []struct {
		name    string
		src, hw net.HardwareAddr
	}{
		{"both", otherMAC, otherMAC},
		{"frame source", otherMAC, guestMAC},
		{"chaddr", guestMAC, otherMAC},
	} {
		out, o, err := Answer(ClientFrame(c.src, discover(t, c.hw)), testLease, serverMAC)
		if out != nil || o != Foreign || err != nil {
			t.Errorf("%s: reply %d bytes, outcome %s, err %v; want none, foreign", c.name, len(out), o, err)
		}
	}
}

func TestAnswerOtherServerChosen(t *testing.T) {
	out, o, _ := Answer(ClientFrame(guestMAC, request(t, guestMAC, "10.20.0.2", dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.ParseIP("192.0.2.1"))))), testLease, serverMAC)
	if out != nil || o != Other {
		t.Errorf("request to another server: outcome %s, want other-server and no reply", o)
	}
}

func TestAnswerNotDHCP(t *testing.T) {
	good := ClientFrame(guestMAC, discover(t, guestMAC))
	for _, c := range []struct {
		name string
		mut  func([]byte) []byte
	}{
		{"short", func(b []byte) []byte { return b[:30] }},
		{"arp", func(b []byte) []byte { b[12], b[13] = 0x08, 0x06; return b }},
		{"tcp", func(b []byte) []byte { b[14+9] = 6; return b }},
		{"port 68", func(b []byte) []byte { b[14+20+3] = 68; return b }},
		{"fragment", func(b []byte) []byte { b[14+6] = 0x20; return b }},
		{"ip length", func(b []byte) []byte { b[14+2], b[14+3] = 0xff, 0xff; return b }},
		{"udp length", func(b []byte) []byte { b[14+20+4], b[14+20+5] = 0xff, 0xff; return b }},
		{"garbage", func(b []byte) []byte { return append(b[:14+28], 1, 2, 3) }},
	} {
		b := c.mut(append([]byte(nil), good...))
		if out, o, _ := Answer(b, testLease, serverMAC); out != nil || o != Ignored {
			t.Errorf("%s: outcome %s, reply %d bytes; want ignored", c.name, o, len(out))
		}
	}
}

func TestLeaseValidate(t *testing.T) {
	if err := testLease.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := testLease
	bad.Bits = 31
	if err := bad.Validate(); err == nil {
		t.Error("prefix length 31 accepted")
	}
	bad = testLease
	bad.MAC = nil
	if err := bad.Validate(); err == nil {
		t.Error("empty MAC accepted")
	}
}

// FuzzAnswer feeds arbitrary frames to what parses guest packets: it must
// never panic, never answer another MAC, and only ever answer with the
// lease's address or a NAK.
func FuzzAnswer(f *testing.F) {
	f.Add(ClientFrame(guestMAC, discover(f, guestMAC)))
	f.Add(ClientFrame(guestMAC, request(f, guestMAC, "10.20.0.2")))
	f.Add(ClientFrame(guestMAC, request(f, guestMAC, "10.20.0.9")))
	f.Add(ClientFrame(otherMAC, discover(f, otherMAC)))
	f.Fuzz(func(t *testing.T, frame []byte) {
		out, o, _ := Answer(frame, testLease, serverMAC)
		if out == nil {
			return
		}
		if net.HardwareAddr(frame[6:12]).String() != guestMAC.String() {
			t.Fatalf("answered a frame from %s", net.HardwareAddr(frame[6:12]))
		}
		r, err := ParseReply(out)
		if err != nil {
			t.Fatalf("reply does not parse: %v", err)
		}
		switch o {
		case Offered, Acked:
			if r.YourIPAddr.String() != "10.20.0.2" {
				t.Fatalf("%s of %s", o, r.YourIPAddr)
			}
		case Nacked:
			if !r.YourIPAddr.IsUnspecified() {
				t.Fatalf("NAK with yiaddr %s", r.YourIPAddr)
			}
		default:
			t.Fatalf("reply with outcome %s", o)
		}
	})
}
