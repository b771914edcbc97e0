package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/daemon/eventlog"
	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/internal/gctune"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// dnsHelperArg makes this binary the DNS side of figure 4: enforcerd's proxy
// (dnsproxy with netpolicy's Firewall as the attester) run as its own
// process in the simulated host, as the daemon runs it (and as dnsmasq runs
// for the peer), so that its upstream sockets are made in that netns
// without switching a thread per query.
const dnsHelperArg = "dnsproxy-serve"

// dnsZone is the zone every session of figure 4 may resolve.
const dnsZone = "allowed.test"

type helperOpts struct {
	prefix   string
	dns      netip.Addr
	upstream netip.AddrPort
	override netip.Prefix
	iface    string
	guest    netip.Addr
	slot     int
	extra    int
	events   string // the daemon's event log directory ("" : none)
}

func dnsHelperMain(args []string) int {
	fs := flag.NewFlagSet(dnsHelperArg, flag.ContinueOnError)
	var o helperOpts
	var dns, upstream, override, guest string
	fs.StringVar(&o.prefix, "prefix", "", "table and interface prefix")
	fs.StringVar(&dns, "dns", "", "anycast address to listen on (port 53)")
	fs.StringVar(&upstream, "upstream", "", "upstream resolver ip:port")
	fs.StringVar(&override, "override", "198.18.0.0/15", "special-purpose range treated as public")
	fs.StringVar(&o.iface, "iface", "", "host veth of the measured session")
	fs.StringVar(&guest, "guest", "", "guest address of the measured session")
	fs.IntVar(&o.slot, "slot", 0, "slot of the measured session (skipped by the extra sessions)")
	fs.IntVar(&o.extra, "extra", 0, "extra live sessions (firewall elements and proxy registrations only)")
	fs.StringVar(&o.events, "events", "", "record every decision in the daemon's event log under this directory, as the daemon does")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if o.dns, err = netip.ParseAddr(dns); err == nil {
		if o.upstream, err = netip.ParseAddrPort(upstream); err == nil {
			if o.override, err = netip.ParsePrefix(override); err == nil {
				o.guest, err = netip.ParseAddr(guest)
			}
		}
	}
	if err == nil {
		err = serveDNSHelper(o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, dnsHelperArg+":", err)
		return 1
	}
	return 0
}

