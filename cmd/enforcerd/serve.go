package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// upstreamTimeout bounds one try of one upstream, for the proxy and for
// pinned resolution.
const upstreamTimeout = 2 * time.Second

// runServe is `enforcerd serve`: reconcile, then serve until SIGTERM. It
// never flushes rules: on exit the sessions stay up and enforced by the
// kernel, and the next start re-adopts them.
func runServe(cfg ServeConfig) error {
	log := newServeLogger(cfg.LogFormat)
	// First of all, before any kernel object is touched: a second daemon
	// started by mistake must change nothing of the first one's.
	inst, err := claimInstance(cfg)
	if err != nil {
		return err
	}
	defer inst.release()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	metrics := NewMetrics()
	e, err := openEngine(cfg, log, metrics)
	if err != nil {
		return err
	}
	defer e.close()
	sdNotify("STATUS=reconciling the kernel's state")
	if err := e.reconcile(); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	metrics.SetSessionSource(e)

	dnsAt := netip.AddrPortFrom(e.dnsAddr, 53)
	udp, err := net.ListenPacket("udp4", dnsAt.String())
	if err != nil {
		return fmt.Errorf("listen dns udp %s: %w", dnsAt, err)
	}
	tcp, err := net.Listen("tcp4", dnsAt.String())
	if err != nil {
		udp.Close()
		return fmt.Errorf("listen dns tcp %s: %w", dnsAt, err)
	}
	dnsDone := make(chan error, 1)
	go func() { dnsDone <- e.dns.Serve(udp, tcp) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		e.dns.Shutdown(sctx)
	}()

	if cfg.MetricsListen != "" {
		// Bound before READY: a metrics address that cannot be had fails
		// the start in one line instead of leaving a daemon nobody watches.
		ln, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("listen for metrics on %s: %w", cfg.MetricsListen, err)
		}
		go func() {
			if err := serveMetricsOn(ctx, ln, metrics); err != nil {
				log.Error("metrics listener", "addr", cfg.MetricsListen, "err", err)
			}
		}()
	}
	log.Info("enforcerd serving", "version", version, "socket", cfg.Socket, "dns", dnsAt.String(),
		"pool", cfg.Pool.String(), "prefix", cfg.NamePrefix, "upstreams", fmt.Sprint(cfg.Upstreams))
	if len(cfg.PublicOverrides) > 0 {
		log.Warn("PUBLIC OVERRIDE: special-purpose ranges treated as public destinations", "ranges", fmt.Sprint(cfg.PublicOverrides))
	}
	apiErr := make(chan error, 1)
	ready := func() {
		sdNotify(fmt.Sprintf("READY=1\nSTATUS=serving %d sessions on %s, DNS on %s", e.SessionCount(), cfg.Socket, dnsAt))
	}
	go func() { apiErr <- serveAPI(ctx, cfg, newAPIHandler(e, log, metrics), ready) }()
	select {
	case err = <-apiErr:
	case err = <-dnsDone:
		err = fmt.Errorf("dns proxy stopped: %w", err)
	}
	sdNotify("STOPPING=1")
	log.Info("enforcerd stopping; sessions stay up and enforced by the kernel")
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// openEngine builds every component in the daemon's own netns.
func openEngine(cfg ServeConfig, log *slog.Logger, metrics *Metrics) (*engine, error) {
	host, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("open own netns: %w", err)
	}
	e := &engine{cfg: cfg, log: log, metrics: metrics,
		sessions: map[string]*liveSession{}, pending: map[string]bool{}}
	ok := false
	defer func() {
		if !ok {
			e.close()
			host.Close()
		}
	}()
	if err := nsmgr.EnableForwarding(host); err != nil {
		return nil, err
	}
	// A released address is handed out again only once the firewall has
	// flushed its conntrack entries (in the background, after removal).
	guestClean := func(g netip.Addr) bool { return e.fw == nil || e.fw.FlowsFlushed(g) }
	if e.nets, err = nsmgr.New(nsmgr.Config{Prefix: cfg.NamePrefix, Pool: cfg.Pool, HostNS: host, GuestClean: guestClean}); err != nil {
		return nil, err
	}
	// Before the first kernel change: the table would treat such a link as
	// a session veth and drop its traffic.
	if err := e.nets.CheckNoForeignLinks(); err != nil {
		return nil, err
	}
	if e.dnsAddr, err = e.nets.EnsureDNSInterface(); err != nil {
		return nil, err
	}
	if e.guard, err = netpolicy.NewGuard(cfg.Pool, cfg.PublicOverrides); err != nil {
		return nil, err
	}
	e.fw, err = netpolicy.OpenFirewall(netpolicy.FirewallConfig{
		NetNS: host, Prefix: cfg.NamePrefix, Pool: cfg.Pool, DNSAddr: e.dnsAddr,
		Guard: e.guard, AttestFloor: cfg.DNSMinTTL,
		MaxFlows: cfg.MaxFlows, FlowRate: cfg.FlowRate, MaxAttested: cfg.MaxAttested,
		OnFlowFlushError: func(err error) { log.Error("flush conntrack entries of removed sessions (retrying)", "err", err) },
	})
	if err != nil {
		return nil, err
	}
	if err := e.fw.Ensure(); err != nil {
		return nil, err
	}
	e.boxes, err = container.New(container.Config{
		StateDir: filepath.Join(cfg.StateDir, "containers"),
		LayerDir: filepath.Join(cfg.StateDir, "layers"),
		Prefix:   cfg.NamePrefix,
	})
	if err != nil {
		return nil, err
	}
	if e.state, err = NewStateStore(cfg.StateDir); err != nil {
		return nil, err
	}
	e.events = NewEventLog(1000)
	e.pin = upstreamResolver(cfg.Upstreams, upstreamTimeout)
	e.dns, err = dnsproxy.New(dnsproxy.Config{
		Upstreams: cfg.Upstreams,
		Timeout:   upstreamTimeout,
		MinTTL:    cfg.DNSMinTTL,
		Guard:     e.guard,
		Attester:  attestTimer{e.fw, metrics},
		Events:    e,
		Logger:    log,
	})
	if err != nil {
		return nil, err
	}
	ok = true
	return e, nil
}

