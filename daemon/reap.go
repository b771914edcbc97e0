package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/vishvananda/netns"

	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Reap is `enforcerd reap` once the program made sure no daemon serves the
// prefix: it removes every object of the prefix (sandboxes, netns, veths,
// the DNS interface, the nftables table, the pool's conntrack entries) and
// the state records, logging each.
func Reap(prefix, stateDir string, pool netip.Prefix, log *slog.Logger) error {
	host, err := netns.Get()
	if err != nil {
		return fmt.Errorf("open own netns: %w", err)
	}
	defer host.Close()
	var errs []error
	// What a `doctor --datapath` killed mid-way left (its own prefix).
	runs, err := ReapDatapathRuns(stateDir, host)
	for _, p := range runs {
		log.Info("removed what a killed doctor --datapath left", "prefix", p)
	}
	errs = append(errs, err)
	boxes, err := container.New(container.Config{
		StateDir: filepath.Join(stateDir, "containers"),
		LayerDir: filepath.Join(stateDir, "layers"),
		Prefix:   prefix,
	})
	if err == nil {
		removed, err := boxes.Reap(nil)
		for _, r := range removed {
			log.Info("removed sandbox", "sandbox", r)
		}
		errs = append(errs, err)
	} else {
		errs = append(errs, err)
	}
	nets, err := nsmgr.New(nsmgr.Config{Prefix: prefix, Pool: pool, HostNS: host})
	if err != nil {
		return err
	}
	defer nets.Close()
	removed, err := nets.Reap(nil)
	for _, r := range removed {
		log.Info("removed network object", "object", r)
	}
	errs = append(errs, err, nets.RemoveDNSInterface())
	guard, err := netpolicy.NewGuard(pool, nil)
	if err != nil {
		return err
	}
	fw, err := netpolicy.OpenFirewall(netpolicy.FirewallConfig{NetNS: host, Prefix: prefix, Pool: pool, DNSAddr: nets.DNSAddr(), Guard: guard})
	if err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, fw.DeleteTable())
		log.Info("removed nftables table", "table", "inet "+prefix)
		// No session is live: every conntrack entry of a pool address goes.
		n, err := fw.PruneGuests(nets.IsGuestAddr)
		errs = append(errs, err)
		if n > 0 {
			log.Info("removed conntrack entries of the pool", "entries", n)
		}
		fw.Close()
	}
	if st, err := NewStateStore(stateDir); err == nil {
		recs, _ := st.LoadAll()
		for _, r := range recs {
			log.Info("removing state record", "session", r.Name)
		}
		errs = append(errs, st.RemoveAll())
	} else {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
