package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// The name check's figure (BENCH_ONLY=namecheck): one daemon in a world
// whose shared address (world.ServeShared) serves the allowed name and
// another; sessions allowed the name with the check on and with it off
// (--name-check off), side by side in the same run.
const (
	ncBenchName  = "pkgs.example.org"
	ncBenchOther = "evil.example"
	ncIperfPort  = 5201
)

// ncSizes sizes the figure; quick shrinks it to a smoke run. (Kept here,
// not in config, so the figure is one file.)
type ncSizes struct {
	setupN    int           // connections timed per arm and kind (tls, http)
	cpuN      int           // connections per arm for the CPU figure
	iperfReps int           // interleaved iperf3 runs per arm
	iperfDur  time.Duration // one iperf3 run
	floodN    int           // new connections of the flooding session
	floodConc int           // its concurrent connections
	probeN    int           // the other session's probes, quiet and under the flood
}

func nameCheckSizes(cfg *config) ncSizes {
	if cfg.quick {
		return ncSizes{setupN: 100, cpuN: 300, iperfReps: 1, iperfDur: 2 * time.Second, floodN: 2000, floodConc: 32, probeN: 50}
	}
	return ncSizes{setupN: 1000, cpuN: 2000, iperfReps: 7, iperfDur: 5 * time.Second, floodN: 10000, floodConc: 32, probeN: 200}
}

// figNameCheck is the name check's figure: connection setup (TCP connect
// to the first answer byte, TLS and plain HTTP) with the check against
// without it, the daemon's CPU per 1,000 checked connections against
// 1,000 unchecked ones, an established checked flow's throughput
// (iperf3; its first bytes are neither TLS nor HTTP, so the flow is
// checked, passes, and then takes the kernel path) against an unchecked
// one, and another session's check latency while one session opens
// floodN new checked connections (fairness).
func figNameCheck(ctx context.Context, cfg *config, rep *Report) error {
	section("11. the name check: connection setup, CPU, established throughput, fairness under a flood")
	return inDaemonEnv(cfg, "namecheck", func(de *daemonEnv) error { return figNameCheckIn(ctx, cfg, rep, de) })
}

// ncSession is one session of the figure, with its netns path.
type ncSession struct {
	name string
	ns   string
}

