package integration

// A revoke of --inbound-from-host must take the port away, established
// connections included, as every other revoke does (README, "What
// revocation guarantees"): the output hook accepts "ct state established"
// before it looks at inbound_host, so a connection the host opened while
// the port was named went on after the revoke, for as long as it lived.

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
)

// e2eEchoRound writes msg on c and reads it back within timeout.
func e2eEchoRound(c net.Conn, msg string, timeout time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return err
}

func TestE2EInboundRevokeCutsEstablished(t *testing.T) {
	e := newE2E(t)
	in := e.createNetOnly("in", "--allow", "api.e2e.test", "--inbound-from-host", "8080/tcp", "--inbound-from-host", "9090/tcp")
	for _, port := range []string{"8080", "9090"} {
		e2eServeTCPEcho(t, e.nsPath("in"), netip.MustParseAddrPort(in.GuestIP+":"+port))
	}
	dial := func(port string) net.Conn {
		t.Helper()
		c, err := world.DialTCP(e.w.HostPath, netip.MustParseAddrPort(in.GuestIP+":"+port), world.ReachTimeout)
		if err != nil {
			t.Fatalf("host: connect to %s:%s (named by --inbound-from-host): %v", in.GuestIP, port, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	revoked, kept := dial("8080"), dial("9090")
	// Positive control: both connections carry data before the revoke.
	for _, c := range []net.Conn{revoked, kept} {
		if err := e2eEchoRound(c, "before\n", world.ReachTimeout); err != nil {
			t.Fatalf("host: echo over %s before the revoke: %v", c.RemoteAddr(), err)
		}
	}
	e.update("in", "--revoke-inbound-from-host", "8080/tcp")
	// The attack: go on using the connection the revoke took away.
	if err := e2eEchoRound(revoked, "after\n", time.Second); err == nil {
		t.Errorf("host: the connection to %s:8080 still carries data after --revoke-inbound-from-host 8080/tcp", in.GuestIP)
	}
	// Control: the port still named keeps its connection, and a new one.
	if err := e2eEchoRound(kept, "after\n", world.ReachTimeout); err != nil {
		t.Errorf("host: echo over the kept connection to :9090 after revoking 8080: %v", err)
	}
	e2eExpect(t, e2eTCP(e.w.HostPath, in.GuestIP+":9090", e2eReach), e2eTCP(e.w.HostPath, in.GuestIP+":8080", e2eDropped))
}
