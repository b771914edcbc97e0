package integration

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
)

// TestE2EDualStackScopeURL: on a dual-stack daemon a session created from
// a scope URL with a bracketed IPv6 host (https://[ADDR]:7/app) reaches
// that address on the URL's port over IPv6, and not the same address on
// another port (whose control, the simulated host, reaches it), nor an
// address the scope does not name.
func TestE2EDualStackScopeURL(t *testing.T) {
	e, _ := newDualStackE2E(t)
	web6 := netip.MustParseAddr("2001:2:0:1::10")
	info := e.createNetOnly("sc6", "--scope", "https://agent@["+web6.String()+"]:7/app?x=1#top")
	if want := "[" + web6.String() + "]:7"; !slices.Contains(info.Policy.Allow, want) {
		t.Errorf("session sc6: policy allow %v, want %s", info.Policy.Allow, want)
	}
	ns := e.nsPath("sc6")
	if err := world.TCPEcho(ns, netip.AddrPortFrom(web6, 7), 3*time.Second); err != nil {
		t.Fatalf("the scope's v6 host on its port: %v", err)
	}
	other := netip.AddrPortFrom(web6, 80)
	c, err := world.DialTCP(e.w.HostPath, other, 2*time.Second)
	if err != nil {
		t.Fatalf("control: the simulated host to %s: %v", other, err)
	}
	c.Close()
	if c, err := world.DialTCP(ns, other, time.Second); err == nil {
		c.Close()
		t.Errorf("the scoped session reached %s, a port its scope URL does not name", other)
	}
	if err := world.TCPEcho(ns, netip.MustParseAddrPort("[2001:2:0:1::11]:7"), time.Second); err == nil {
		t.Errorf("the scoped session reached [2001:2:0:1::11]:7, an address its scope URL does not name")
	}
}
