package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/enforcerd"
	"github.com/enforcerd/enforcerd/integration/world"
)

// The IPv6 figures (issue 26): each dual-stack measurement beside its IPv4
// twin, measured in the same run, interleaved. In their RESULT lines "ours"
// is the IPv6 (dual-stack) figure, "peer" its IPv4 twin (the ratio is then
// what IPv6 costs), and the floor the IPv6 floor; the IPv4 floor is printed
// beside it. None has a target: they are reported, not judged.

// figNet6 is figure 1 for a dual-stack daemon: a session network's create
// and delete in-process (nsmgr + table) with --pool6 against the same
// without (two worlds, the same steps interleaved one for one), and the
// network floor of each (netFloor, dual-stack: a /126 on each side and the
// guest's IPv6 default route too).
func figNet6(ctx context.Context, cfg *config, rep *Report) error {
	section("1b. IPv6: dual-stack session network create/delete vs IPv4-only, in-process")
	e4, err := newNetEnv("g")
	if err != nil {
		return err
	}
	defer e4.Close()
	e6, err := newNetEnvPool6("h", benchPool6)
	if err != nil {
		return err
	}
	defer e6.Close()
	f4, err := newNetFloor(e4.w.Host, "f"+e4.w.ID[:5])
	if err != nil {
		return err
	}
	defer f4.Close()
	f6, err := newNetFloor6(e6.w.Host, "f"+e6.w.ID[:5])
	if err != nil {
		return err
	}
	defer f6.Close()

	n := cfg.netN
	const warm = 3
	var c4, c6, d4, d6 splits
	var fc4, fc6, fd4, fd6 Samples
	for i := 0; i < n+warm; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := fmt.Sprintf("s%d", i)
		_, o4, err := e4.create(name)
		if err != nil {
			return err
		}
		s6, o6, err := e6.create(name)
		if err != nil {
			return err
		}
		if !s6.Guest6.IsValid() || !benchPool6.Contains(s6.Guest6) {
			return fmt.Errorf("dual-stack session %s: guest6 %s, want an address of %s", name, s6.Guest6, benchPool6)
		}
		x4, err := f4.Create(i)
		if err != nil {
			return err
		}
		x6, err := f6.Create(i)
		if err != nil {
			return err
		}
		if i == 0 {
			if err := f6.Check(0); err != nil {
				return err
			}
		}
		if i >= warm {
			c4.add(o4)
			c6.add(o6)
			fc4, fc6 = append(fc4, x4), append(fc6, x6)
		}
	}
	logf("created %d sessions each way; deleting", n+warm)
	for i := 0; i < n+warm; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := fmt.Sprintf("s%d", i)
		o4, err := e4.remove(name)
		if err != nil {
			return err
		}
		o6, err := e6.remove(name)
		if err != nil {
			return err
		}
		x4, err := f4.Delete(i)
		if err != nil {
			return err
		}
		x6, err := f6.Delete(i)
		if err != nil {
			return err
		}
		if i >= warm {
			d4.add(o4)
			d6.add(o6)
			fd4, fd6 = append(fd4, x4), append(fd6, x6)
		}
	}
	for _, f := range []struct {
		op         string
		v6, v4     *splits
		fl6, fl4   Samples
		percentile float64
	}{
		{"create", &c6, &c4, fc6, fc4, 50}, {"create", &c6, &c4, fc6, fc4, 99},
		{"delete", &d6, &d4, fd6, fd4, 50}, {"delete", &d6, &d4, fd6, fd4, 99},
	} {
		p := f.percentile
		v4, fl4 := f.v4.total.Pct(p), f.fl4.Pct(p)
		rep.Add(Result{Name: fmt.Sprintf("net6-%s-p%g", f.op, p), Unit: "ms", Ours: f.v6.total.Pct(p), Peer: v4,
			Note:  "ours = dual-stack (--pool6), peer = the same IPv4-only; no target",
			Floor: f.fl6.Pct(p), FloorIs: "netlink-dualstack-" + f.op + "-floor",
			Extra: append(f.v6.parts(f.op, p), fmt.Sprintf("n=%d", n), fmt.Sprintf("v4_floor_ms=%.3f", fl4),
				fmt.Sprintf("v4_floor_ratio=%.3f", v4/fl4))})
	}
	return nil
}

