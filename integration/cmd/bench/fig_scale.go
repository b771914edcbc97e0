package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// figScale is figure 2: create p50 and attest p99 with many live sessions
// against the same with 10 live sessions. Every live session is a real
// session network (netns, veth, rules) with 8 attested addresses.
func figScale(ctx context.Context, cfg *config, rep *Report) error {
	section(fmt.Sprintf("2. scaling: create p50 and attest p99 with %d live sessions vs 10", cfg.scaleHigh))
	e, err := newNetEnv("b")
	if err != nil {
		return err
	}
	defer e.Close()
	probe, _, err := e.create("probe")
	if err != nil {
		return err
	}
	loaded := 0
	const ttl = 30 * time.Minute // outlives the run: nothing expires under the measurement
	grow := func(to int, budget time.Duration) (time.Duration, error) {
		start := time.Now()
		for loaded < to {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			if budget > 0 && time.Since(start) > budget {
				logf("growth budget %s used up at %d live sessions", budget, loaded)
				break
			}
			s, _, err := e.create(fmt.Sprintf("l%d", loaded))
			if err != nil {
				return 0, fmt.Errorf("grow to %d live sessions: %w", to, err)
			}
			if _, err := e.fw.Attest(s.Guest, world.PublicAddrs(8), ttl, nil); err != nil {
				return 0, err
			}
			loaded++
			if loaded%500 == 0 {
				logf("%d live sessions (%.1f/s)", loaded, float64(loaded)/time.Since(start).Seconds())
			}
		}
		return time.Since(start), nil
	}
	type level struct {
		live        int
		create, del splits
		att         Samples            // the same 4 addresses each time: known, after the first
		attNew      Samples            // a new address each time: always a kernel round trip
		steps       map[string]Samples // nsmgr.Create's steps
		sysctl      sysctlProbe
	}
	measure := func(tag string) (level, error) {
		lv := level{live: loaded + 1}
		e.clock.take()
		for i := 0; i < cfg.scaleProbes; i++ {
			name := fmt.Sprintf("m%s%d", tag, i)
			_, d, err := e.create(name)
			if err != nil {
				return lv, err
			}
			lv.create.add(d)
			if d, err = e.remove(name); err != nil {
				return lv, err
			}
			lv.del.add(d)
		}
		lv.steps = e.clock.take()
		st := e.m.PreparedStats()
		logf("prepared netns so far: %d creates claimed one, %d found the pool empty, %d preparations failed (%v)",
			st.Claimed, st.Fresh, st.Failures, st.LastErr)
		// The sysctl diagnostic, apart from the timed creates (its fresh
		// netns are torn down by the kernel in the background).
		for i := 0; i < 30; i++ {
			if err := lv.sysctl.sample(probe.NetnsPath); err != nil {
				return lv, err
			}
		}
		ips := world.PublicAddrs(4)
		for i := 0; i < cfg.attests; i++ {
			if err := ctx.Err(); err != nil {
				return lv, err
			}
			start := time.Now()
			if _, err := e.fw.Attest(probe.Guest, ips, ttl, nil); err != nil {
				return lv, err
			}
			lv.att = append(lv.att, time.Since(start))
		}
		// Attests the firewall cannot vouch for from what it knows: an
		// address never attested before (a range of its own per level),
		// so each waits for the kernel's ack.
		base := 100000
		if tag != "a" {
			base = 200000
		}
		fresh := world.PublicAddrs(base + cfg.attests)[base:]
		for i := 0; i < cfg.attests; i++ {
			if err := ctx.Err(); err != nil {
				return lv, err
			}
			start := time.Now()
			if _, err := e.fw.Attest(probe.Guest, fresh[i:i+1], ttl, nil); err != nil {
				return lv, err
			}
			lv.attNew = append(lv.attNew, time.Since(start))
		}
		logf("%d live: create p50 %.2f ms (nsmgr %.2f, netpolicy %.2f), delete p50 %.2f ms (nsmgr %.2f, netpolicy %.2f), attest p50 %.3f p99 %.3f ms",
			lv.live, lv.create.total.Pct(50), lv.create.net.Pct(50), lv.create.fw.Pct(50),
			lv.del.total.Pct(50), lv.del.net.Pct(50), lv.del.fw.Pct(50), lv.att.Pct(50), lv.att.Pct(99))
		return lv, nil
	}
	if _, err := grow(9, 0); err != nil {
		return err
	}
	low, err := measure("a")
	if err != nil {
		return err
	}
	took, err := grow(cfg.scaleHigh-1, cfg.scaleBudget)
	if err != nil {
		return err
	}
	logf("grew to %d live sessions in %s", loaded+1, took.Round(time.Millisecond))
	high, err := measure("b")
	if err != nil {
		return err
	}
	// Where the create time goes, step by step (nsmgr.CreateSteps order).
	worst, growth := "", 0.0
	for _, st := range nsmgr.CreateSteps {
		lo, hi := low.steps[st].Pct(50), high.steps[st].Pct(50)
		logf("  nsmgr step %-14s p50 %7.3f ms at %d live, %7.3f ms at %d live", st, lo, low.live, hi, high.live)
		if d := hi - lo; d > growth {
			worst, growth = st, d
		}
	}
	for _, lv := range []level{low, high} {
		logf("  in the probe session's netns with %d live: stat %s %.3f ms, write 1 to .../default/disable_ipv6 %.3f ms, to .../all/disable_ipv6 %.3f ms (p50)",
			lv.live, sysctlAll, lv.sysctl.stat.Pct(50), lv.sysctl.dflt.Pct(50), lv.sysctl.all.Pct(50))
		logf("  in a brand-new netns with %d live: first write to default %.3f ms, then all (0->1) %.3f ms, then all again %.3f ms (p50)",
			lv.live, lv.sysctl.newDflt.Pct(50), lv.sysctl.newAll.Pct(50), lv.sysctl.newAgain.Pct(50))
	}
	note := fmt.Sprintf("ours with %d live vs ours with %d live", high.live, low.live)
	extra := []string{fmt.Sprintf("live_high=%d", high.live), fmt.Sprintf("live_low=%d", low.live),
		fmt.Sprintf("probes=%d", cfg.scaleProbes), fmt.Sprintf("attests=%d", cfg.attests),
		fmt.Sprintf("grow_per_s=%.1f", float64(high.live-low.live)/math.Max(took.Seconds(), 1e-9))}
	if high.live < cfg.scaleHigh {
		note += fmt.Sprintf(" (wanted %d: growth budget used up)", cfg.scaleHigh)
	}
	name := fmt.Sprintf("scale%d", cfg.scaleHigh)
	rep.Add(Result{Name: name + "-create-p50", Unit: "ms", Ours: high.create.total.Pct(50), Peer: low.create.total.Pct(50),
		Goal: AtMost, Target: 1.3, Note: note, Extra: append(slices.Clone(extra),
			fmt.Sprintf("high_nsmgr_p50_ms=%.3f", high.create.net.Pct(50)), fmt.Sprintf("high_netpolicy_p50_ms=%.3f", high.create.fw.Pct(50)),
			fmt.Sprintf("low_nsmgr_p50_ms=%.3f", low.create.net.Pct(50)), fmt.Sprintf("low_netpolicy_p50_ms=%.3f", low.create.fw.Pct(50)),
			fmt.Sprintf("slowest_growing_step=%s", worst), fmt.Sprintf("its_growth_ms=%.3f", growth),
			fmt.Sprintf("sysctl_stat_p50_ms=%.3f/%.3f", low.sysctl.stat.Pct(50), high.sysctl.stat.Pct(50)),
			fmt.Sprintf("sysctl_write_default_p50_ms=%.3f/%.3f", low.sysctl.dflt.Pct(50), high.sysctl.dflt.Pct(50)),
			fmt.Sprintf("sysctl_write_all_p50_ms=%.3f/%.3f", low.sysctl.all.Pct(50), high.sysctl.all.Pct(50)),
			fmt.Sprintf("new_netns_first_write_default_p50_ms=%.3f/%.3f", low.sysctl.newDflt.Pct(50), high.sysctl.newDflt.Pct(50)),
			fmt.Sprintf("new_netns_then_all_p50_ms=%.3f/%.3f", low.sysctl.newAll.Pct(50), high.sysctl.newAll.Pct(50)))})
	rep.Add(Result{Name: name + "-attest-p99", Unit: "ms", Ours: high.attNew.Pct(99), Peer: low.attNew.Pct(99),
		Goal: AtMost, Target: 1.5, Note: note + "; a new address each time (a kernel round trip)", Extra: extra})
	rep.Add(Result{Name: name + "-attest-known-p99", Unit: "ms", Ours: high.att.Pct(99), Peer: low.att.Pct(99),
		Note: note + "; the same 4 addresses each time (known to be in the set: no round trip after the first); no target", Extra: extra})
	rep.Add(Result{Name: name + "-delete-p50", Unit: "ms", Ours: high.del.total.Pct(50), Peer: low.del.total.Pct(50),
		Note: note + "; no target", Extra: append(slices.Clone(extra),
			fmt.Sprintf("high_nsmgr_p50_ms=%.3f", high.del.net.Pct(50)), fmt.Sprintf("high_netpolicy_p50_ms=%.3f", high.del.fw.Pct(50)),
			fmt.Sprintf("low_nsmgr_p50_ms=%.3f", low.del.net.Pct(50)), fmt.Sprintf("low_netpolicy_p50_ms=%.3f", low.del.fw.Pct(50)))})
	logf("removing %d live sessions", len(e.live))
	return nil
}