func serveDNSHelper(o helperOpts) error {
	host, err := netns.Get() // nsenter put this process in the simulated host
	if err != nil {
		return err
	}
	defer host.Close()
	guard, err := netpolicy.NewGuard(nsmgr.DefaultPool, []netip.Prefix{o.override})
	if err != nil {
		return err
	}
	fw, err := netpolicy.OpenFirewall(netpolicy.FirewallConfig{NetNS: host, Prefix: o.prefix,
		Pool: nsmgr.DefaultPool, DNSAddr: o.dns, Guard: guard, AttestFloor: time.Minute})
	if err != nil {
		return err
	}
	defer fw.Close()
	if err := fw.Ensure(); err != nil {
		return err
	}
	defer fw.DeleteTable()
	gctune.SetHeapFloor(gctune.DefaultHeapFloor) // as the daemon does by default
	var events *eventlog.Log
	var sink dnsproxy.EventSink
	if o.events != "" {
		if events, err = eventlog.Open(o.events, 0, eventlog.StoreOptions{Retention: time.Hour}); err != nil {
			return err
		}
		defer events.Shutdown()
		sink = eventSink{events}
	}
	proxy, err := dnsproxy.New(dnsproxy.Config{Upstreams: []netip.AddrPort{o.upstream},
		Timeout: 2 * time.Second, Guard: guard, Attester: fw, Events: sink})
	if err != nil {
		return err
	}
	allow, err := netpolicy.ParseEntry("*."+dnsZone, guard)
	if err != nil {
		return err
	}
	register := func(r netpolicy.SessionRules) error {
		if err := fw.AddSession(r); err != nil {
			return err
		}
		if events != nil {
			events.Open(r.Name, nil)
		}
		return proxy.Register(dnsproxy.SessionPolicy{Name: r.Name, Guest: r.Guest, Mode: r.Egress,
			Allow: []netpolicy.Entry{allow}})
	}
	start := time.Now()
	if err := register(netpolicy.SessionRules{Name: "dnsperf", HostIface: o.iface, Guest: o.guest,
		Egress: netpolicy.ModeAllowlist}); err != nil {
		return err
	}
	geo, err := nsmgr.NewIPAM(nsmgr.DefaultPool)
	if err != nil {
		return err
	}
	for slot, added := 0, 0; added < o.extra; slot++ {
		if slot == o.slot {
			continue
		}
		_, _, g := geo.SlotAddrs(slot)
		r := netpolicy.SessionRules{Name: fmt.Sprintf("x%d", slot), HostIface: nsmgr.HostIfaceName(o.prefix, slot),
			Guest: g, Egress: netpolicy.ModeAllowlist}
		if err := register(r); err != nil {
			return err
		}
		if _, err := fw.Attest(g, world.PublicAddrs(4), 30*time.Minute, nil); err != nil {
			return err
		}
		added++
	}
	loaded := time.Since(start)

	at := netip.AddrPortFrom(o.dns, 53)
	pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(at))
	if err != nil {
		return err
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(at))
	if err != nil {
		pc.Close()
		return err
	}
	// BENCH_DNS_PROFILE=FILE: a CPU profile of the proxy while it serves
	// (diagnosis only; off by default).
	if path := os.Getenv("BENCH_DNS_PROFILE"); path != "" {
		if f, err := os.Create(fmt.Sprintf("%s.%d", path, o.extra+1)); err == nil {
			pprof.StartCPUProfile(f)
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}
	served := make(chan error, 1)
	go func() { served <- proxy.Serve(pc, ln) }()
	fmt.Printf("ready sessions=%d load_ms=%.0f\n", o.extra+1, ms(loaded))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	proxy.Shutdown(ctx)
	st := proxy.Stats()
	att, _ := fw.Attested(o.guest)
	var dropped uint64
	if events != nil {
		events.Shutdown()
		dropped = events.DroppedWrites()
	}
	fmt.Printf("stats verdicts=%v shed=%d attest_errors=%d upstream_errors=%d attested_elements=%d "+
		"attest_n=%d attest_mean_ms=%.3f attest_p99_le_ms=%s attest_max_ms=%.3f "+
		"upstream_mean_ms=%.3f upstream_p99_le_ms=%s upstream_max_ms=%.3f "+
		"attest_round_trips=%d attest_skipped=%d monitor_ended=%d events=%t events_not_written=%d\n",
		st.Verdicts, st.Shed, st.AttestErrors, st.UpstreamErrors, len(att),
		st.Attest.Count, meanMs(st.Attest), histP99(st.Attest), ms(st.Attest.Max),
		meanMs(st.Upstream), histP99(st.Upstream), ms(st.Upstream.Max),
		fw.AttestRoundTrips(), fw.AttestSkipped(), fw.AttestMonitorEnded(), events != nil, dropped)
	return nil
}

// eventSink records the proxy's decisions in the event log as the daemon's
// Record does (a DNS event with the name, type, addresses and upstream).
type eventSink struct{ l *eventlog.Log }

func (s eventSink) Record(ev dnsproxy.Event) {
	if ev.Session == "" {
		return
	}
	detail := map[string]any{"name": ev.Name, "type": ev.Type}
	if len(ev.Addrs) > 0 {
		addrs := make([]string, len(ev.Addrs))
		for i, a := range ev.Addrs {
			addrs[i] = a.String()
		}
		detail["addrs"] = addrs
	}
	if ev.Upstream != "" {
		detail["upstream"] = ev.Upstream
		detail["upstream_ms"] = float64(ev.Latency.Microseconds()) / 1000
	}
	s.l.RecordAsync(api.Event{Time: ev.Time.UTC(), Session: ev.Session, Kind: api.EventKindDNS, Action: ev.Verdict, Detail: detail})
}

func meanMs(h dnsproxy.Histogram) float64 {
	if h.Count == 0 {
		return 0
	}
	return ms(h.Sum) / float64(h.Count)
}

// histP99 is the upper bound of the bucket holding the 99th percentile.
func histP99(h dnsproxy.Histogram) string {
	for i, c := range h.Counts {
		if i < len(h.Bounds) && float64(c) >= 0.99*float64(h.Count) {
			return fmt.Sprintf("%g", ms(h.Bounds[i]))
		}
	}
	return "inf"
}
