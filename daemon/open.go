package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/vishvananda/netns"

	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/daemon/eventlog"
	"github.com/enforcerd/enforcerd/daemon/ledger"
	"github.com/enforcerd/enforcerd/daemon/metrics"
	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/doctor"
	"github.com/enforcerd/enforcerd/internal/nfnetlink"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// upstreamTimeout bounds one try of one upstream, for the proxy and for
// pinned resolution.
const upstreamTimeout = 2 * time.Second

// Open opens the four domain packages in the daemon's own netns, in the
// order that changes nothing of a host it should not serve (foreign links
// are refused before the first kernel change), and returns the daemon
// over them. It does not reconcile: call Reconcile next.
func Open(cfg Config, log *slog.Logger, reg *metrics.Registry) (_ *Engine, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	host, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("open own netns: %w", err)
	}
	var (
		nets         *nsmgr.Manager
		fw           *nft.Firewall
		drops        *nft.DropLog
		nameQueue    *nfnetlink.NFQUEUE
		sweep, swept chan struct{} // stop and done of sweepRefreshed
	)
	closeAll := func() {
		if sweep != nil {
			close(sweep)
			<-swept // the firewall must not be closed under a sweep
			sweep = nil
		}
		if drops != nil {
			drops.Close()
		}
		if nameQueue != nil {
			nameQueue.Close()
		}
		if fw != nil {
			fw.Close()
		}
		if nets != nil {
			nets.Close()
		}
		host.Close()
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	if err := nsmgr.EnableForwarding(host); err != nil {
		return nil, err
	}
	if cfg.Pool6.IsValid() {
		if err := nsmgr.EnableForwarding6(host); err != nil {
			return nil, err
		}
	}
	// What a `doctor --datapath` killed mid-way left (its own prefix, never
	// this daemon's): not fatal, the next start or reap tries again.
	runs, rerr := doctor.ReapDatapathRuns(cfg.StateDir, host)
	for _, p := range runs {
		log.Info("removed what a killed doctor --datapath left", "prefix", p)
	}
	if rerr != nil {
		log.Error("remove what a killed doctor --datapath left", "err", rerr)
	}
	// A released address is handed out again only once the firewall has
	// flushed its conntrack entries (in the background, after removal).
	guestClean := func(g netip.Addr) bool { return fw == nil || fw.FlowsFlushed(g) }
	// A background veth delete that failed leaves the veth down and its
	// slot quarantined; the next start's reap removes it.
	retireFailed := func(err error) { log.Error("background veth delete (the next start reaps it)", "err", err) }
	if nets, err = nsmgr.New(nsmgr.Config{Prefix: cfg.NamePrefix, Pool: cfg.Pool, Pool6: cfg.Pool6, HostNS: host, GuestClean: guestClean,
		Prepared: cfg.PreparedNetns, RetireFailed: retireFailed}); err != nil {
		return nil, err
	}
	// Before the first kernel change: the table would treat such a link as
	// a session veth and drop its traffic.
	if err := nets.CheckNoForeignLinks(); err != nil {
		return nil, err
	}
	dnsAddr, err := nets.EnsureDNSInterface()
	if err != nil {
		return nil, err
	}
	guard, err := netpolicy.NewDualStackGuard(cfg.Pool, cfg.Pool6, cfg.PublicOverrides)
	if err != nil {
		return nil, err
	}
	fw, err = nft.OpenFirewall(nft.FirewallConfig{
		NetNS: host, Prefix: cfg.NamePrefix, Pool: cfg.Pool, DNSAddr: dnsAddr,
		Pool6: cfg.Pool6, DNS6Addr: nets.DNS6Addr(),
		Guard: guard, AttestFloor: cfg.DNSMinTTL, AttestMaxLifetime: cfg.AttestMaxLifetime,
		MaxFlows: cfg.MaxFlows, FlowRate: cfg.FlowRate, MaxAttested: cfg.MaxAttested,
		OnFlowFlushError: func(err error) { log.Error("flush conntrack entries of removed sessions (retrying)", "err", err) },
	})
	if err != nil {
		return nil, err
	}
	if err := fw.Ensure(); err != nil {
		return nil, err
	}
	// The name check is enforcement: without its queue, the table drops
	// every pending flow's packets (nothing passes unchecked), so a daemon
	// that cannot read it must not serve.
	if nameQueue, err = fw.OpenNameQueue(); err != nil {
		return nil, fmt.Errorf("name check: %w", err)
	}
	if p := fw.RefreshSweepPeriod(); p > 0 {
		sweep, swept = make(chan struct{}), make(chan struct{})
		go func() {
			defer close(swept)
			sweepRefreshed(fw, p, sweep, log)
		}()
	}
	boxes, err := container.New(container.Config{
		StateDir: filepath.Join(cfg.StateDir, "containers"),
		LayerDir: filepath.Join(cfg.StateDir, "layers"),
		Prefix:   cfg.NamePrefix,
	})
	if err != nil {
		return nil, err
	}
	store, err := NewStateStore(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	// The image store is made here (root's, 0700) and is always one of
	// the image directories a rootfs may come from.
	images, err := container.OpenImageStore(filepath.Join(cfg.StateDir, ImageStoreDir), container.UnpackLimits{})
	if err != nil {
		return nil, err
	}
	cfg.ImagesDirs = append([]string{images.Dir}, cfg.ImagesDirs...)
	events, err := eventlog.Open(filepath.Join(cfg.StateDir, "events"), 0,
		eventlog.StoreOptions{Retention: cfg.EventsRetention, Log: log})
	if err != nil {
		return nil, err
	}
	d := New(cfg, Parts{
		Network: nets, Firewall: fw, Sandboxes: boxes, Guard: guard,
		Pin: upstreamResolver(cfg.Upstreams, upstreamTimeout), DNSAddr: dnsAddr,
		DNS6Addr: nets.DNS6Addr(), Store: store, Events: events, Log: log, Metrics: reg, Close: closeAll, Images: images,
	})
	proxy, err := dnsproxy.New(dnsproxy.Config{
		Upstreams: cfg.Upstreams,
		Timeout:   upstreamTimeout,
		MinTTL:    cfg.DNSMinTTL,
		Guard:     guard,
		Attester:  fw,
		Events:    dnsEventSink{d},
		Logger:    log,
	})
	if err != nil {
		return nil, err
	}
	d.dns, d.proxy = proxy, proxy
	d.serveNameCheck(nameQueue)
	// The drop log is visibility, not enforcement: without it (a kernel
	// without nfnetlink_log, the group bound by another process) the table
	// drops and counts the same, and no flow event is recorded.
	if drops, err = fw.OpenDropLog(); err != nil {
		log.Warn("no flow events: the drop log cannot be read", "err", err)
		drops, err = nil, nil
	} else {
		d.serveDrops(drops)
	}
	// The ledger of admissions needs the kernel's conntrack events with
	// accounting (a sysctl of this netns, written through /proc/sys).
	if err := nfnetlink.EnableConntrackEvents(); err != nil {
		return nil, err
	}
	flows, err := nfnetlink.SubscribeFlowEvents(int(host), ledgerSocketBuffer)
	if err != nil {
		return nil, fmt.Errorf("ledger of admissions: %w", err)
	}
	d.ledgerStop = d.serveLedger(flows, ledger.DefaultBudget)
	return d, nil
}

// sweepRefreshed ends, every period until stop is closed, the refreshes
// of attested addresses past the maximum lifetime (or revoked, or of
// removed sessions): see nft.Firewall.SweepRefreshed.
func sweepRefreshed(fw *nft.Firewall, period time.Duration, stop <-chan struct{}, log *slog.Logger) {
	everyTick(period, stop, func() {
		if n, err := fw.SweepRefreshed(); err != nil {
			log.Warn("sweep refreshed attested addresses", "err", err)
		} else if n > 0 {
			log.Debug("swept refreshed attested addresses", "deleted", n)
		}
	})
}

// ListenDNS returns the function that serves the DNS proxy on udp and tcp
// until Close (it returns the proxy's error if it stops by itself). Nil
// sockets are bound here, on the anycast address, port 53; the service
// manager passes its own (socket activation) so that queries sent while
// the daemon restarts wait in them. Only a daemon made by Open has a proxy.
func (e *Engine) ListenDNS(udp net.PacketConn, tcp net.Listener) (serve func() error, err error) {
	if e.proxy == nil {
		return nil, fmt.Errorf("listen dns: this daemon has no DNS proxy")
	}
	at := netip.AddrPortFrom(e.dnsAddr, 53)
	if udp == nil {
		if udp, err = net.ListenPacket("udp4", at.String()); err != nil {
			return nil, fmt.Errorf("listen dns udp %s: %w", at, err)
		}
	}
	if tcp == nil {
		if tcp, err = net.Listen("tcp4", at.String()); err != nil {
			udp.Close()
			return nil, fmt.Errorf("listen dns tcp %s: %w", at, err)
		}
	}
	if !e.dns6.IsValid() {
		return func() error { return e.proxy.Serve(udp, tcp) }, nil
	}
	// A dual-stack daemon also serves on the IPv6 anycast address.
	at6 := netip.AddrPortFrom(e.dns6, 53)
	udp6, err := net.ListenPacket("udp6", at6.String())
	if err != nil {
		udp.Close()
		tcp.Close()
		return nil, fmt.Errorf("listen dns udp %s: %w", at6, err)
	}
	tcp6, err := net.Listen("tcp6", at6.String())
	if err != nil {
		udp.Close()
		tcp.Close()
		udp6.Close()
		return nil, fmt.Errorf("listen dns tcp %s: %w", at6, err)
	}
	return func() error {
		done := make(chan error, 2)
		go func() { done <- e.proxy.Serve(udp6, tcp6) }()
		go func() { done <- e.proxy.Serve(udp, tcp) }()
		return <-done
	}, nil
}

// DNS6Addr is the IPv6 anycast address of a dual-stack daemon; invalid
// otherwise.
func (e *Engine) DNS6Addr() netip.Addr { return e.dns6 }

// shutdownDNS stops the proxy's listeners, waiting at most 2 s.
func (e *Engine) shutdownDNS() {
	if e.proxy == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = e.proxy.Shutdown(ctx)
}
