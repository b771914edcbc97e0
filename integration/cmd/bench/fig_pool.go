package main

import (
	"context"
	"fmt"
	"time"
)

// figPool is figure 10: the daemon with its whole default pool live
// (10.20.0.0/16: 16,383 sessions of a /30 each), grown by 4 clients
// through the API, against the same daemon with 10 live. At both levels:
// cfg.poolCreates network-only creates (each deleted right after; the top
// leaves a free slot for each, since a deleted session's slot is
// quarantined until its veth is gone) and the daemon's VmRSS. The growth has a
// time budget; the figure names the level it reached.
func figPool(ctx context.Context, cfg *config, rep *Report) error {
	section(fmt.Sprintf("10. the whole pool: %d live sessions vs 10", cfg.poolHigh))
	return inDaemonEnv(cfg, "pool", func(de *daemonEnv) error { return figPoolIn(ctx, cfg, rep, de) })
}

type poolLevel struct {
	live   int
	create Samples
	rssKiB int
}

func figPoolIn(ctx context.Context, cfg *config, rep *Report, de *daemonEnv) error {
	c := de.c
	g := &grower{c: c, batch: 500, every: 2000}
	measure := func(tag string) (poolLevel, error) {
		lv := poolLevel{live: g.live()}
		var err error
		if lv.create, err = timedCreates(ctx, c, "m"+tag, cfg.poolCreates); err != nil {
			return lv, err
		}
		time.Sleep(time.Second) // let the heap settle before reading RSS
		rss, err := rssKiB(de.d.PID())
		if err != nil {
			return lv, err
		}
		lv.rssKiB = rss
		logf("%d live: create p50 %.2f ms p99 %.2f ms; daemon VmRSS %d KiB", lv.live, lv.create.Pct(50), lv.create.Pct(99), rss)
		return lv, nil
	}
	if _, err := timedCreates(ctx, c, "w", 3); err != nil { // warm: first-use costs
		return err
	}
	if _, err := g.to(ctx, 10, 0); err != nil {
		return err
	}
	low, err := measure("a")
	if err != nil {
		return err
	}
	// A deleted session's slot stays quarantined until its veth is gone,
	// so each timed create needs a slot of its own: the top leaves
	// poolCreates+1 free.
	top := cfg.poolHigh - cfg.poolCreates - 1
	took, err := g.to(ctx, top, cfg.poolBudget)
	if err != nil {
		return err
	}
	logf("grew to %d live sessions in %s", g.live(), took.Round(time.Millisecond))
	high, err := measure("b")
	if err != nil {
		return err
	}
	note := fmt.Sprintf("ours with %d live vs ours with %d live", high.live, low.live)
	if high.live < top {
		note += fmt.Sprintf(" (wanted %d: growth budget used up)", top)
	}
	extra := []string{fmt.Sprintf("live_high=%d", high.live), fmt.Sprintf("live_low=%d", low.live), fmt.Sprintf("n=%d", cfg.poolCreates),
		fmt.Sprintf("grow_s=%.1f", took.Seconds())}
	rep.Add(Result{Name: "pool-create-p50", Unit: "ms", Ours: high.create.Pct(50), Peer: low.create.Pct(50), Goal: AtMost, Target: 1.8,
		Note: note + "; network-only create through the API", Extra: append(append([]string{}, extra...),
			fmt.Sprintf("high_p99_ms=%.3f", high.create.Pct(99)), fmt.Sprintf("low_p99_ms=%.3f", low.create.Pct(99)))})
	perK := nan()
	if n := high.live - low.live; n > 0 {
		perK = float64(high.rssKiB-low.rssKiB) / 1024 / float64(n) * 1000
	}
	rep.Add(Result{Name: "pool-memory-per-1000", Unit: "MiB", Ours: perK, Peer: nan(), Goal: AtMost, Target: 16, Abs: true,
		Note: "daemon VmRSS growth per 1000 live sessions, from 10 to the high level", Extra: append(append([]string{}, extra...),
			fmt.Sprintf("rss_low_kib=%d", low.rssKiB), fmt.Sprintf("rss_high_kib=%d", high.rssKiB))})
	return g.removeAll(ctx)
}
