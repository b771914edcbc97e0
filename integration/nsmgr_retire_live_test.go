package integration

import (
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Delete of an attached session returns with the host side down and the
// pair still being deleted in the background: a datagram the guest sends
// at once, while the old veth provably still exists, reaches nothing (a
// server on the gateway received one just before). Until the kernel has
// removed the veth, its slot (and so its host interface name) is not handed out again,
// an Attach into the same netns under the same interface name waits for it
// instead of meeting it, and Close waits for every delete in flight.
func TestNsmgrAttachDeleteRetires(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	m := newManager(t, w, prefix, "10.20.0.0/28", nil) // three session slots: reuse comes quickly
	host := hostHandle(t, w)
	path := runtimeNetns(t, w, "r")

	old, err := m.Attach("c1", nsmgr.Attachment{NetnsPath: path, IfName: "eth0"})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	cleanupSession(t, w, prefix, "c1", old.Slot)
	pending := 0 // rounds whose probe and Attach came while the old veth still existed
	for round := 0; round < 6; round++ {
		gw := netip.AddrPortFrom(old.Gateway, 7207)
		srv, err := world.ListenUDP(w.HostPath, gw)
		if err != nil {
			t.Fatal(err)
		}
		var conn net.Conn
		if err := world.DoPath(path, func() (err error) { conn, err = net.Dial("udp4", gw.String()); return err }); err != nil {
			t.Fatal(err)
		}
		// Positive control: the guest reaches its gateway (a ping, which
		// also resolves its address) and a server on it.
		if err := world.Ping(path, old.Gateway, 2*time.Second); err != nil {
			t.Fatalf("round %d: ping the gateway before Delete: %v", round, err)
		}
		if got := udpRound(conn, srv, "before"); got != "before" {
			t.Fatalf("round %d: the guest's datagram did not reach %s before Delete (%q)", round, gw, got)
		}
		if err := m.Delete("c1", old.Slot); err != nil {
			t.Fatalf("round %d: Delete: %v", round, err)
		}
		// The guest sends at once; the old veth is checked after the send.
		conn.Write([]byte("after"))
		if l, err := host.LinkByName(old.HostIface); err == nil {
			pending++
			if isUp(l) {
				t.Fatalf("round %d: host veth %s still up after Delete", round, old.HostIface)
			}
		}
		conn.Close()
		// At once, same name, same netns, same interface name.
		s, err := m.Attach("c1", nsmgr.Attachment{NetnsPath: path, IfName: "eth0"})
		if err != nil {
			t.Fatalf("round %d: Attach right after Delete: %v", round, err)
		}
		cleanupSession(t, w, prefix, "c1", s.Slot)
		if _, err := host.LinkByName(old.HostIface); err == nil && s.Slot == old.Slot {
			t.Fatalf("round %d: slot %d handed out again while its old host veth exists", round, s.Slot)
		}
		if l, err := host.LinkByName(s.HostIface); err != nil || !isUp(l) {
			t.Fatalf("round %d: new host veth %s: %v", round, s.HostIface, err)
		}
		_, h, release := sessionHandle(t, path)
		if names := linkNames(t, h); !slices.Equal(names, []string{"lo", "eth0"}) {
			t.Errorf("round %d: links in the runtime's netns %v, want lo and eth0", round, names)
		}
		l, err := h.LinkByName("eth0")
		if err != nil || !slices.Equal(v4Addrs(t, h, l), []string{s.Guest.String() + "/30"}) {
			t.Errorf("round %d: eth0 of the new session: %v", round, err)
		}
		release()
		// What the guest sent after Delete never arrived.
		srv.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, _, err := srv.ReadFrom(make([]byte, 16)); err == nil {
			t.Errorf("round %d: a datagram the guest sent after Delete reached the host (%d bytes)", round, n)
		}
		srv.Close()
		old = s
	}
	if pending == 0 {
		t.Fatal("no round's probe and Attach came while the old veth was still being deleted: the test proved nothing about the window")
	}
	t.Logf("%d of 6 rounds attached while the old veth was still being deleted", pending)

	// Close waits for the deletes in flight: nothing of the session is
	// left once it returns.
	b := newManager(t, w, prefix, "10.20.0.0/28", nil)
	if _, err := b.Recover(); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete("c1", old.Slot); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := host.LinkByName(old.HostIface); err == nil {
		t.Errorf("host veth %s still there after Close returned (%s)", old.HostIface, time.Since(start))
	}
	_, h, release := sessionHandle(t, path)
	if names := linkNames(t, h); !slices.Equal(names, []string{"lo"}) {
		t.Errorf("links left in the runtime's netns after Close: %v", names)
	}
	release()
}

// udpRound sends msg on conn and returns what srv received within a
// second ("" for nothing).
func udpRound(conn net.Conn, srv net.PacketConn, msg string) string {
	conn.Write([]byte(msg))
	srv.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 64)
	n, _, err := srv.ReadFrom(buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}
