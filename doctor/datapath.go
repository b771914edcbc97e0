package doctor

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// The datapath check proves enforcement from the kernel's counters: two
// throwaway sessions, a and b, made by the real packages in the daemon's
// netns under a throwaway prefix and pool; a may reach b (a lab peer), b
// may reach nothing. a sends UDP to b, which must be accepted, counted and
// delivered; b sends UDP to a, which must be dropped and counted. Both
// destinations are sessions on this host: a packet our table failed to
// drop would still end in a netns of this host, never beyond it. Then
// everything of the throwaway prefix is removed, and its absence checked.

// datapathPort is the UDP port of the probe packets.
const datapathPort = 7357

// datapathWait bounds the wait for the accepted packet's delivery.
const datapathWait = 3 * time.Second

func checkDatapath(e *doctorEnv) (string, string) {
	// First what an earlier run, killed mid-way, left: its veths and
	// addresses would sit in this run's pool for good.
	earlier, err := ReapDatapathRuns(e.cfg.StateDir, e.host)
	if err != nil {
		return StatusFail, fmt.Sprintf("remove what an earlier killed datapath check left: %v", err)
	}
	prefix, err := throwawayPrefix(e.cfg.NamePrefix)
	if err != nil {
		return StatusFail, err.Error()
	}
	pool := e.opts.DatapathPool
	if err := nsmgr.ValidatePool(pool); err != nil {
		return StatusFail, fmt.Sprintf("datapath pool: %v", err)
	}
	if pool.Overlaps(e.cfg.Pool) {
		return StatusFail, fmt.Sprintf("datapath pool %s overlaps the daemon's pool %s; choose another --datapath-pool", pool, e.cfg.Pool)
	}
	hn, err := readHostNet(prefix)
	if err != nil {
		return StatusFail, err.Error()
	}
	if st, detail := poolVerdict(pool, hn); st == StatusFail {
		return StatusFail, "datapath " + detail
	}
	// The prefix is recorded before anything of it exists, so that a run
	// killed from here on is removed by the next run, serve or reap.
	rec, err := recordDatapathRun(e.cfg.StateDir, prefix, pool)
	if err != nil {
		return StatusFail, err.Error()
	}
	dp := &datapath{prefix: prefix, pool: pool, host: e.host, etcDir: rec.etcDir}
	result, runErr := dp.run()
	leftErr := dp.teardown()
	if leftErr == nil {
		leftErr = rec.done()
	} else {
		rec.keep() // the next run, serve or reap tries again
	}
	if len(earlier) > 0 && runErr == nil {
		result += "; removed what the killed run " + strings.Join(earlier, ", ") + " left"
	}
	switch {
	case runErr != nil && leftErr != nil:
		return StatusFail, fmt.Sprintf("%v; and teardown: %v", runErr, leftErr)
	case runErr != nil:
		return StatusFail, runErr.Error()
	case leftErr != nil:
		return StatusFail, fmt.Sprintf("%s; but teardown: %v", result, leftErr)
	}
	return StatusOK, result + "; nothing of prefix " + prefix + " left"
}

