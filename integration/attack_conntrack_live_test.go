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
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Attacks on conntrack state shared by every session in the daemon's netns.

// TestAttackSpoofedEstablished: session B, with a raw
// socket, forges a datagram carrying session A's address and A's live
// flow's 5-tuple. The firewall must drop it before any conntrack-based
// accept: it must not be forwarded along A's flow, so A's socket never
// sees B's marker echoed back. Controls: A's flow echoes, before and after;
// B's crafted datagram with its own source to a destination B may reach is
// echoed (the crafting is sound).
func TestAttackSpoofedEstablished(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	dst := netip.AddrPortFrom(w.Web[0], 7)
	a := atkSession(t, e, "a", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(w.Web[0])})
	b := atkSession(t, e, "b", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(w.Web[1])})

	ua := atkDialUDP(t, a.NetnsPath, dst)
	if err := atkEcho(ua, world.ReachTimeout); err != nil {
		t.Fatalf("control: A's udp flow to %s: %v", dst, err)
	}
	aSrc := netip.AddrPortFrom(a.Guest, atkLocalPort(ua))

	// Control: B's own crafted datagram to its allowed destination comes back.
	lb := atkListenUDP(t, b.NetnsPath, netip.AddrPortFrom(b.Guest, 0))
	own := atkMarker(w, "own")
	atkSendRaw(t, b.NetnsPath, world.UDPPacket(lb.LocalAddr().(*net.UDPAddr).AddrPort(), netip.AddrPortFrom(w.Web[1], 7), own))
	if ok, err := atkSawMarker(lb, own, world.ReachTimeout); !ok {
		t.Fatalf("control: B's crafted datagram with its own source to %s:7 was not echoed: %v", w.Web[1], err)
	}

	// The attack: A's 5-tuple from B's veth.
	forged := atkMarker(w, "forged")
	atkSendRaw(t, b.NetnsPath, world.UDPPacket(aSrc, dst, forged))
	if ok, _ := atkSawMarker(ua, forged, time.Second); ok {
		t.Errorf("B's datagram forged with A's flow %s -> %s was forwarded along A's conntrack entry: A's socket received B's payload echoed", aSrc, dst)
	}
	if err := atkEcho(ua, world.ReachTimeout); err != nil {
		t.Errorf("A's own flow after the forgery: %v", err)
	}
}

// TestAttackRelatedKillsHostSocket (the host socket stands
// for the DNS proxy's upstream sockets): session B sends an ICMP port
// unreachable to the host's uplink address quoting a flow the host has with
// the internet. It must not be RELATED to the host's flow: the host socket
// keeps working. Control: the same error from the simulated internet (where
// it could come from a real router) kills a second host socket.
func TestAttackRelatedKillsHostSocket(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	dst := netip.AddrPortFrom(w.Web[0], 7)
	b := atkSession(t, e, "b", netpolicy.ModeAllowlist, nil)

	h1 := atkDialUDP(t, w.HostPath, dst)
	h2 := atkDialUDP(t, w.HostPath, dst)
	if err := atkEcho(h1, world.ReachTimeout); err != nil {
		t.Fatalf("control: host socket 1: %v", err)
	}
	if err := atkEcho(h2, world.ReachTimeout); err != nil {
		t.Fatalf("control: host socket 2: %v", err)
	}
	atkRelatedKill(t, w, b, dst, h1, atkLocalPort(h1), h2, atkLocalPort(h2), "the host's flow")
}

// atkRelatedKill sends, from session b, a port unreachable to the uplink
// address quoting the flow uplink:victimPort -> dst, and requires the victim
// socket to keep working; then, as the control, sends the same error from
// the simulated internet quoting uplink:controlPort -> dst and requires it
// to kill the control socket (proving the packet is well formed).
func atkRelatedKill(t *testing.T, w *world.World, b nsmgr.Session, dst netip.AddrPort,
	victim net.Conn, victimPort uint16, control net.Conn, controlPort uint16, what string) {
	t.Helper()
	atkSendRaw(t, b.NetnsPath, world.ICMPPortUnreachable(b.Guest, w.Uplink,
		netip.AddrPortFrom(w.Uplink, victimPort), dst, atkMarker(w, "victim")))
	time.Sleep(300 * time.Millisecond)
	if err := atkEcho(victim, world.ReachTimeout); err != nil {
		t.Errorf("a port unreachable forged by session B quoting %s %s:%d -> %s was accepted as RELATED and killed its socket: %v", what, w.Uplink, victimPort, dst, err)
	}
	atkSendRaw(t, w.NetPath, world.ICMPPortUnreachable(dst.Addr(), w.Uplink,
		netip.AddrPortFrom(w.Uplink, controlPort), dst, atkMarker(w, "control")))
	time.Sleep(300 * time.Millisecond)
	if err := atkEcho(control, time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("control: the crafted port unreachable from %s did not kill the control socket (want ECONNREFUSED, got %v): the packet is not well formed, the test proves nothing", dst.Addr(), err)
	}
}

