package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/doctor"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Reap is `enforcerd reap` once the program made sure no daemon serves the
// prefix: it removes every object of the prefix (sandboxes, netns, veths,
// the DNS interface, the nftables table, the pool's conntrack entries),
// the exec records and the state records, logging each.
func Reap(prefix, stateDir string, pool netip.Prefix, log *slog.Logger) error {
	host, err := netns.Get()
	if err != nil {
		return fmt.Errorf("open own netns: %w", err)
	}
	defer host.Close()
	var errs []error
	// What a `doctor --datapath` killed mid-way left (its own prefix).
	runs, err := doctor.ReapDatapathRuns(stateDir, host)
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
	fw, err := nft.OpenFirewall(nft.FirewallConfig{NetNS: host, Prefix: prefix, Pool: pool, DNSAddr: nets.DNSAddr(), Guard: guard})
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
	// The sandboxes are gone, so every holder's command is: each holder
	// writes its status and exits (StopHolder ends one that does not).
	errs = append(errs, reapExecs(filepath.Join(stateDir, "execs"), log))
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

// reapExecs stops the holders of every exec under root (<state-dir>/execs/
// SESSION/ID) and removes their records, then the session directories and
// root itself. It removes exactly what has those names: anything else under
// root is left, and so are root and that session's directory.
func reapExecs(root string, log *slog.Logger) error {
	sessions, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list exec records in %s: %w", root, err)
	}
	var errs []error
	for _, s := range sessions {
		if !s.IsDir() || !sessionNameValid(s.Name()) {
			continue
		}
		sdir := filepath.Join(root, s.Name())
		ids, err := os.ReadDir(sdir)
		if err != nil {
			errs = append(errs, fmt.Errorf("list exec records in %s: %w", sdir, err))
			continue
		}
		for _, id := range ids {
			if !id.IsDir() || !execIDPattern.MatchString(id.Name()) {
				continue
			}
			dir := filepath.Join(sdir, id.Name())
			container.StopHolder(dir, holderStopGrace)
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, fmt.Errorf("remove exec record %s: %w", dir, err))
				continue
			}
			log.Info("removed exec record", "session", s.Name(), "exec", id.Name())
		}
		if err := os.Remove(sdir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(root); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
