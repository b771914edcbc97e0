package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// DEL returns before the kernel has deleted the veth (that is done in the
// background), once nothing can pass: a guest that sends from its netns
// all through DEL, to a server that received it just before, reaches
// nothing once its interface lost the host side (that it sends while the
// old interface still exists, down, is shown deterministically by
// TestNsmgrAttachDeleteRetires, in process; here the kernel often deletes
// the veth before a poll sees it down); inspect shows the session
// gone at once; an ADD of the same container into the same netns right
// after DEL works; a SIGTERM waits for the deletes in flight, and after a
// kill -9 with deletes in flight the next start leaves nothing behind.
func TestE2ECNIDelRetires(t *testing.T) {
	pluginDir := e2eCNIPlugin(t)
	e := newE2E(t)
	rtm := newCNIRuntime(t, pluginDir, cniConflist("enfdel", e.d.Socket, `{"egress": "allowlist", "allow": ["api.e2e.test"]}`))
	allowed := netip.MustParseAddrPort("198.18.1.10:7")
	sink := netip.MustParseAddrPort("198.18.1.10:7107") // a UDP server of this test's
	host := hostHandle(t, e.w)

	ns := runtimeNetns(t, e.w, "d")
	rt := &libcni.RuntimeConf{ContainerID: "ctr-d-" + e.w.ID, NetNS: ns, IfName: "eth0"}
	if _, err := rtm.add(rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	for round := 1; round <= 3; round++ {
		info, ok := e.sessionOf(rt.ContainerID)
		if !ok {
			t.Fatalf("round %d: no session of container %s", round, rt.ContainerID)
		}
		// Positive control: the resolver answers (which opens the allowed
		// name's address) and the allowed server receives the guest's
		// datagrams.
		if _, err := world.Lookup(ns, e2eAnycastDNS, "api.e2e.test.", dns.TypeA, false, 5*time.Second); err != nil {
			t.Fatalf("round %d: lookup before DEL: %v", round, err)
		}
		f := startGuestFlood(t, e.w, ns, sink)
		if !f.arrived(time.Now(), world.ReachTimeout) {
			f.stop()
			t.Fatalf("round %d: no datagram of the guest reached the allowed %s before DEL", round, sink)
		}
		if err := rtm.del(rt); err != nil {
			f.stop()
			t.Fatalf("round %d: DEL: %v", round, err)
		}
		// Gone at once for the API.
		if _, ok := e.sessionOf(rt.ContainerID); ok {
			t.Errorf("round %d: the daemon lists the session after DEL", round)
		}
		ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
		_, err := e.d.Client().Inspect(ctx, info.Name)
		cancel()
		if !errors.Is(err, api.ErrNotFound) {
			t.Errorf("round %d: inspect %s after DEL = %v, want not found", round, info.Name, err)
		}
		// The guest kept sending through DEL: nothing sent once its
		// interface lost the host side reached the server, and some of it
		// left while the old interface still existed.
		w := f.stop()
		if w.down.IsZero() {
			t.Fatalf("round %d: the guest's eth0 never lost its host side", round)
		}
		if w.lastArrivedSent.After(w.down) {
			t.Errorf("round %d: a datagram sent %s after the host side went down reached the server", round, w.lastArrivedSent.Sub(w.down))
		}
		seenDown := time.Duration(0)
		if !w.lastSeenDown.IsZero() {
			seenDown = w.lastSeenDown.Sub(w.down)
		}
		t.Logf("round %d: %d datagrams sent while the old eth0 was seen down (for %s); %d arrived in all",
			round, w.sentBetween, seenDown, w.arrivedTotal)
		if _, err := world.Lookup(ns, e2eAnycastDNS, "api.e2e.test.", dns.TypeA, false, 300*time.Millisecond); err == nil {
			t.Errorf("round %d: the resolver answers the guest after DEL", round)
		}
		// DEL again: success, nothing to do.
		if err := rtm.del(rt); err != nil {
			t.Errorf("round %d: second DEL: %v", round, err)
		}

		// The same container into the same netns, at once: a working
		// network, never the old interface.
		res, err := rtm.add(rt)
		if err != nil {
			t.Fatalf("round %d: ADD right after DEL: %v", round, err)
		}
		again, _ := e.sessionOf(rt.ContainerID)
		if again.HostVeth == info.HostVeth {
			t.Errorf("round %d: the new session got host veth %s, the old one's", round, again.HostVeth)
		}
		if len(res.IPs) != 1 || res.IPs[0].Address.IP.String() != again.GuestIP {
			t.Errorf("round %d: ADD result %s, session %+v", round, mustJSON(res), again)
		}
		if _, err := world.Lookup(ns, e2eAnycastDNS, "api.e2e.test.", dns.TypeA, false, 5*time.Second); err != nil {
			t.Errorf("round %d: lookup after the re-ADD: %v", round, err)
		} else if err := world.TCPEcho(ns, allowed, world.ReachTimeout); err != nil {
			t.Errorf("round %d: allowed %s unreachable after the re-ADD: %v", round, allowed, err)
		}
		if err := rtm.check(rt); err != nil {
			t.Errorf("round %d: CHECK after the re-ADD: %v", round, err)
		}
	}
	// DEL deletes only its own attachment's session: a session another
	// caller made under the name the attachment would have is left alone
	// (one request: the daemon checks and deletes as one operation).
	nsY := runtimeNetns(t, e.w, "y")
	rtY := &libcni.RuntimeConf{ContainerID: "ctr-y-" + e.w.ID, NetNS: nsY, IfName: "eth0"}
	if _, err := rtm.add(rtY); err != nil {
		t.Fatalf("ADD y: %v", err)
	}
	y, _ := e.sessionOf(rtY.ContainerID)
	if err := rtm.del(rtY); err != nil {
		t.Fatalf("DEL y: %v", err)
	}
	e.createNetOnly(y.Name, "--allow", "api.e2e.test")
	if err := rtm.del(rtY); err != nil {
		t.Errorf("DEL y with its name taken by another session: %v", err)
	}
	if got := e.inspect(y.Name); got.ContainerID != "" || got.Name != y.Name {
		t.Errorf("DEL y removed or changed the session another caller made under its name: %+v", got)
	}
	e.cli("session", "rm", y.Name)

	// SIGTERM right after DELs: the daemon exits once the veths are gone.
	var doomed []string
	addSome := func(tag string, n int) []*libcni.RuntimeConf {
		var rts []*libcni.RuntimeConf
		for i := 0; i < n; i++ {
			r := &libcni.RuntimeConf{ContainerID: "ctr-" + tag + string(rune('a'+i)) + "-" + e.w.ID, NetNS: runtimeNetns(t, e.w, tag+string(rune('a'+i))), IfName: "eth0"}
			if _, err := rtm.add(r); err != nil {
				t.Fatalf("ADD %s: %v", r.ContainerID, err)
			}
			rts = append(rts, r)
		}
		return rts
	}
	delAll := func(rts []*libcni.RuntimeConf) {
		doomed = doomed[:0]
		for _, r := range rts {
			info, _ := e.sessionOf(r.ContainerID)
			doomed = append(doomed, info.HostVeth)
			if err := rtm.del(r); err != nil {
				t.Fatalf("DEL %s: %v", r.ContainerID, err)
			}
		}
	}
	delAll(append(addSome("s", 3), rt))
	if err := e.d.Stop(); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	for _, name := range doomed {
		if _, err := host.LinkByName(name); err == nil {
			t.Errorf("host veth %s still there after the daemon exited on SIGTERM", name)
		}
	}
	e.start()

	// kill -9 right after DELs: whatever delete had not run yet leaves a
	// veth down; the next start reaps it.
	delAll(addSome("k", 4))
	if err := e.d.Kill(); err != nil {
		t.Fatalf("kill -9: %v", err)
	}
	var left []string
	for _, name := range doomed {
		if _, err := host.LinkByName(name); err == nil {
			left = append(left, name)
		}
	}
	t.Logf("after kill -9: %d of %d veths still there (%v)", len(left), len(doomed), left)
	e.start()
	e.expectObjects(t, "after a restart following kill -9 with deletes in flight", e2eObjects{
		Links: []string{e.dnsIface()}, Table: true,
	})
	links, err := host.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if slices.Contains(doomed, l.Attrs().Name) {
			t.Errorf("host veth %s left after the restart", l.Attrs().Name)
		}
	}
}