const (
	sysctlAll     = "/proc/sys/net/ipv6/conf/all/disable_ipv6"
	sysctlDefault = "/proc/sys/net/ipv6/conf/default/disable_ipv6"
)

// sysctlProbe is a diagnostic of nsmgr's sysctl steps: inside a session
// netns it times a path lookup alone (stat), a write of "1" (the value the
// session already has) to .../default/disable_ipv6 (which the kernel
// handles without rtnl_lock) and to .../all/disable_ipv6 (which takes it
// with rtnl_trylock, restarting the syscall while it is held).
//
// It then writes in a brand-new anonymous netns of its own: default first
// (no lock, the first access to the netns's sysctls), then all (the 0 -> 1
// change, under rtnl), then all again (no change): the first writes in a
// new netns are where nsmgr's disable-ipv6 step spends its time.
type sysctlProbe struct{ stat, dflt, all, newAll, newDflt, newAgain Samples }

func (p *sysctlProbe) sample(nsPath string) error {
	if err := p.sampleNew(); err != nil {
		return err
	}
	return world.DoPath(nsPath, func() error {
		start := time.Now()
		if _, err := os.Stat(sysctlAll); err != nil {
			return err
		}
		p.stat = append(p.stat, time.Since(start))
		for _, w := range []struct {
			path string
			into *Samples
		}{{sysctlDefault, &p.dflt}, {sysctlAll, &p.all}} {
			start := time.Now()
			if err := os.WriteFile(w.path, []byte("1"), 0); err != nil {
				return err
			}
			*w.into = append(*w.into, time.Since(start))
		}
		return nil
	})
}

// sampleNew times the sysctl writes in a fresh netns (world.InNewNetns:
// the thread switches back and the netns goes away with its last
// reference).
func (p *sysctlProbe) sampleNew() error {
	return world.InNewNetns(func() error {
		for _, w := range []struct {
			path string
			into *Samples
		}{{sysctlDefault, &p.newDflt}, {sysctlAll, &p.newAll}, {sysctlAll, &p.newAgain}} {
			start := time.Now()
			if err := os.WriteFile(w.path, []byte("1"), 0); err != nil {
				return err
			}
			*w.into = append(*w.into, time.Since(start))
		}
		return nil
	})
}