// TestAttackRelatedKillsOtherSession: session B sends a
// port unreachable to the uplink address quoting the reply-direction tuple
// of session A's masqueraded flow. It must not be RELATED to A's flow (and
// so not de-NATed and delivered to A): A's socket keeps working. Control:
// the same error from the internet side kills A's second socket.
func TestAttackRelatedKillsOtherSession(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	dst := netip.AddrPortFrom(w.Web[0], 7)
	a := atkSession(t, e, "a", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(w.Web[0])})
	b := atkSession(t, e, "b", netpolicy.ModeAllowlist, nil)

	a1 := atkDialUDP(t, a.NetnsPath, dst)
	a2 := atkDialUDP(t, a.NetnsPath, dst)
	if err := atkEcho(a1, world.ReachTimeout); err != nil {
		t.Fatalf("control: A's socket 1: %v", err)
	}
	if err := atkEcho(a2, world.ReachTimeout); err != nil {
		t.Fatalf("control: A's socket 2: %v", err)
	}
	m1 := atkMasqPort(t, w, netip.AddrPortFrom(a.Guest, atkLocalPort(a1)), dst)
	m2 := atkMasqPort(t, w, netip.AddrPortFrom(a.Guest, atkLocalPort(a2)), dst)
	// Related to A's flow, the error would be de-NATed and delivered to A.
	atkRelatedKill(t, w, b, dst, a1, m1, a2, m2, "session A's masqueraded flow")
}

// TestAttackRelatedReachesMetadata (the guard): the host
// has a flow with the metadata address; session B sends an ICMP error to
// 169.254.169.254 quoting that flow's reply. RELATED must never bypass the
// special-purpose guard: nothing carrying B's marker reaches the simulated
// internet. Control: B's crafted echo request to its allowed destination
// is seen by the same listener.
func TestAttackRelatedReachesMetadata(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	b := atkSession(t, e, "b", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(w.Web[0])})
	meta := netip.AddrPortFrom(w.Metadata, 7)

	hm := atkDialUDP(t, w.HostPath, meta)
	if err := atkEcho(hm, world.ReachTimeout); err != nil {
		t.Fatalf("control: the host's own flow to %s: %v", meta, err)
	}
	hostSrc := netip.AddrPortFrom(w.Uplink, atkLocalPort(hm))

	watch, err := world.WatchICMP(w.NetPath)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()

	ctl := atkMarker(w, "ping")
	atkSendRaw(t, b.NetnsPath, world.ICMPEchoPacket(b.Guest, w.Web[0], 0x4154, 1, ctl))
	if _, ok := watch.Wait(ctl, world.ReachTimeout); !ok {
		t.Fatalf("control: B's crafted echo request to %s never reached the simulated internet", w.Web[0])
	}

	marker := atkMarker(w, "meta")
	atkSendRaw(t, b.NetnsPath, world.ICMPPortUnreachable(b.Guest, w.Metadata, meta, hostSrc, marker))
	if from, ok := watch.Wait(marker, time.Second); ok {
		t.Errorf("an ICMP error from session B quoting the host's flow %s -> %s was RELATED and forwarded to %s (arrived from %s, un-masqueraded)", hostSrc, meta, w.Metadata, from)
	}
}

