package integration

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/miekg/dns"
)

// Attacks on what the daemon's netns answers to.

// TestAttackForeignIfaceAnycast: a foreign netns on the
// simulated host (a veth without the firewall's prefix) sends a datagram
// spoofing session A's guest address to the DNS anycast address. Only a
// session's own veth, with that session's address, may reach the anycast
// listener: the foreign datagram must not arrive. Controls: A's own
// datagram to the anycast address arrives; the foreign netns's crafted
// datagram with its own source to its host end's address arrives.
func TestAttackForeignIfaceAnycast(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	a := atkSession(t, e, "a", netpolicy.ModeAllowlist, nil)
	anycast := netip.AddrPortFrom(e.dns, 53)
	lis := atkListenUDP(t, w.HostPath, anycast)
	f := atkNewForeign(t, w, e.pool)

	// Control: the session's own query reaches the listener.
	own := atkMarker(w, "own")
	ua := atkDialUDP(t, a.NetnsPath, anycast)
	if _, err := ua.Write(own); err != nil {
		t.Fatal(err)
	}
	if ok, err := atkSawMarker(lis, own, world.ReachTimeout); !ok {
		t.Fatalf("control: session A's datagram to %s did not arrive: %v", anycast, err)
	}
	// Control: the foreign netns's raw path works.
	lh := atkListenUDP(t, w.HostPath, netip.AddrPortFrom(f.hostAddr, 0))
	raw := atkMarker(w, "raw")
	atkSendRaw(t, f.nsPath, world.UDPPacket(netip.AddrPortFrom(f.addr, 40000), lh.LocalAddr().(*net.UDPAddr).AddrPort(), raw))
	if ok, err := atkSawMarker(lh, raw, world.ReachTimeout); !ok {
		t.Fatalf("control: the foreign netns's crafted datagram to %s did not arrive: %v", lh.LocalAddr(), err)
	}

	forged := atkMarker(w, "forged")
	atkSendRaw(t, f.nsPath, world.UDPPacket(netip.AddrPortFrom(a.Guest, 40001), anycast, forged))
	if ok, _ := atkSawMarker(lis, forged, time.Second); ok {
		t.Errorf("a datagram from foreign interface %s spoofing session A's %s reached the anycast listener %s", f.hostIf, a.Guest, anycast)
	}
}

// TestAttackARPOracle: from session B's netns, ARP
// who-has for addresses of the daemon's netns that are not on B's veth
// (A's gateway, the uplink address, the DNS anycast address) must get no
// reply. Control: who-has for B's own gateway is answered.
func TestAttackARPOracle(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	a := atkSession(t, e, "a", netpolicy.ModeAllowlist, nil)
	b := atkSession(t, e, "b", netpolicy.ModeAllowlist, nil)
	foreign := map[netip.Addr]string{a.Gateway: "session A's gateway", w.Uplink: "the uplink address", e.dns: "the DNS anycast address"}
	targets := []netip.Addr{b.Gateway}
	for ip := range foreign {
		targets = append(targets, ip)
	}
	got, err := world.ARPProbe(b.NetnsPath, "eth0", b.Guest, targets, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got[b.Gateway]; !ok {
		t.Fatalf("control: no ARP reply for B's own gateway %s", b.Gateway)
	}
	for ip, what := range foreign {
		if mac, ok := got[ip]; ok {
			t.Errorf("B's veth answered ARP who-has %s (%s) with %s", ip, what, mac)
		}
	}
}

// TestAttackAllowReopensResolver: a port-less allow
// entry naming a resolver must not open DNS (TCP/UDP 53, 853) to it: the
// proxy is the session's only resolver. Controls: an entry naming the port
// explicitly (198.18.0.53:53/udp) is the operator's choice and answers; the
// port-less entry still reaches the address otherwise (ping, and a TCP and
// UDP port nothing serves is refused, not dropped).
func TestAttackAllowReopensResolver(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	name := "resolver.atk" + w.ID + ".test"
	w.DNS.AddRR(name + ". 300 IN A 198.18.1.10")
	res := w.DNS.Addr().Addr()
	srv := netip.AddrPortFrom(res, 53)
	p := atkSession(t, e, "p", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(res)})
	q := atkSession(t, e, "q", netpolicy.ModeAllowlist, []netpolicy.Target{{Prefix: netip.PrefixFrom(res, 32), Port: 53, Proto: netpolicy.ProtoUDP}})

	m, err := world.Lookup(q.NetnsPath, srv, name, dns.TypeA, false, world.ReachTimeout)
	if err != nil || len(world.AddrsOf(m)) == 0 {
		t.Fatalf("control: explicit %s/udp entry: lookup %s: %v %v", srv, name, m, err)
	}
	expectReach(t, "port-less entry, not DNS", pingProbe(p.NetnsPath, res))
	for _, port := range []uint16{80, 8853} {
		if err := atkRefused(p.NetnsPath, "tcp4", netip.AddrPortFrom(res, port)); err != nil {
			t.Errorf("control: port-less entry, tcp %s:%d: want refused (reached): %v", res, port, err)
		}
		if err := atkRefused(p.NetnsPath, "udp4", netip.AddrPortFrom(res, port)); err != nil {
			t.Errorf("control: port-less entry, udp %s:%d: want refused (reached): %v", res, port, err)
		}
	}

	for _, tcp := range []bool{false, true} {
		_, err := world.Lookup(p.NetnsPath, srv, name, dns.TypeA, tcp, world.BlockTimeout)
		switch {
		case err == nil:
			t.Errorf("port-less entry %s re-opened DNS behind the proxy: lookup over %s answered", res, atkNet(tcp))
		case !world.IsTimeout(err):
			t.Errorf("port-less entry %s, DNS over %s: failed without a timeout (not a proof of a drop): %v", res, atkNet(tcp), err)
		}
	}
	// DNS over TLS (853): nothing serves it, so refused means reached.
	for _, nw := range []string{"tcp4", "udp4"} {
		err := atkRefused(p.NetnsPath, nw, netip.AddrPortFrom(res, 853))
		if err == nil {
			t.Errorf("port-less entry %s opened %s port 853 (refused by the resolver host: reached)", res, nw)
		} else if !world.IsTimeout(err) {
			t.Errorf("port-less entry %s, %s 853: neither refused nor a timeout: %v", res, nw, err)
		}
	}
}

func atkNet(tcp bool) string {
	if tcp {
		return "tcp"
	}
	return "udp"
}

// atkRefused probes dst, where nothing listens, from nsPath: nil when the
// destination refused (the probe reached it), else the error (a timeout
// when it was dropped).
func atkRefused(nsPath, network string, dst netip.AddrPort) error {
	var c net.Conn
	err := world.DoPath(nsPath, func() (err error) {
		c, err = net.DialTimeout(network, dst.String(), world.BlockTimeout)
		return err
	})
	if err == nil {
		defer c.Close()
		c.SetDeadline(time.Now().Add(world.BlockTimeout))
		if _, err = c.Write([]byte("x")); err == nil {
			_, err = c.Read(make([]byte, 16))
		}
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil
	}
	if err == nil {
		return errors.New("answered")
	}
	return err
}