// guestFlood sends stamped UDP datagrams from a netns to a server of its
// own in the simulated internet as fast as it can, and watches the
// netns's eth0: when it loses its carrier (the host side of its veth went
// down) and when it is gone.
type guestFlood struct {
	t       *testing.T
	conn    net.Conn
	srv     net.PacketConn
	h       *netlink.Handle
	release func()
	quit    chan struct{}
	done    sync.WaitGroup

	mu           sync.Mutex
	sends        []time.Time // send times of the datagrams, by sequence number
	arrivals     []int       // sequence numbers the server received
	down, gone   time.Time   // first seen without carrier; first seen gone
	lastSeenDown time.Time   // last seen there without carrier
}

// floodWindow is what a flood saw.
type floodWindow struct {
	down, gone      time.Time // eth0 first seen without carrier; first seen gone (zero: never)
	lastSeenDown    time.Time // eth0 last seen there without carrier
	lastArrivedSent time.Time // send time of the latest-sent datagram that arrived
	arrivedTotal    int
	sentBetween     int // datagrams sent after down and before lastSeenDown: while eth0 existed, down
}

func startGuestFlood(t *testing.T, w *world.World, nsPath string, dst netip.AddrPort) *guestFlood {
	t.Helper()
	srv, err := world.ListenUDP(w.NetPath, dst)
	if err != nil {
		t.Fatal(err)
	}
	var conn net.Conn
	if err := world.DoPath(nsPath, func() (err error) {
		conn, err = net.Dial("udp4", dst.String())
		return err
	}); err != nil {
		srv.Close()
		t.Fatal(err)
	}
	_, h, release := sessionHandle(t, nsPath)
	f := &guestFlood{t: t, conn: conn, srv: srv, h: h, release: release, quit: make(chan struct{})}
	f.done.Add(3)
	go func() { // the server
		defer f.done.Done()
		buf := make([]byte, 64)
		for {
			n, _, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			if n == 8 {
				f.mu.Lock()
				f.arrivals = append(f.arrivals, int(binary.BigEndian.Uint64(buf[:8])))
				f.mu.Unlock()
			}
		}
	}()
	go func() { // the guest
		defer f.done.Done()
		var b [8]byte
		for seq := 0; ; seq++ {
			select {
			case <-f.quit:
				return
			default:
			}
			binary.BigEndian.PutUint64(b[:], uint64(seq))
			f.mu.Lock()
			f.sends = append(f.sends, time.Now())
			f.mu.Unlock()
			conn.Write(b[:]) // (an error is the kernel refusing to send: fine)
			time.Sleep(50 * time.Microsecond)
		}
	}()
	go func() { // the watcher of eth0
		defer f.done.Done()
		for {
			select {
			case <-f.quit:
				return
			default:
			}
			l, err := h.LinkByName("eth0")
			now := time.Now()
			f.mu.Lock()
			switch {
			case err != nil && f.gone.IsZero():
				f.gone = now
				if f.down.IsZero() {
					f.down = now
				}
			case err == nil && l.Attrs().RawFlags&unix.IFF_LOWER_UP == 0:
				if f.down.IsZero() {
					f.down = now
				}
				f.lastSeenDown = time.Now() // (after the lookup answered)
			}
			f.mu.Unlock()
			time.Sleep(100 * time.Microsecond)
		}
	}()
	return f
}

// arrived waits until a datagram sent after since arrived.
func (f *guestFlood) arrived(since time.Time, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		f.mu.Lock()
		for _, seq := range f.arrivals {
			if f.sends[seq].After(since) {
				f.mu.Unlock()
				return true
			}
		}
		f.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// stop ends the flood once the old eth0 is gone (or after 5 s), lets late
// datagrams arrive, and reports what it saw.
func (f *guestFlood) stop() floodWindow {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		f.mu.Lock()
		gone := !f.gone.IsZero()
		f.mu.Unlock()
		if gone {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // (datagrams in flight)
	close(f.quit)
	f.conn.Close()
	f.srv.Close()
	f.done.Wait()
	f.release()
	w := floodWindow{down: f.down, gone: f.gone, lastSeenDown: f.lastSeenDown, arrivedTotal: len(f.arrivals)}
	for _, seq := range f.arrivals {
		if s := f.sends[seq]; s.After(w.lastArrivedSent) {
			w.lastArrivedSent = s
		}
	}
	if !w.down.IsZero() {
		for _, s := range f.sends {
			if s.After(w.down) && s.Before(w.lastSeenDown) {
				w.sentBetween++
			}
		}
	}
	return w
}