func figNameCheckIn(ctx context.Context, cfg *config, rep *Report, de *daemonEnv) error {
	sz := nameCheckSizes(cfg)
	shared, err := de.w.ServeShared(ncBenchName, ncBenchOther)
	if err != nil {
		return err
	}
	for _, n := range []string{ncBenchName, ncBenchOther} {
		de.w.DNS.AddRR(n + ". 300 IN A " + shared.Addr.String())
	}
	mk := func(name, check string) (ncSession, error) {
		info, err := de.d.Client().Create(ctx, api.CreateRequest{Name: name, NetworkOnly: true,
			Allow: []string{ncBenchName}, NameCheck: check})
		if err != nil {
			return ncSession{}, fmt.Errorf("create %s: %w", name, err)
		}
		ns := info.Netns
		if !filepath.IsAbs(ns) {
			ns = filepath.Join(world.NetnsDir, ns)
		}
		resolver, err := netip.ParseAddr(info.DNS)
		if err != nil {
			return ncSession{}, fmt.Errorf("session %s: resolver %q: %w", name, info.DNS, err)
		}
		m, err := world.Lookup(ns, netip.AddrPortFrom(resolver, 53), ncBenchName, dns.TypeA, false, 3*time.Second)
		if err != nil {
			return ncSession{}, fmt.Errorf("session %s: look up %s: %w", name, ncBenchName, err)
		}
		if got := world.AddrsOf(m); len(got) != 1 || got[0] != shared.Addr {
			return ncSession{}, fmt.Errorf("session %s: %s is %v, want %s", name, ncBenchName, got, shared.Addr)
		}
		return ncSession{name: name, ns: ns}, nil
	}
	checked, err := mk("checked", "tls")
	if err != nil {
		return err
	}
	unchecked, err := mk("unchecked", "off")
	if err != nil {
		return err
	}
	flooder, err := mk("flood", "tls")
	if err != nil {
		return err
	}
	flooderOff, err := mk("floodoff", "off")
	if err != nil {
		return err
	}
	tlsAt := netip.AddrPortFrom(shared.Addr, world.SharedTLSPort)
	httpAt := netip.AddrPortFrom(shared.Addr, world.SharedHTTPPort)
	tlsConf := &tls.Config{ServerName: ncBenchName, RootCAs: shared.CA, MinVersion: tls.VersionTLS13}
	want := "served " + ncBenchName + "\n"
	fetchTLS := func(s ncSession) (time.Duration, error) {
		start := time.Now()
		body, err := world.TLSFetch(s.ns, tlsAt, tlsConf, world.HelloPlan{}, ncBenchName, 5*time.Second)
		if err == nil && body != want {
			err = fmt.Errorf("tls fetch from %s: %q, want %q", s.name, body, want)
		}
		return time.Since(start), err
	}
	fetchHTTP := func(s ncSession) (time.Duration, error) {
		start := time.Now()
		body, err := world.HTTPFetch(s.ns, httpAt, ncBenchName, 5*time.Second)
		if err == nil && body != want {
			err = fmt.Errorf("http fetch from %s: %q, want %q", s.name, body, want)
		}
		return time.Since(start), err
	}
	// The check must be on for one session and off for the other, or the
	// figure measures nothing: fronting is refused by one, served by the
	// other.
	other := &tls.Config{ServerName: ncBenchOther, RootCAs: shared.CA, MinVersion: tls.VersionTLS13}
	if _, err := world.TLSFetch(checked.ns, tlsAt, other, world.HelloPlan{}, ncBenchOther, 5*time.Second); err == nil {
		return fmt.Errorf("session checked: fronting %s was served: the check is not on", ncBenchOther)
	}
	if _, err := world.TLSFetch(unchecked.ns, tlsAt, other, world.HelloPlan{}, ncBenchOther, 5*time.Second); err != nil {
		return fmt.Errorf("session unchecked (--name-check off): fronting %s: %v, want served", ncBenchOther, err)
	}
	counts := func(s ncSession) (api.NameCheckView, error) {
		info, err := de.d.Client().Inspect(ctx, s.name)
		if err != nil || info.NameCheck == nil {
			return api.NameCheckView{}, fmt.Errorf("inspect %s: name_check %v: %v", s.name, info.NameCheck, err)
		}
		return *info.NameCheck, nil
	}

	// Connection setup, the arms interleaved.
	for _, kind := range []struct {
		name  string
		fetch func(ncSession) (time.Duration, error)
	}{{"tls", fetchTLS}, {"http", fetchHTTP}} {
		before, err := counts(checked)
		if err != nil {
			return err
		}
		var on, off Samples
		for i := 0; i < sz.setupN; i++ {
			d, err := kind.fetch(checked)
			if err != nil {
				return err
			}
			on = append(on, d)
			if d, err = kind.fetch(unchecked); err != nil {
				return err
			}
			off = append(off, d)
		}
		after, err := counts(checked)
		if err != nil {
			return err
		}
		if n := after.Allowed - before.Allowed; n < uint64(sz.setupN) {
			return fmt.Errorf("setup %s: the check allowed %d of %d flows: it did not see them", kind.name, n, sz.setupN)
		}
		for _, p := range []float64{50, 99} {
			rep.Add(Result{Name: fmt.Sprintf("namecheck-setup-%s-p%.0f", kind.name, p), Unit: "ms",
				Ours: on.Pct(p), Peer: off.Pct(p),
				Note:  "connect to first answer byte; peer = the same session policy with --name-check off",
				Extra: []string{fmt.Sprintf("n=%d", sz.setupN)}})
		}
		logf("setup %s: p50 %.3f ms checked, %.3f ms unchecked; p99 %.3f / %.3f ms",
			kind.name, on.Pct(50), off.Pct(50), on.Pct(99), off.Pct(99))
	}

	// The daemon's CPU per 1,000 connections, checked and unchecked (the
	// unchecked arm holds what every new flow costs it anyway: the ledger,
	// conntrack events).
	pid := de.d.PID()
	cpuPer1000 := func(s ncSession) (float64, error) {
		c0, err := cpuNS(pid)
		if err != nil {
			return 0, err
		}
		for i := 0; i < sz.cpuN; i++ {
			if _, err := fetchHTTP(s); err != nil {
				return 0, err
			}
		}
		c1, err := cpuNS(pid)
		if err != nil {
			return 0, err
		}
		return float64(c1-c0) / 1e6 * 1000 / float64(sz.cpuN), nil
	}
	cpuOn, err := cpuPer1000(checked)
	if err != nil {
		return err
	}
	cpuOff, err := cpuPer1000(unchecked)
	if err != nil {
		return err
	}
	rep.Add(Result{Name: "namecheck-cpu-per-1000", Unit: "ms", Ours: cpuOn, Peer: cpuOff,
		Note:  "daemon CPU per 1,000 new HTTP connections; peer = --name-check off",
		Extra: []string{fmt.Sprintf("n=%d", sz.cpuN), fmt.Sprintf("check_ms_per_1000=%.1f", cpuOn-cpuOff)}})
	logf("daemon CPU per 1,000 connections: %.1f ms checked, %.1f ms unchecked", cpuOn, cpuOff)

	if err := ncThroughput(ctx, cfg, sz, rep, de, shared.Addr, checked, unchecked, counts); err != nil {
		return err
	}
	return ncFairness(ctx, sz, rep, checked, flooder, flooderOff, fetchHTTP, counts)
}

