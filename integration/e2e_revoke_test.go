package integration

// A revoke cuts a flow on both sides: the remote end and the program in
// the guest both see the connection fail at once (finding 7 of issue 27).

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
)

// revokeServers are two servers of the simulated internet a guest's client
// holds a connection to: an idle one (it accepts and waits) and a download
// (an HTTP/1.0 answer that never ends, 16 KiB every 10 ms). Each records
// when its side of a connection failed.
type revokeServers struct {
	idle, dl netip.AddrPort
	mu       sync.Mutex
	conns    []net.Conn
	ended    map[string]time.Time // "idle" or "dl" -> when the server's side failed or saw EOF
	accepted chan string
	sent     map[net.Conn]int64
}

func startRevokeServers(t *testing.T, e *e2eEnv) *revokeServers {
	t.Helper()
	return startRevokeServersAt(t, e, netip.MustParseAddrPort("198.18.1.11:8083"), netip.MustParseAddrPort("198.18.1.10:8082"))
}

// startRevokeServersAt starts the two servers at the given addresses (the
// idle one's port must be 8083).
func startRevokeServersAt(t *testing.T, e *e2eEnv, idle, dl netip.AddrPort) *revokeServers {
	t.Helper()
	rs := &revokeServers{
		idle: idle, dl: dl,
		ended: map[string]time.Time{}, accepted: make(chan string, 16), sent: map[net.Conn]int64{},
	}
	for kind, at := range map[string]netip.AddrPort{"idle": rs.idle, "dl": rs.dl} {
		l, err := world.ListenTCP(e.w.NetPath, at)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				rs.mu.Lock()
				rs.conns = append(rs.conns, c)
				rs.mu.Unlock()
				rs.accepted <- kind
				go rs.serve(kind, c)
			}
		}()
	}
	return rs
}