// attestTimer measures the attest hot path for the metrics.
type attestTimer struct {
	fw *netpolicy.Firewall
	m  *Metrics
}

func (a attestTimer) Attest(guest netip.Addr, ips []netip.Addr, ttl time.Duration, ports []netpolicy.PortSpec) (time.Duration, error) {
	start := time.Now()
	d, err := a.fw.Attest(guest, ips, ttl, ports)
	a.m.observeAttest(time.Since(start))
	return d, err
}

func (e *engine) close() {
	if e.fw != nil {
		e.fw.Close()
	}
	if e.nets != nil {
		e.nets.Close()
	}
}

// reconcile re-adopts every session whose record, kernel objects and
// sandbox survived, and reaps everything partial or orphaned (one log line
// each). It never flushes the table: adopted sessions keep their attested
// elements.
func (e *engine) reconcile() error {
	recs, err := e.state.LoadAll()
	if err != nil {
		return err
	}
	found, err := e.nets.Recover()
	if err != nil {
		return err
	}
	nets := map[string]nsmgr.Session{}
	for _, s := range found {
		nets[s.Name] = s
	}
	keys, err := e.fw.Sessions()
	if err != nil {
		return err
	}
	inTable := map[netip.Addr]bool{}
	for _, k := range keys {
		inTable[k.Guest] = true
	}
	// Lab targets first, so their peers can resolve them.
	sortLabFirst(recs)
	for _, rec := range recs {
		why := e.survives(rec, nets, inTable)
		if why == "" {
			why = e.adopt(rec)
		}
		if why != "" {
			e.log.Warn("reaping partial session", "session", rec.Name, "reason", why)
			if err := e.teardown(rec, netpolicy.SessionRules{Name: rec.Name, HostIface: rec.HostIface, Guest: rec.Guest}); err != nil {
				e.log.Error("reap partial session", "session", rec.Name, "err", err)
			}
			continue
		}
		e.log.Info("re-adopted session", "session", rec.Name, "guest", addrString(rec.Guest))
	}
	keep := map[string]bool{}
	adopted := map[netip.Addr]bool{}
	for name, s := range e.sessions {
		keep[name] = true
		adopted[s.rec.Guest] = true
	}
	removed, err := e.nets.Reap(keep)
	for _, r := range removed {
		e.log.Warn("reaped orphaned network object", "object", r)
	}
	if err != nil {
		e.log.Error("reap networks", "err", err)
	}
	boxes, err := e.boxes.Reap(keep)
	for _, r := range boxes {
		e.log.Warn("reaped orphaned sandbox", "sandbox", r)
	}
	if err != nil {
		e.log.Error("reap sandboxes", "err", err)
	}
	for _, k := range keys {
		if !adopted[k.Guest] {
			e.log.Warn("reaping orphaned rules", "guest", k.Guest.String(), "iface", k.HostIface)
		}
	}
	// Everything keyed by a pool address that is no live session's goes,
	// not only what the sessions set names: attested elements and
	// conntrack entries a session left behind (a crash mid-removal) would
	// otherwise serve the next session on the address.
	flows, err := e.fw.PruneGuests(func(g netip.Addr) bool { return e.nets.IsGuestAddr(g) && !adopted[g] })
	if err != nil {
		e.log.Error("prune orphaned rules and flows", "err", err)
	} else if flows > 0 {
		e.log.Warn("reaped orphaned flows", "conntrack_entries", flows)
	}
	return nil
}