// figDatapath6 is figure 3 for a dual-stack session: single-stream TCP
// throughput (iperf3, pinned as figure 3's) from one dual-stack session to
// a web address of the simulated internet over IPv6 and to its IPv4 twin,
// through the table (loaded with cfg.dpSessions sessions, all dual-stack)
// and over the same path with no table; with natFloor, IPv6 through
// conntrack and masquerade alone too. Every repetition runs them all.
func figDatapath6(ctx context.Context, cfg *config, rep *Report) error {
	section(fmt.Sprintf("3b. IPv6: TCP throughput, dual-stack table with %d sessions, v6 vs v4", cfg.dpSessions))
	e, err := newNetEnvPool6("i", benchPool6)
	if err != nil {
		return err
	}
	defer e.Close()
	target6 := e.w.Web6[0]
	unlisted6 := netip.AddrPortFrom(e.w.Web6[1], 7) // echo, not in the session's rules
	static := []netip.Prefix{netip.PrefixFrom(iperfTarget, 32), netip.PrefixFrom(target6, 128)}
	client, _, err := e.create("iperf", static...)
	if err != nil {
		return err
	}
	if err := addReturnRoute(e.w); err != nil {
		return fmt.Errorf("route the pool back from the simulated internet: %w", err)
	}
	defer removeReturnRoute(e.w)
	if err := returnRoute6(e.w, true); err != nil {
		return fmt.Errorf("route the pool6 back from the simulated internet: %w", err)
	}
	defer returnRoute6(e.w, false)
	for _, a := range []netip.Addr{iperfTarget, target6} {
		server, err := startProc("iperf3 server "+a.String(), filepath.Join(cfg.tmp, "iperf3-server-"+a.String()+".log"),
			inNS(e.w.NetPath, "taskset", "-c", "1", "iperf3", "-s", "-B", a.String(), "-p", "5201")...)
		if err != nil {
			return err
		}
		defer server.stop(5 * time.Second)
		time.Sleep(300 * time.Millisecond)
		if server.exited() {
			return fmt.Errorf("iperf3 server %s exited: %s", a, server.tail(5))
		}
	}
	load := func() error {
		if err := e.fw.Ensure(); err != nil {
			return err
		}
		if err := e.fw.AddSession(e.rules(client, static...)); err != nil {
			return err
		}
		for slot, added := 0, 1; added < cfg.dpSessions; slot++ {
			if slot == client.Slot {
				continue
			}
			if err := e.fw.AddSession(e.synthetic(slot)); err != nil {
				return err
			}
			added++
		}
		return nil
	}
	iperf := func(target netip.Addr) (float64, error) {
		g, _, err := iperfRun(ctx, cfg, client.NetnsPath, target)
		return g, err
	}
	floorTable := "bg" + e.w.ID
	floorRules := filepath.Join(cfg.tmp, "floor6.nft")
	err = os.WriteFile(floorRules, []byte(fmt.Sprintf(`table ip6 %s {
	chain forward {
		type filter hook forward priority 0; policy accept;
		ct state established,related accept
	}
	chain postrouting {
		type nat hook postrouting priority 100; policy accept;
		ip6 saddr %s oifname != "%s*" masquerade
	}
}
`, floorTable, benchPool6, e.prefix)), 0o644)
	if err != nil {
		return err
	}
	dropFloor := func() { run(ctx, 10*time.Second, inNS(e.w.HostPath, "nft", "delete", "table", "ip6", floorTable)...) }
	defer dropFloor()

	var ours6, ours4, none6, none4, floor6 []float64
	for r := 0; r < cfg.iperfReps; r++ {
		if err := e.fw.DeleteTable(); err != nil {
			return err
		}
		n4, err := iperf(iperfTarget)
		if err != nil {
			return fmt.Errorf("unfiltered v4: %w", err)
		}
		n6, err := iperf(target6)
		if err != nil {
			return fmt.Errorf("unfiltered v6: %w", err)
		}
		none4, none6 = append(none4, n4), append(none6, n6)
		if r == 0 { // the control of the refusal below
			if err := world.TCPEcho(client.NetnsPath, unlisted6, 2*time.Second); err != nil {
				return fmt.Errorf("control: without the table, %s: %w", unlisted6, err)
			}
		}
		if cfg.natFloor {
			if _, err := run(ctx, 10*time.Second, inNS(e.w.HostPath, "nft", "-f", floorRules)...); err != nil {
				return err
			}
			gf, err := iperf(target6)
			dropFloor()
			if err != nil {
				return fmt.Errorf("v6 conntrack+masquerade floor: %w", err)
			}
			floor6 = append(floor6, gf)
		}
		if err := load(); err != nil {
			return fmt.Errorf("load %d sessions: %w", cfg.dpSessions, err)
		}
		o6, err := iperf(target6)
		if err != nil {
			return fmt.Errorf("filtered v6: %w", err)
		}
		if r == 0 { // the v6 runs pass through the table: it refuses what it does not list
			if err := world.TCPEcho(client.NetnsPath, unlisted6, time.Second); err == nil {
				return fmt.Errorf("the table let the session reach %s, which its rules do not list", unlisted6)
			}
		}
		o4, err := iperf(iperfTarget)
		if err != nil {
			return fmt.Errorf("filtered v4: %w", err)
		}
		ours4, ours6 = append(ours4, o4), append(ours6, o6)
		logf("rep %d/%d: unfiltered v4 %.2f v6 %.2f Gbit/s; table with %d sessions v4 %.2f v6 %.2f Gbit/s",
			r+1, cfg.iperfReps, n4, n6, cfg.dpSessions, o4, o6)
	}
	r := Result{Name: "tcp6-throughput", Unit: "Gbit/s", Ours: median(ours6), Peer: median(ours4),
		Note:  fmt.Sprintf("ours = IPv6, peer = IPv4, both through the dual-stack table with %d sessions; no target", cfg.dpSessions),
		Floor: median(none6), FloorIs: "same-path-no-table-v6",
		Extra: []string{fmt.Sprintf("reps=%d", cfg.iperfReps), fmt.Sprintf("duration_s=%d", int(cfg.iperfDuration/time.Second)),
			"ours_all=" + joinFloats(ours6), "peer_all=" + joinFloats(ours4), "floor_all=" + joinFloats(none6),
			fmt.Sprintf("v4_no_table=%.2f", median(none4)), fmt.Sprintf("v4_vs_no_table=%.3f", median(ours4)/median(none4)),
			"pin=taskset-c1-both"}}
	if cfg.natFloor {
		r.Extra = append(r.Extra, fmt.Sprintf("v6_conntrack_masquerade=%.2f", median(floor6)),
			fmt.Sprintf("ours_vs_v6_conntrack_masquerade=%.3f", median(ours6)/median(floor6)))
	}
	rep.Add(r)
	return nil
}