func (rs *revokeServers) serve(kind string, c net.Conn) {
	if kind == "idle" {
		_, _ = io.Copy(io.Discard, c) // until the connection ends
	} else {
		buf := make([]byte, 4096)
		if _, err := c.Read(buf); err == nil { // the request
			_, err = c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n\r\n"))
			chunk := make([]byte, 16<<10)
			for err == nil {
				var n int
				n, err = c.Write(chunk)
				rs.mu.Lock()
				rs.sent[c] += int64(n)
				rs.mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	rs.mu.Lock()
	rs.ended[kind] = time.Now()
	rs.mu.Unlock()
}

func (rs *revokeServers) sentTotal() int64 {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var n int64
	for _, v := range rs.sent {
		n += v
	}
	return n
}

// waitAccepted waits until both servers accepted a connection.
func (rs *revokeServers) waitAccepted(t *testing.T) {
	t.Helper()
	got := map[string]bool{}
	deadline := time.After(5 * time.Second)
	for len(got) < 2 {
		select {
		case k := <-rs.accepted:
			got[k] = true
		case <-deadline:
			t.Fatalf("the guest's clients did not connect: %v", got)
		}
	}
}

// closeAll ends every connection from the servers' side (the clients then
// end normally).
func (rs *revokeServers) closeAll() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, c := range rs.conns {
		c.Close()
	}
	rs.conns = nil
	rs.ended = map[string]time.Time{}
	rs.sent = map[net.Conn]int64{}
}

// guestClients starts, inside the session's sandbox, busybox nc holding
// an idle connection (its stdin never sends) and busybox wget downloading,
// and returns a channel that gets each one's name when its exec ends.
func guestClients(e *e2eEnv, name string, rs *revokeServers) <-chan string {
	done := make(chan string, 2)
	for client, script := range map[string]string{
		// nc reads a fifo the shell holds open and never writes: an idle
		// connection, and the shell ends when nc does.
		"nc (idle)":       "f=/tmp/idle.$$; mkfifo $f; exec 3<>$f; nc " + rs.idle.Addr().String() + " 8083 <$f",
		"wget (download)": "wget -q -O /dev/null http://" + rs.dl.String() + "/",
	} {
		go func() {
			e.sh(name, script)
			done <- client
		}()
	}
	return done
}

// TestE2ERevokeResetsBothSides: a guest holds an idle TCP connection (nc)
// and a running download (wget), both from inside its sandbox to servers
// of the simulated internet. `session update --revoke` of both
// destinations ends each client within a second (its socket aborted in the
// session's netns), and each server's side fails too. The control: the
// same with --keep-established leaves both working (the idle connection
// open, the download still flowing 2 s later), and the clients end only
// when the servers close.
func TestE2ERevokeResetsBothSides(t *testing.T) {
	e := newE2E(t)
	e.create("rv", "--allow", "198.18.1.10", "--allow", "198.18.1.11")
	rs := startRevokeServers(t, e)

	revokeCutsBothSides(t, e, "rv", rs, "198.18.1.10", "198.18.1.11")
}

// revokeCutsBothSides runs, in session (whose sandbox reaches a and b
// through rs), the control first: a revoke of both with
// --keep-established leaves both clients connected, the download flowing
// and no server's side ended; then, the two allowed again, the revoke
// without it ends both clients within a second of the update's start, and
// both servers' sides.
func revokeCutsBothSides(t *testing.T, e *e2eEnv, session string, rs *revokeServers, a, b string) {
	t.Helper()
	done := guestClients(e, session, rs)
	rs.waitAccepted(t)
	time.Sleep(300 * time.Millisecond)
	info := e.update(session, "--revoke", a, "--revoke", b, "--keep-established")
	if len(info.Policy.Allow) != 0 {
		t.Fatalf("after the revoke: allow %v, want none", info.Policy.Allow)
	}
	before := rs.sentTotal()
	select {
	case c := <-done:
		t.Errorf("--keep-established: %s ended after the revoke, want it still connected", c)
	case <-time.After(2 * time.Second):
	}
	if after := rs.sentTotal(); after <= before {
		t.Errorf("--keep-established: the download stalled after the revoke (%d bytes before, %d 2 s later)", before, after)
	}
	rs.mu.Lock()
	ended := len(rs.ended)
	rs.mu.Unlock()
	if ended != 0 {
		t.Errorf("--keep-established: a server's side ended: %v", rs.ended)
	}
	rs.closeAll()
	for range 2 {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the control's clients did not end when the servers closed")
		}
	}

	// The revoke without --keep-established.
	e.update(session, "--allow", a, "--allow", b)
	done = guestClients(e, session, rs)
	rs.waitAccepted(t)
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	e.update(session, "--revoke", a, "--revoke", b)
	// Measured from before the update began: the CLI's round trip is in it.
	within := time.After(time.Until(start.Add(time.Second)))
	for range 2 {
		select {
		case c := <-done:
			t.Logf("%s ended %v after the update began", c, time.Since(start).Round(time.Millisecond))
		case <-within:
			t.Fatalf("a client in the guest still waits %v after the revoke began, want each ended within 1 s", time.Since(start).Round(time.Millisecond))
		}
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		rs.mu.Lock()
		n := len(rs.ended)
		rs.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rs.mu.Lock()
	if len(rs.ended) != 2 {
		t.Errorf("the servers' sides: %v ended, want both within 1 s", rs.ended)
	}
	rs.mu.Unlock()
	rs.closeAll()
}

// TestE2ERevokeAbortsSocketsInTheNetns: the same cut seen by sockets of
// the session's netns that a test holds (no sandbox: a network-only
// session, as a runtime that joins the netns has): a blocked read fails
// with ECONNABORTED within a second of the revoke, a connection to a
// destination the update keeps stays open (the control).
func TestE2ERevokeAbortsSocketsInTheNetns(t *testing.T) {
	e := newE2E(t)
	e.createNetOnly("rn", "--allow", "198.18.1.10", "--allow", "198.18.1.11")
	ns := e.nsPath("rn")
	cut := e2eDial(t, ns, "198.18.1.11:7")
	kept := e2eDial(t, ns, "198.18.1.10:7")
	e2eEcho(t, "before the revoke (cut)", cut)
	e2eEcho(t, "before the revoke (kept)", kept)
	readErr := make(chan error, 1)
	go func() {
		cut.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := cut.Read(make([]byte, 1))
		readErr <- err
	}()
	start := time.Now()
	e.update("rn", "--revoke", "198.18.1.11")
	select {
	case err := <-readErr:
		took := time.Since(start)
		if !errors.Is(err, syscall.ECONNABORTED) || took > time.Second {
			t.Errorf("the idle reader: %v after %v, want ECONNABORTED within 1 s", err, took)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the idle reader still waits 2 s after the revoke")
	}
	e2eEcho(t, "after the revoke, the kept destination", kept)
}
