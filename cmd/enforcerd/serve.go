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
	"syscall"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/daemon"
	"github.com/enforcerd/enforcerd/daemon/metrics"
	"github.com/enforcerd/enforcerd/doctor"
	"github.com/enforcerd/enforcerd/internal/cli"
	"github.com/enforcerd/enforcerd/internal/gctune"
)

// runServe is `enforcerd serve`: reconcile, then serve until SIGTERM. It
// never flushes rules: on exit the sessions stay up and enforced by the
// kernel, and the next start re-adopts them.
func runServe(cfg ServeConfig) error {
	log := newServeLogger(cfg.LogFormat)
	routeLogrus(log)
	// First of all, before any kernel object is touched: a second daemon
	// started by mistake must change nothing of the first one's.
	inst, err := claimInstance(cfg)
	if err != nil {
		return err
	}
	defer inst.release()
	// Sockets the service manager passed that do not match the config are
	// refused before anything else, naming both values.
	inherited, err := takeInheritedSockets()
	if err != nil {
		return err
	}
	defer inherited.close()
	if err := inherited.checkConfig(cfg); err != nil {
		return err
	}
	// Before any kernel change: a host on which enforcement cannot work (no
	// nf_tables, a foreign link with the prefix, the pool on a host address)
	// is refused here, in one line naming the check, not served half-enforced.
	if err := preflight(cfg); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	gctune.SetHeapFloor(cfg.HeapFloorMiB << 20)
	reg := metrics.New(version, commit)
	d, err := daemon.Open(cfg.daemonConfig(), log, reg)
	if err != nil {
		return err
	}
	defer d.Close()
	sdNotify("STATUS=reconciling the kernel's state")
	if err := d.Reconcile(); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	reg.SetSource(d)

	if want, _ := doctor.DNSAddrOf(cfg.Pool); inherited.dnsUDP != nil && want.Addr() != d.DNSAddr() {
		return fmt.Errorf("socket activation: the daemon's DNS address %s is not the pool's %s", d.DNSAddr(), want) // checkConfig's arithmetic disagrees with nsmgr's
	}
	serveDNS, err := d.ListenDNS(inherited.dnsUDP, inherited.dnsTCP)
	if err != nil {
		return err
	}
	inherited.dnsUDP, inherited.dnsTCP = nil, nil // the proxy owns them now
	dnsDone := make(chan error, 1)
	go func() { dnsDone <- serveDNS() }()

	if cfg.MetricsListen != "" {
		// Bound before READY: a metrics address that cannot be had fails
		// the start in one line instead of leaving a daemon nobody watches.
		ln, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("listen for metrics on %s: %w", cfg.MetricsListen, err)
		}
		go func() {
			if err := reg.Serve(ctx, ln); err != nil {
				log.Error("metrics listener", "addr", cfg.MetricsListen, "err", err)
			}
		}()
	}
	dnsAt := netip.AddrPortFrom(d.DNSAddr(), 53)
	if len(cfg.PublicOverrides) > 0 {
		log.Warn("PUBLIC OVERRIDE: special-purpose ranges treated as public destinations", "ranges", fmt.Sprint(cfg.PublicOverrides))
	}
	apiErr := make(chan error, 1)
	ready := func() {
		sdNotify(fmt.Sprintf("READY=1\nSTATUS=serving %d sessions on %s, DNS on %s", d.SessionCount(), cfg.Socket, dnsAt))
	}
	h := api.NewHandler(d, api.HandlerOptions{Log: log, Version: version, Commit: commit, CreateRefused: reg.CreateRefused})
	lcfg := api.ListenConfig{Socket: cfg.Socket, Group: cfg.SocketGroup}
	var ln *api.Listener
	if inherited.api != nil {
		if ln, err = api.ListenerFrom(inherited.api, lcfg); err == nil {
			inherited.api = nil // ln owns it now
		}
	} else {
		ln, err = api.Listen(lcfg)
	}
	if err != nil {
		return err
	}
	log.Info("enforcerd serving", "version", version, "commit", commit, "socket", cfg.Socket, "dns", dnsAt.String(),
		"socket_activated", ln.Inherited(), "config", cfg)
	ready()
	go func() { apiErr <- api.Serve(ctx, ln, h, log) }()
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

// runReap is `enforcerd reap`: refused while a daemon serves the state dir
// or the prefix (unless forced), then daemon.Reap.
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
	routeLogrus(log)
	err := daemon.Reap(prefix, stateDir, pool, log)
	removed, rerr := releaseRegistry(instanceDir, prefix)
	for _, p := range removed {
		log.Info("removed", "path", p)
	}
	return errors.Join(err, rerr)
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
	if cli.OnJournalStream(os.Getenv, os.Stderr) {
		h = newJournalHandler(os.Stderr, h)
	}
	return slog.New(h)
}