// returnRoute6 adds (or removes) the route of the pool6 back to the
// simulated host from the simulated internet, for the runs without the
// table (no masquerade).
func returnRoute6(w *world.World, add bool) error {
	h, err := netlink.NewHandleAt(w.Net)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName("downlink")
	if err != nil {
		return err
	}
	route := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(benchPool6), Gw: w.Uplink6.AsSlice()}
	if add {
		return h.RouteReplace(route)
	}
	if err := h.RouteDel(route); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

// figDNS6 is figure 4 for a dual-stack daemon: dnsperf from inside one of
// its sessions (--name-check off, as figure 4's: the DNS path, not the check), AAAA queries to the proxy's IPv6 address (every answer
// attested into the session's v6 set) against A queries to its IPv4
// address, and both queried from the same session directly at the upstream
// (allowed to it by a static entry): the floor. AAAA queries to the v4
// address too (aaaa_over_v4_*), which tell the v6 transport's cost from
// the v6 attest's.
func figDNS6(ctx context.Context, cfg *config, rep *Report) error {
	section("4b. IPv6: DNS, AAAA through the dual-stack proxy vs A, dnsperf")
	if cfg.bin == "" {
		return fmt.Errorf("no enforcerd binary: set ENFORCERD_BIN (make bench builds it)")
	}
	w, err := world.Build()
	if err != nil {
		return fmt.Errorf("build world: %w", err)
	}
	de := &daemonEnv{w: w}
	defer de.Close()
	if err := w.EnableIPv6(); err != nil {
		return err
	}
	b := &dnsBench{cfg: cfg}
	if err := b.writeZone(); err != nil {
		return err
	}
	if err := writeZone6(cfg); err != nil {
		return err
	}
	up, err := startUpstream(cfg, w, "dns6-upstream.log")
	if err != nil {
		return err
	}
	defer up.stop(5 * time.Second)
	dir := filepath.Join(cfg.tmp, "dns6-daemon")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	de.d = enforcerd.New(cfg.bin, w, dir, "--pool6", benchPool6.String(), "--public-override", world.World6Prefix.String())
	de.d.Upstream = upstreamAddr.String()
	if err := de.d.Start(); err != nil {
		return fmt.Errorf("start enforcerd: %w", err)
	}
	de.c = newAPIClient(de.d.Client())
	req := ourSession("dnsperf")
	req.Allow = append(req.Allow, upstreamAddr.String()+"/udp")
	req.NameCheck = "off" // as figure 4's session: the figure is the DNS path, not the check
	info, err := de.c.c.Create(ctx, req)
	if err != nil {
		return fmt.Errorf("create the dnsperf session: %w\n%s", err, de.logTail())
	}
	b.client = "/run/netns/" + info.Netns
	dns4, err := netip.ParseAddr(info.DNS)
	if err != nil {
		return fmt.Errorf("the dnsperf session's resolver %q: %w", info.DNS, err)
	}
	dns6, err := netip.ParseAddr(info.DNS6)
	if err != nil {
		return fmt.Errorf("the dnsperf session's v6 resolver %q (--pool6 given): %w", info.DNS6, err)
	}
	b6 := *b
	b6.queries = filepath.Join(cfg.tmp, "queries6.txt")
	if err := b.waitAnswer(netip.AddrPortFrom(dns4, 53), nil); err != nil {
		return fmt.Errorf("enforcerd: %w\n%s", err, de.logTail())
	}
	if err := b.waitAnswer(netip.AddrPortFrom(dns6, 53), nil); err != nil {
		return fmt.Errorf("enforcerd over v6: %w\n%s", err, de.logTail())
	}
	// The AAAA answers carry their addresses (the figure measures them
	// attested, not emptied).
	m, err := world.Lookup(b.client, netip.AddrPortFrom(dns6, 53), "h0."+dnsZone, dns.TypeAAAA, false, 2*time.Second)
	if err != nil {
		return fmt.Errorf("AAAA h0.%s over v6: %w\n%s", dnsZone, err, de.logTail())
	}
	if got := world.Addrs6Of(m); len(got) != 1 {
		return fmt.Errorf("AAAA h0.%s over v6 = %v, want one address (answer %v)\n%s", dnsZone, got, m, de.logTail())
	}
	runs := map[string][]dnsRun{}
	for r := 0; r < cfg.dnsReps; r++ {
		for _, sc := range []struct {
			name   string
			b      *dnsBench
			server netip.AddrPort
		}{
			{"directA", b, upstreamAddr}, {"directAAAA", &b6, upstreamAddr},
			{"oursA", b, netip.AddrPortFrom(dns4, 53)}, {"oursAAAA", &b6, netip.AddrPortFrom(dns6, 53)},
			{"oursAAAAv4", &b6, netip.AddrPortFrom(dns4, 53)}, // AAAA over v4: the v6 transport's part apart from the v6 attest's
		} {
			if err := ctx.Err(); err != nil {
				return err
			}
			res, err := sc.b.measure(ctx, sc.server)
			if err != nil {
				return fmt.Errorf("%s: %w\n%s", sc.name, err, de.logTail())
			}
			if res.noerror < 0.99 {
				return fmt.Errorf("%s: only %.1f%% NOERROR answers (%s)", sc.name, 100*res.noerror, res.rcodes)
			}
			logf("rep %d/%d %-10s: %8.0f q/s (lost %s) | at %d q/s p50 %.3f p99 %.3f ms (n=%d, %s)",
				r+1, cfg.dnsReps, sc.name, res.qps, res.lost, cfg.dnsLatQPS, res.p50, res.p99, res.n, res.rcodes)
			runs[sc.name] = append(runs[sc.name], res)
		}
	}
	got, err := de.c.c.Inspect(ctx, "dnsperf")
	if err != nil {
		return err
	}
	var attested6 int
	for _, a := range got.Attested {
		if ip, err := netip.ParseAddr(a.IP); err == nil && ip.Is6() {
			attested6++
		}
	}
	if attested6 == 0 {
		return fmt.Errorf("no v6 address attested after the AAAA runs")
	}
	med := func(sc string, f func(dnsRun) float64) float64 { return dnsRunsMedian(runs[sc], f) }
	qps, p50, p99 := dnsRun.qpsOf, dnsRun.p50Of, dnsRun.p99Of
	common := []string{fmt.Sprintf("reps=%d", cfg.dnsReps), fmt.Sprintf("sat_s=%d", int(cfg.dnsSat/time.Second)),
		fmt.Sprintf("lat_s=%d", int(cfg.dnsLat/time.Second)), fmt.Sprintf("names=%d", cfg.dnsNames),
		"live_sessions=1", fmt.Sprintf("attested6=%d", attested6)}
	note := "ours = AAAA to the proxy's v6 address, peer = A to its v4 address; no target"
	rep.Add(Result{Name: "dns6-qps", Unit: "q/s", Ours: med("oursAAAA", qps), Peer: med("oursA", qps), Note: note,
		Floor: med("directAAAA", qps), FloorIs: "upstream-queried-directly-aaaa",
		Extra: append(slices.Clone(common), fmt.Sprintf("v4_floor_qps=%.0f", med("directA", qps)),
			fmt.Sprintf("aaaa_over_v4_qps=%.0f", med("oursAAAAv4", qps)),
			fmt.Sprintf("v4_floor_ratio=%.3f", med("oursA", qps)/med("directA", qps)))})
	for _, p := range []struct {
		name string
		f    func(dnsRun) float64
	}{{"p50", p50}, {"p99", p99}} {
		rep.Add(Result{Name: fmt.Sprintf("dns6-%s-at-%dqps", p.name, cfg.dnsLatQPS), Unit: "ms", Ours: med("oursAAAA", p.f),
			Peer: med("oursA", p.f), Note: note,
			Floor: med("directAAAA", p.f), FloorIs: "upstream-queried-directly-aaaa",
			Extra: append(slices.Clone(common), fmt.Sprintf("v4_floor_ms=%.3f", med("directA", p.f)),
				fmt.Sprintf("aaaa_over_v4_ms=%.3f", med("oursAAAAv4", p.f)))})
	}
	return nil
}

// writeZone6 adds an AAAA record (2001:2:0:2::/64, public in the dual-stack
// world) for every name of writeZone's zone, and writes the AAAA query file.
func writeZone6(cfg *config) error {
	var hosts, queries strings.Builder
	for i := 0; i < cfg.dnsNames; i++ {
		fmt.Fprintf(&hosts, "2001:2:0:2::%x h%d.%s\n", i+256, i, dnsZone)
		fmt.Fprintf(&queries, "h%d.%s AAAA\n", i, dnsZone)
	}
	f, err := os.OpenFile(filepath.Join(cfg.tmp, "zone.hosts"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(hosts.String()); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cfg.tmp, "queries6.txt"), []byte(queries.String()), 0o644)
}