// throwawayPrefix returns "dr" and four random characters, such that no
// nftables table of the inet family (another daemon's, the configured
// one's) is named by a prefix of it or extends it: such a table would
// judge the throwaway veths as its own sessions', and ours its veths.
func throwawayPrefix(configured string) (string, error) {
	c, err := nftables.New()
	if err != nil {
		return "", fmt.Errorf("nftables: %w", err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return "", fmt.Errorf("nftables: list tables: %w", err)
	}
	names := []string{configured}
	for _, t := range tables {
		names = append(names, t.Name)
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	for range 16 {
		b := make([]byte, 4)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		p := "dr"
		for _, c := range b {
			p += string(alphabet[int(c)%len(alphabet)])
		}
		clash := false
		for _, n := range names {
			if n != "" && (strings.HasPrefix(p, n) || strings.HasPrefix(n, p)) {
				clash = true
			}
		}
		if !clash {
			return p, nil
		}
	}
	return "", errors.New("no throwaway prefix free of the host's nftables tables")
}

// datapath is one run of the check; teardown undoes whatever run made.
type datapath struct {
	prefix string
	pool   netip.Prefix
	host   netns.NsHandle

	etcDir   string
	nets     *nsmgr.Manager
	fw       *nft.Firewall
	sessions []nsmgr.Session
	rules    []nft.SessionRules
}

func (d *datapath) run() (string, error) {
	// serve does the same at start: sessions are routed through this netns.
	if err := nsmgr.EnableForwarding(d.host); err != nil {
		return "", err
	}
	var err error
	if err := os.Mkdir(d.etcDir, 0o700); err != nil {
		return "", fmt.Errorf("datapath: %w", err)
	}
	if d.nets, err = nsmgr.New(nsmgr.Config{Prefix: d.prefix, Pool: d.pool, HostNS: d.host, EtcNetnsDir: d.etcDir}); err != nil {
		return "", err
	}
	if err := d.nets.CheckNoForeignLinks(); err != nil {
		return "", err
	}
	guard, err := netpolicy.NewGuard(d.pool, nil)
	if err != nil {
		return "", err
	}
	if d.fw, err = nft.OpenFirewall(nft.FirewallConfig{NetNS: d.host, Prefix: d.prefix, Pool: d.pool, DNSAddr: d.nets.DNSAddr(), Guard: guard}); err != nil {
		return "", err
	}
	if err := d.fw.Ensure(); err != nil {
		return "", err
	}
	for _, name := range []string{"a", "b"} {
		s, err := d.nets.Create(name, true)
		if err != nil {
			return "", err
		}
		d.sessions = append(d.sessions, s)
	}
	a, b := d.sessions[0], d.sessions[1]
	d.rules = []nft.SessionRules{
		{Name: a.Name, HostIface: a.HostIface, Guest: a.Guest, Egress: netpolicy.ModeAllowlist, Peers: []netip.Addr{b.Guest}},
		{Name: b.Name, HostIface: b.HostIface, Guest: b.Guest, Egress: netpolicy.ModeAllowlist},
	}
	for _, r := range d.rules {
		if err := d.fw.AddSession(r); err != nil {
			return "", err
		}
	}

	inB, err := listenUDPIn(b.NetnsPath, netip.AddrPortFrom(b.Guest, datapathPort))
	if err != nil {
		return "", err
	}
	defer inB.Close()
	// First the packet that must pass, resent until it is delivered: a
	// fresh pair's carrier and neighbours take a moment, and a packet sent
	// before then is lost before any chain sees it. Then the one that must
	// be dropped, each on a fresh socket (no conntrack entry makes it a
	// reply), resent until b's dropped counter moves or the wait ends.
	delivered := false
	deadline := time.Now().Add(datapathWait)
	buf := make([]byte, 64)
	for !delivered && time.Now().Before(deadline) {
		if err := sendUDPFrom(a.NetnsPath, netip.AddrPortFrom(b.Guest, datapathPort), []byte("enforcerd doctor: must pass")); err != nil {
			return "", err
		}
		inB.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if n, _, err := inB.ReadFromUDPAddrPort(buf); err == nil && strings.HasPrefix(string(buf[:n]), "enforcerd doctor: must pass") {
			delivered = true
		}
	}
	var ca, cb nft.Counters
	deadline = time.Now().Add(datapathWait)
	for {
		if err := sendUDPFrom(b.NetnsPath, netip.AddrPortFrom(a.Guest, datapathPort), []byte("enforcerd doctor: must be dropped")); err != nil {
			return "", err
		}
		time.Sleep(20 * time.Millisecond)
		if cb, err = d.fw.Counters(b.Guest); err != nil {
			return "", err
		}
		if cb.DroppedPackets > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(80 * time.Millisecond)
	}
	if ca, err = d.fw.Counters(a.Guest); err != nil {
		return "", err
	}
	return datapathVerdict(ca, cb, delivered)
}

// datapathVerdict judges the counters of a (whose packets to b must be
// accepted) and b (whose packet to a must be dropped).
func datapathVerdict(a, b nft.Counters, delivered bool) (string, error) {
	var errs []string
	if a.AcceptedPackets == 0 {
		errs = append(errs, "the accepted counter did not move for a packet the policy allows (enforcerd's forward chain never saw it)")
	} else if !delivered {
		errs = append(errs, fmt.Sprintf("a packet the policy allows was accepted (%d packets) but never delivered: something else on the forward path drops it (see forward-firewall)", a.AcceptedPackets))
	}
	if b.DroppedPackets == 0 {
		errs = append(errs, "the dropped counter did not move for a packet the policy denies: enforcement is not in the forward path")
	}
	if b.AcceptedPackets > 0 {
		errs = append(errs, fmt.Sprintf("%d packets the policy denies were accepted", b.AcceptedPackets))
	}
	if len(errs) > 0 {
		return "", errors.New("datapath: " + strings.Join(errs, "; "))
	}
	return fmt.Sprintf("a packet the policy allows was accepted and delivered (%d accepted), one it denies was dropped (%d dropped)", a.AcceptedPackets, b.DroppedPackets), nil
}

// teardown removes everything of the throwaway prefix (each step
// idempotent) and checks that nothing of it is left: netns files, links,
// the table.
func (d *datapath) teardown() error {
	var errs []error
	if d.fw != nil {
		for _, r := range d.rules {
			errs = append(errs, d.fw.RemoveSession(r))
		}
		errs = append(errs, d.fw.DeleteTable())
		// The conntrack entries of the removed guests are flushed in the
		// background: wait for it before closing.
		errs = append(errs, d.fw.WaitFlows(5*time.Second))
		errs = append(errs, d.fw.Close())
	}
	if d.nets != nil {
		for _, s := range d.sessions {
			errs = append(errs, d.nets.Delete(s.Name, s.Slot))
		}
		_, err := d.nets.Reap(nil)
		errs = append(errs, err, d.nets.RemoveDNSInterface())
		d.nets.Close()
	}
	if d.etcDir != "" {
		errs = append(errs, os.RemoveAll(d.etcDir))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return d.leftovers()
}

// leftovers reports the objects of the prefix still present; the kernel
// removes a deleted netns's veth pair in the background, so links get a
// few seconds to go.
func (d *datapath) leftovers() error {
	var left []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		left = left[:0]
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list links: %w", err)
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, d.prefix) {
				left = append(left, "link "+l.Attrs().Name)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	files, _ := filepath.Glob(filepath.Join(nsmgr.DefaultNetnsDir, d.prefix+"-*"))
	for _, f := range files {
		left = append(left, "netns "+filepath.Base(f))
	}
	if c, err := nftables.New(); err == nil {
		if _, err := c.ListTableOfFamily(d.prefix, nftables.TableFamilyINet); err == nil {
			left = append(left, "table inet "+d.prefix)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("left behind: %s", strings.Join(left, ", "))
	}
	return nil
}

// listenUDPIn opens a UDP socket bound to at inside the netns at path.
func listenUDPIn(path string, at netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := inNetnsPath(path, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(at))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("datapath: listen on %s in %s: %w", at, filepath.Base(path), err)
	}
	return c, nil
}

// sendUDPFrom sends one datagram to dst from a fresh socket inside the
// netns at path.
func sendUDPFrom(path string, dst netip.AddrPort, payload []byte) error {
	var c *net.UDPConn
	err := inNetnsPath(path, func() (err error) {
		c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
		return err
	})
	if err != nil {
		return fmt.Errorf("datapath: socket in %s: %w", filepath.Base(path), err)
	}
	defer c.Close()
	if _, err := c.Write(payload); err != nil {
		return fmt.Errorf("datapath: send to %s from %s: %w", dst, filepath.Base(path), err)
	}
	return nil
}

// inNetnsPath runs fn in the netns mounted at path (a socket made there
// stays in that netns).
func inNetnsPath(path string, fn func() error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	return nsmgr.Do(ns, fn)
}

// A datapath run is recorded, before it makes anything, as the file
// <state-dir>/doctor-datapath/PREFIX holding its pool, locked (flock) for
// as long as the run lives; its netns resolv.conf files go to PREFIX.etc
// beside it. A run that ends removes both. A run killed mid-way leaves
// the file unlocked, and ReapDatapathRuns (the next run, serve, reap)
// removes every object of exactly that prefix, then the file. A locked
// file is a run in progress and left alone.
const datapathRunsDir = "doctor-datapath"

type datapathRun struct {
	f            *os.File // holds the lock
	path, etcDir string
}

// recordDatapathRun writes the record of a run of prefix over pool. The
// file is locked before its final name appears, so no cleaner ever sees
// the record of a live run unlocked.
func recordDatapathRun(stateDir, prefix string, pool netip.Prefix) (*datapathRun, error) {
	if stateDir == "" {
		return nil, errors.New("datapath: no state directory to record the run in")
	}
	dir := filepath.Join(stateDir, datapathRunsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("datapath: record the run: %w", err)
	}
	f, err := os.CreateTemp(dir, ".new-")
	if err != nil {
		return nil, fmt.Errorf("datapath: record the run: %w", err)
	}
	path := filepath.Join(dir, prefix)
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		_, err = fmt.Fprintf(f, "%s\n", pool)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(f.Name())
		f.Close()
		return nil, fmt.Errorf("datapath: record the run in %s: %w", path, err)
	}
	return &datapathRun{f: f, path: path, etcDir: path + ".etc"}, nil
}

// done removes the record of a run that left nothing.
func (r *datapathRun) done() error {
	defer r.f.Close()
	if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("datapath: remove the run's record: %w", err)
	}
	return nil
}

// keep leaves the record for a later cleaner (the run left something).
func (r *datapathRun) keep() { r.f.Close() }

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ReapDatapathRuns removes what every recorded datapath run that is no
// longer running left (see datapathRunsDir): its table, netns, veths with
// their addresses, DNS interface, conntrack entries of its pool and netns
// resolv.conf files, all by the run's exact prefix. It returns the
// prefixes it removed. Runs in progress are left alone.
func ReapDatapathRuns(stateDir string, host netns.NsHandle) ([]string, error) {
	if stateDir == "" {
		return nil, nil
	}
	dir := filepath.Join(stateDir, datapathRunsDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("datapath runs: %w", err)
	}
	var (
		removed []string
		errs    []error
	)
	for _, ent := range entries {
		name := ent.Name()
		if ent.IsDir() {
			continue // PREFIX.etc: removed with its run
		}
		path := filepath.Join(dir, name)
		f, err := os.Open(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("datapath run %s: %w", name, err))
			continue
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close() // a run in progress
			continue
		}
		err = reapDatapathRun(dir, name, f, host)
		f.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !strings.HasPrefix(name, ".new-") {
			removed = append(removed, name)
		}
	}
	return removed, errors.Join(errs...)
}