// survives says why a recorded session cannot be re-adopted, or "".
func (e *engine) survives(rec SessionRecord, nets map[string]nsmgr.Session, inTable map[netip.Addr]bool) string {
	n, ok := nets[rec.Name]
	switch {
	case !ok:
		return "its netns is gone"
	case rec.Slot >= 0 && n.Slot != rec.Slot:
		return fmt.Sprintf("its host veth for slot %d is gone", rec.Slot)
	case rec.Slot >= 0 && !inTable[rec.Guest]:
		return "its rules are gone from the nftables table"
	case rec.Sandbox && !e.boxes.Exists(rec.Name):
		return "its sandbox is gone"
	}
	return ""
}

// adopt rebuilds a surviving session's in-memory state, re-applies its
// static rules (idempotent) and registers it with the DNS proxy.
func (e *engine) adopt(rec SessionRecord) string {
	p, err := e.buildPolicy(rec.Request)
	if err != nil {
		return fmt.Sprintf("its recorded policy no longer validates: %v", err)
	}
	s := &liveSession{rec: rec, policy: p}
	if rec.Slot >= 0 {
		// A lab target deleted while this session lived took its peering
		// with it (RemoveSession removes the elements pointing at it); a new
		// session that reused its name or address is not the one named.
		peers := peerGuests(e.livePeers(rec.Name, rec.Peers))
		s.rules = e.sessionRules(rec, p, peers)
		if err := e.fw.AddSession(s.rules); err != nil {
			return fmt.Sprintf("re-apply rules: %v", err)
		}
		if err := e.dns.Register(e.dnsPolicy(s)); err != nil {
			return fmt.Sprintf("register with the dns proxy: %v", err)
		}
	}
	e.mu.Lock()
	e.sessions[rec.Name] = s
	e.mu.Unlock()
	e.lifecycle(rec.Name, "adopted", nil)
	return ""
}

func sortLabFirst(recs []SessionRecord) {
	lab := func(r SessionRecord) int {
		if r.Request.Lab {
			return 0
		}
		return 1
	}
	for i := 1; i < len(recs); i++ {
		for j := i; j > 0 && lab(recs[j]) < lab(recs[j-1]); j-- {
			recs[j], recs[j-1] = recs[j-1], recs[j]
		}
	}
}

// runReap is `enforcerd reap`: with the daemon stopped, remove every object
// of the prefix (sandboxes, netns, veths, the DNS interface, the nftables
// table) and the state records.
func runReap(prefix, stateDir string, pool netip.Prefix, force bool) error {
	if !force {
		if pid := stateDirHeld(stateDir); pid != "" {
			return fmt.Errorf("enforcerd pid %s serves the state dir %s; stop it first (or pass --force)", pid, stateDir)
		}
		if o, ok := liveInstanceFor(prefix, stateDir); ok {
			return fmt.Errorf("enforcerd pid %d serves the name prefix %q (state dir %s); stop it first (or pass --force)", o.PID, prefix, o.StateDir)
		}
	}
	log := newServeLogger("text")
	host, err := netns.Get()
	if err != nil {
		return fmt.Errorf("open own netns: %w", err)
	}
	defer host.Close()
	var errs []error
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

func newServeLogger(format string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	if os.Getenv("ENFORCERD_DEBUG") != "" {
		opts.Level = slog.LevelDebug
	}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, opts)
	if format == "json" {
		h = slog.NewJSONHandler(os.Stderr, opts)
	}
	// Under systemd, stderr is a journal stream: give each line its priority.
	if os.Getenv("JOURNAL_STREAM") != "" {
		h = newJournalHandler(os.Stderr, h)
	}
	return slog.New(h)
}
