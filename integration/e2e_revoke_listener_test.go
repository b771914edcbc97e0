package integration

// The revoke's socket abort (nsmgr.AbortTCP, sock_diag SOCK_DESTROY by
// tuple) must abort only the cut connection's own socket. The kernel's
// lookup by tuple falls back to the socket listening on the local port
// when no connection matches, so a cut flow whose socket had already
// ended (its conntrack entry outlives it: 10 s after a reset, 2 min in
// TIME_WAIT) aimed the destroy at the guest's listener on that port. On
// 6.18 that destroy fails with EINVAL: the update failed after applying
// the policy, and the connections after it in the list were not aborted;
// by hand, the same request destroyed a listener on 127.0.0.1.

import (
	"net"
	"net/netip"
	"syscall"
	"testing"

	"github.com/enforcerd/enforcerd/integration/world"
)

func TestE2ERevokeSparesListeners(t *testing.T) {
	e := newE2E(t)
	info := e.createNetOnly("ls", "--allow", "198.18.1.10", "--allow", "198.18.1.11")
	ns := e.nsPath("ls")
	service := netip.MustParseAddrPort(info.GuestIP + ":8080")

	// A connection from the port the service will listen on, to a
	// destination the update revokes, that ends with a reset: its socket
	// is gone, its conntrack entry stays.
	err := world.DoPath(ns, func() error {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(service), Timeout: world.ReachTimeout,
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
				if err != nil {
					return err
				}
				return serr
			}}
		c, err := d.Dial("tcp4", "198.18.1.11:7")
		if err != nil {
			return err
		}
		e2eEcho(t, "from the service's port", c)
		c.(*net.TCPConn).SetLinger(0)
		return c.Close()
	})
	if err != nil {
		t.Fatalf("connect from %s to 198.18.1.11:7: %v", service, err)
	}
	e2eServeTCPEcho(t, ns, service)
	// Positive control: the service answers, and the revoke cuts a live
	// connection to the revoked destination (its socket is aborted).
	if err := world.TCPEcho(ns, service, world.ReachTimeout); err != nil {
		t.Fatalf("the session's service %s before the revoke: %v", service, err)
	}
	live := e2eDial(t, ns, "198.18.1.11:7")
	e2eEcho(t, "before the revoke (live)", live)
	if out, errOut, code := e.run("session", "update", "ls", "--revoke", "198.18.1.11"); code != 0 {
		t.Errorf("session update ls --revoke 198.18.1.11: exit %d %q %q", code, out, errOut)
	}
	if _, err := live.Read(make([]byte, 1)); err == nil {
		t.Errorf("the live connection to 198.18.1.11:7 still reads after the revoke")
	}
	// The attack's effect: the listener of the session's service is gone.
	if err := world.TCPEcho(ns, service, world.ReachTimeout); err != nil {
		t.Errorf("the session's service %s after revoking 198.18.1.11: %v (its listening socket was aborted)", service, err)
	}
}