// ncThroughput runs iperf3 from each session to the shared address
// (admitted by the name on every port), interleaved; the checked
// session's flows are checked (iperf3's cookie passes: neither TLS nor
// HTTP) and then take the kernel path.
func ncThroughput(ctx context.Context, cfg *config, sz ncSizes, rep *Report, de *daemonEnv, addr netip.Addr,
	checked, unchecked ncSession, counts func(ncSession) (api.NameCheckView, error)) error {
	server, err := startProc("iperf3 server", filepath.Join(cfg.tmp, "namecheck-iperf3.log"),
		inNS(de.w.NetPath, "taskset", "-c", "1", "iperf3", "-s", "-B", addr.String(), "-p", fmt.Sprint(ncIperfPort))...)
	if err != nil {
		return err
	}
	defer server.stop(5 * time.Second)
	time.Sleep(300 * time.Millisecond)
	if server.exited() {
		return fmt.Errorf("iperf3 server exited: %s", server.tail(5))
	}
	iperf := func(s ncSession) (float64, error) {
		out, err := run(ctx, sz.iperfDur+30*time.Second, inNS(s.ns, "taskset", "-c", "1",
			"iperf3", "-c", addr.String(), "-p", fmt.Sprint(ncIperfPort), "-t", fmt.Sprint(int(sz.iperfDur/time.Second)), "-J")...)
		if err != nil {
			return 0, err
		}
		var res struct {
			End struct {
				Received struct {
					BPS float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			return 0, fmt.Errorf("iperf3 json: %w: %s", err, lastLines(out, 5))
		}
		return res.End.Received.BPS / 1e9, nil
	}
	before, err := counts(checked)
	if err != nil {
		return err
	}
	var on, off []float64
	for r := 0; r < sz.iperfReps; r++ {
		g, err := iperf(unchecked)
		if err != nil {
			return fmt.Errorf("unchecked: %w", err)
		}
		off = append(off, g)
		g2, err := iperf(checked)
		if err != nil {
			return fmt.Errorf("checked: %w", err)
		}
		on = append(on, g2)
		logf("rep %d/%d: unchecked %.2f Gbit/s, checked %.2f Gbit/s", r+1, sz.iperfReps, g, g2)
	}
	after, err := counts(checked)
	if err != nil {
		return err
	}
	if after.Passed-before.Passed < uint64(sz.iperfReps) {
		return fmt.Errorf("throughput: the check passed %d flows over %d iperf3 runs: it did not see them",
			after.Passed-before.Passed, sz.iperfReps)
	}
	rep.Add(Result{Name: "namecheck-throughput", Unit: "Gbit/s", Ours: median(on), Peer: median(off), Goal: AtLeast, Target: 0.99,
		Note: "one established TCP stream (iperf3) after the check passed it; peer = --name-check off",
		Extra: []string{fmt.Sprintf("reps=%d", sz.iperfReps), fmt.Sprintf("duration_s=%d", int(sz.iperfDur/time.Second)),
			"ours_all=" + joinFloats(on), "peer_all=" + joinFloats(off), "pin=taskset-c1-both"}})
	return nil
}

// ncFairness times the checked session's HTTP connections (each checked)
// while a flooding session opens sz.floodN new connections, sz.floodConc
// at a time: ours while the flood's connections are checked too, the
// peer while the same flood comes from a session with the check off (the
// same load on the machine, nothing more for the check's queue). The
// probes with no flood at all are an extra column.
func ncFairness(ctx context.Context, sz ncSizes, rep *Report, probe, flooder, flooderOff ncSession,
	fetch func(ncSession) (time.Duration, error), counts func(ncSession) (api.NameCheckView, error)) error {
	probes := func(stop func() bool) (Samples, error) {
		var s Samples
		for i := 0; i < sz.probeN && !stop(); i++ {
			d, err := fetch(probe)
			if err != nil {
				return s, err
			}
			s = append(s, d)
			time.Sleep(10 * time.Millisecond)
		}
		return s, nil
	}
	quiet, err := probes(func() bool { return false })
	if err != nil {
		return fmt.Errorf("quiet probes: %w", err)
	}
	type floodResult struct {
		probes  Samples
		failed  int64
		checked uint64
		perS    float64
	}
	flood := func(from ncSession) (floodResult, error) {
		var r floodResult
		before, err := counts(from)
		if err != nil {
			return r, err
		}
		var next, failed atomic.Int64
		var done atomic.Bool
		var wg sync.WaitGroup
		start := time.Now()
		for w := 0; w < sz.floodConc; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(sz.floodN) && ctx.Err() == nil {
					if _, err := fetch(from); err != nil {
						failed.Add(1)
					}
				}
			}()
		}
		go func() { wg.Wait(); done.Store(true) }()
		loaded, perr := probes(done.Load)
		wg.Wait()
		took := time.Since(start)
		if perr != nil {
			return r, fmt.Errorf("probes under the flood from %s: %w", from.name, perr)
		}
		after, err := counts(from)
		if err != nil {
			return r, err
		}
		if len(loaded) < 5 {
			return r, fmt.Errorf("only %d probes ran during the flood from %s (%s): too short to measure",
				len(loaded), from.name, took.Round(time.Millisecond))
		}
		r = floodResult{probes: loaded, failed: failed.Load(), checked: after.Checked - before.Checked,
			perS: float64(sz.floodN) / took.Seconds()}
		logf("flood from %s: %d connections at %.0f/s, %d failed, %d checked; probe p50 %.3f ms, p99 %.3f ms",
			from.name, sz.floodN, r.perS, r.failed, r.checked, loaded.Pct(50), loaded.Pct(99))
		return r, nil
	}
	off, err := flood(flooderOff)
	if err != nil {
		return err
	}
	on, err := flood(flooder)
	if err != nil {
		return err
	}
	if on.checked < uint64(sz.floodN)/2 {
		return fmt.Errorf("the checked flood: the check decided %d of %d flows", on.checked, sz.floodN)
	}
	extra := []string{fmt.Sprintf("flood_conns=%d", sz.floodN), fmt.Sprintf("flood_conc=%d", sz.floodConc),
		fmt.Sprintf("flood_per_s=%.0f", on.perS), fmt.Sprintf("flood_failed=%d", on.failed),
		fmt.Sprintf("flood_checked=%d", on.checked), fmt.Sprintf("peer_flood_per_s=%.0f", off.perS),
		fmt.Sprintf("quiet_p50_ms=%.3f", quiet.Pct(50)), fmt.Sprintf("quiet_p99_ms=%.3f", quiet.Pct(99)),
		fmt.Sprintf("probes=%d,%d,%d", len(quiet), len(on.probes), len(off.probes))}
	rep.Add(Result{Name: "namecheck-fairness-p50", Unit: "ms", Ours: on.probes.Pct(50), Peer: off.probes.Pct(50), Goal: AtMost, Target: 2,
		Note:  "another session's checked connection setup during a checked flood; peer = during the same flood unchecked",
		Extra: extra})
	rep.Add(Result{Name: "namecheck-fairness-p99", Unit: "ms", Ours: on.probes.Pct(99), Peer: off.probes.Pct(99),
		Note: "as above, p99; no target (2 CPUs shared with the flooder and the servers)"})
	return nil
}
