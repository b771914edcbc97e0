package integration

import (
	"net/netip"
	"testing"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// dualStackFirewallConfig is the configuration of a dual-stack table in
// w's simulated host, named prefix: the default pool, the pool6 e2ePool6,
// the world's public overrides of both families; tests set the rest.
func dualStackFirewallConfig(t *testing.T, w *world.World, prefix string) nft.FirewallConfig {
	t.Helper()
	pool, pool6 := nsmgr.DefaultPool, netip.MustParsePrefix(e2ePool6)
	guard, err := netpolicy.NewDualStackGuard(pool, pool6, []netip.Prefix{w.PublicOverride, world.World6Prefix})
	if err != nil {
		t.Fatal(err)
	}
	return nft.FirewallConfig{NetNS: w.Host, Prefix: prefix, Pool: pool, DNSAddr: netip.MustParseAddr("10.20.255.254"),
		Guard: guard, Pool6: pool6, DNS6Addr: nsmgr.DNS6Addr(pool6, pool)}
}

// openEnsured opens cfg's table and makes it (Ensure); with cleanup, its
// table is deleted and it is closed when the test ends.
func openEnsured(t *testing.T, cfg nft.FirewallConfig, cleanup bool) *nft.Firewall {
	t.Helper()
	fw, err := nft.OpenFirewall(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if cleanup {
		t.Cleanup(func() {
			if err := fw.DeleteTable(); err != nil {
				t.Errorf("delete table: %v", err)
			}
			fw.Close()
		})
	}
	if err := fw.Ensure(); err != nil {
		t.Fatal(err)
	}
	return fw
}