// reapDatapathRun removes the objects of one dead run and its record.
func reapDatapathRun(dir, name string, f *os.File, host netns.NsHandle) error {
	path := filepath.Join(dir, name)
	if strings.HasPrefix(name, ".new-") {
		// Killed before the record got its name: nothing was made.
		return os.Remove(path)
	}
	if !isThrowawayPrefix(name) {
		return fmt.Errorf("datapath run record %s: %q is not a throwaway prefix (want dr and four of a-z, 0-9); remove the file", path, name)
	}
	b, err := io.ReadAll(io.LimitReader(f, 64))
	if err != nil {
		return fmt.Errorf("datapath run %s: %w", name, err)
	}
	pool, err := netip.ParsePrefix(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("datapath run record %s: pool %q: %w", path, strings.TrimSpace(string(b)), err)
	}
	d := &datapath{prefix: name, pool: pool, host: host, etcDir: path + ".etc"}
	if err := d.reapKilled(); err != nil {
		return fmt.Errorf("datapath run %s: %w", name, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("datapath run %s: remove the record: %w", name, err)
	}
	return nil
}

// isThrowawayPrefix reports whether s has the shape throwawayPrefix gives.
func isThrowawayPrefix(s string) bool {
	if len(s) != 6 || !strings.HasPrefix(s, "dr") {
		return false
	}
	for _, c := range s[2:] {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// reapKilled removes everything of d's prefix that a killed run may have
// made, each step idempotent, and checks that nothing is left.
func (d *datapath) reapKilled() error {
	var errs []error
	nets, err := nsmgr.New(nsmgr.Config{Prefix: d.prefix, Pool: d.pool, HostNS: d.host, EtcNetnsDir: d.etcDir})
	if err != nil {
		return err
	}
	defer nets.Close()
	guard, err := netpolicy.NewGuard(d.pool, nil)
	if err != nil {
		return err
	}
	fw, err := nft.OpenFirewall(nft.FirewallConfig{NetNS: d.host, Prefix: d.prefix, Pool: d.pool, DNSAddr: nets.DNSAddr(), Guard: guard})
	if err != nil {
		return err
	}
	errs = append(errs, fw.DeleteTable())
	_, err = fw.PruneGuests(nets.IsGuestAddr)
	errs = append(errs, err, fw.Close())
	_, err = nets.Reap(nil)
	errs = append(errs, err, nets.RemoveDNSInterface(), os.RemoveAll(d.etcDir))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return d.leftovers()
}