// TestAttackConntrackInherited: after a session is
// removed, no conntrack entry of its guest address may remain; and a new
// session that gets the same address must not inherit the old flows (a
// datagram from the old peer to the old masqueraded port must not reach
// it). Controls: the entries exist before removal, and the same crafted
// datagram reaches the old session while it lives.
func TestAttackConntrackInherited(t *testing.T) {
	e := newNPEnv(t, time.Second)
	w := e.w
	dst := netip.AddrPortFrom(w.Web[0], 7)
	name := "a"
	a, err := e.mgr.Create(name, true)
	if err != nil {
		t.Fatal(err)
	}
	ra := nft.SessionRules{Name: name, HostIface: a.HostIface, Guest: a.Guest, Egress: netpolicy.ModeAllowlist,
		Static: []netpolicy.Target{staticHost(w.Web[0])}}
	removed := false
	remove := func() {
		if removed {
			return
		}
		removed = true
		if err := e.fw.RemoveSession(ra); err != nil {
			t.Errorf("remove session %s: %v", name, err)
		}
		if err := e.mgr.Delete(name, a.Slot); err != nil {
			t.Errorf("delete session %s: %v", name, err)
		}
	}
	t.Cleanup(remove)
	if err := e.fw.AddSession(ra); err != nil {
		t.Fatal(err)
	}
	atkReady(t, a.NetnsPath, "eth0", a.Guest, a.Gateway)

	ua := atkDialUDP(t, a.NetnsPath, dst)
	if err := atkEcho(ua, world.ReachTimeout); err != nil {
		t.Fatalf("control: A's udp flow: %v", err)
	}
	tc, err := world.DialTCP(a.NetnsPath, dst, world.ReachTimeout)
	if err != nil {
		t.Fatalf("control: A's tcp connection: %v", err)
	}
	defer tc.Close()
	if err := atkEcho(tc, world.ReachTimeout); err != nil {
		t.Fatalf("control: A's tcp echo: %v", err)
	}
	aPort := atkLocalPort(ua)
	masq := atkMasqPort(t, w, netip.AddrPortFrom(a.Guest, aPort), dst)

	// Control: the peer's datagram to the masqueraded port reaches A.
	push := func(tag string) []byte {
		m := atkMarker(w, tag)
		atkSendRaw(t, w.NetPath, world.UDPPacket(dst, netip.AddrPortFrom(w.Uplink, masq), m))
		return m
	}
	if ok, err := atkSawMarker(ua, push("live"), world.ReachTimeout); !ok {
		t.Fatalf("control: a datagram from %s to %s:%d did not reach live session A: %v", dst, w.Uplink, masq, err)
	}
	ua.Close()
	tc.Close()
	time.Sleep(300 * time.Millisecond) // the TCP close handshake ends
	if left := atkFlowsOf(t, w, a.Guest); len(left) == 0 {
		t.Fatalf("control: no conntrack entry names %s before removal", a.Guest)
	}

	remove()
	// The entries go in the background (a walk of the conntrack table costs
	// a pass over every bucket of the host); until then the address is
	// quarantined: the firewall says it is not clean, and the daemon's
	// allocator (nsmgr.Config.GuestClean) does not hand it out.
	if err := e.fw.WaitFlows(5 * time.Second); err != nil {
		t.Fatalf("the conntrack flush of %s: %v", a.Guest, err)
	}
	if !e.fw.FlowsFlushed(a.Guest) {
		t.Errorf("FlowsFlushed(%s) is false once the flush is done", a.Guest)
	}
	if left := atkFlowsOf(t, w, a.Guest); len(left) > 0 {
		t.Errorf("after removing session %s, %d conntrack entries of its guest %s remain:\n%s", name, len(left), a.Guest, atkJoinLines(left))
	}

	// Behavioural form: a fresh Manager (a restarted daemon) hands out the
	// lowest free slot, which is A's once its veth is gone.
	if !atkWaitLinkGone(t, w, a.HostIface, 10*time.Second) {
		t.Logf("A's host veth %s still exists after 10s: skipping the reuse part", a.HostIface)
		return
	}
	mgr2, err := nsmgr.New(nsmgr.Config{Prefix: e.prefix, Pool: e.pool, HostNS: w.Host, EtcNetnsDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer mgr2.Close()
	name2 := "n"
	n, err := mgr2.Create(name2, true)
	if err != nil {
		t.Fatal(err)
	}
	rn := nft.SessionRules{Name: name2, HostIface: n.HostIface, Guest: n.Guest, Egress: netpolicy.ModeAllowlist}
	t.Cleanup(func() {
		if err := e.fw.RemoveSession(rn); err != nil {
			t.Errorf("remove session %s: %v", name2, err)
		}
		if err := mgr2.Delete(name2, n.Slot); err != nil {
			t.Errorf("delete session %s: %v", name2, err)
		}
	})
	if err := e.fw.AddSession(rn); err != nil {
		t.Fatal(err)
	}
	atkReady(t, n.NetnsPath, "eth0", n.Guest, n.Gateway)
	if n.Guest != a.Guest {
		t.Logf("the new session got %s, not A's %s: skipping the reuse part", n.Guest, a.Guest)
		return
	}
	ln := atkListenUDP(t, n.NetnsPath, netip.AddrPortFrom(netip.IPv4Unspecified(), aPort))
	if ok, _ := atkSawMarker(ln, push("reused"), time.Second); ok {
		t.Errorf("new session %s on A's address %s received a datagram from %s to the old masqueraded port %d: it inherited A's conntrack entry", name2, n.Guest, dst, masq)
	}
}

// atkWaitLinkGone waits until the simulated host has no link name.
func atkWaitLinkGone(t *testing.T, w *world.World, name string, within time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if !atkLinkExists(t, w, name) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAttackRelatedBackToLabPeer: the related-error rules still let a lab
// target answer its peer's probe with an ICMP error (a UDP scan of a lab
// target reads "closed" from its port unreachable), while the same target's
// error can reach nobody else (TestAttackRelatedKillsOtherSession and its
// siblings). A sends UDP to a closed port of its lab target B; B's kernel
// answers port unreachable, and A's socket must see ECONNREFUSED.
func TestAttackRelatedBackToLabPeer(t *testing.T) {
	e := newNPEnv(t, time.Second)
	b := atkSession(t, e, "lab", netpolicy.ModeAllowlist, nil)
	s, _ := e.session(t, "peer", netpolicy.ModeAllowlist, nil, b.Guest)
	atkReady(t, s.NetnsPath, "eth0", s.Guest, s.Gateway)
	c := atkDialUDP(t, s.NetnsPath, netip.AddrPortFrom(b.Guest, 9))
	var err error
	for i := 0; i < 5 && !errors.Is(err, syscall.ECONNREFUSED); i++ {
		err = atkEcho(c, 500*time.Millisecond)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("peer's UDP to a closed port of its lab target %s: %v, want ECONNREFUSED (the target's port unreachable dropped)", b.Guest, err)
	}
}
