package main

import (
	"context"
	"fmt"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// figUpdate is figure 8: a running session's policy update through the
// daemon's API (PATCH adding one entry; PUT replacing a 100-entry policy
// with another), with 10 and with cfg.updHigh live sessions, beside a
// network-only session's create in the same run at both levels. The
// update is one session's: it must not grow with the number of sessions.
func figUpdate(ctx context.Context, cfg *config, rep *Report) error {
	section(fmt.Sprintf("8. policy update (add 1 entry, replace 100) with %d live sessions vs 10, create beside it", cfg.updHigh))
	return inDaemonEnv(cfg, "update", func(de *daemonEnv) error { return figUpdateIn(ctx, cfg, rep, de) })
}

// policy100 is a 100-entry allow list: 50 names and 50 addresses, disjoint
// between tags, so replacing one with the other changes every entry (and
// every static element in the table).
func policy100(tag int) []string {
	var allow []string
	for i := 0; i < 50; i++ {
		allow = append(allow, fmt.Sprintf("h%d.p%d.bench.test", i, tag))
		allow = append(allow, fmt.Sprintf("1.3.%d.%d/32", tag, i+1))
	}
	return allow
}

type updLevel struct {
	live                int
	create, add, revoke Samples
	replace             Samples
}

func figUpdateIn(ctx context.Context, cfg *config, rep *Report, de *daemonEnv) error {
	c := de.c
	const probe = "probe"
	if _, err := c.createNet(ctx, probe); err != nil {
		return err
	}
	call := func(what string, fn func(ctx context.Context) error) (time.Duration, error) {
		return timed(ctx, what, fn)
	}
	patch := func(u api.PolicyUpdate) (time.Duration, error) {
		return call("update "+probe, func(ctx context.Context) error { _, err := c.c.UpdatePolicy(ctx, probe, u); return err })
	}
	put := func(allow []string) (time.Duration, error) {
		return call("replace "+probe, func(ctx context.Context) error {
			_, err := c.c.ReplacePolicy(ctx, probe, api.PolicyUpdate{Allow: allow})
			return err
		})
	}
	g := &grower{c: c, others: 1, batch: 200, every: 1000} // others: the probe
	tag := 0
	measure := func(lvTag string) (updLevel, error) {
		lv := updLevel{live: g.live()}
		// The probe starts every level from a 100-entry policy, so each
		// timed replace swaps 100 entries for 100 others.
		tag = 1 - tag
		if _, err := put(policy100(tag)); err != nil {
			return lv, err
		}
		var err error
		if lv.create, err = timedCreates(ctx, c, "m"+lvTag, cfg.updCreates); err != nil {
			return lv, err
		}
		for i := 0; i < cfg.updN; i++ {
			entry := fmt.Sprintf("1.2.%d.%d/32", i/250, i%250+1)
			d, err := patch(api.PolicyUpdate{Allow: []string{entry}})
			if err != nil {
				return lv, err
			}
			lv.add = append(lv.add, d)
			if d, err = patch(api.PolicyUpdate{Revoke: []string{entry}}); err != nil {
				return lv, err
			}
			lv.revoke = append(lv.revoke, d)
		}
		for i := 0; i < cfg.updN; i++ {
			tag = 1 - tag
			d, err := put(policy100(tag))
			if err != nil {
				return lv, err
			}
			lv.replace = append(lv.replace, d)
		}
		logf("%d live: create p50 %.2f ms; update add-1 p50 %.2f p99 %.2f ms, revoke-1 p50 %.2f ms, replace-100 p50 %.2f p99 %.2f ms",
			lv.live, lv.create.Pct(50), lv.add.Pct(50), lv.add.Pct(99), lv.revoke.Pct(50), lv.replace.Pct(50), lv.replace.Pct(99))
		return lv, nil
	}
	// Warm: first-use costs (connections, the first update's record).
	for i := 0; i < 3; i++ {
		if _, err := put(policy100(i % 2)); err != nil {
			return err
		}
	}
	if _, err := g.to(ctx, 10, 0); err != nil {
		return err
	}
	low, err := measure("a")
	if err != nil {
		return err
	}
	took, err := g.to(ctx, cfg.updHigh, cfg.updBudget)
	if err != nil {
		return err
	}
	logf("grew to %d live sessions in %s", g.live(), took.Round(time.Millisecond))
	high, err := measure("b")
	if err != nil {
		return err
	}
	note := fmt.Sprintf("ours with %d live vs ours with %d live", high.live, low.live)
	if high.live < cfg.updHigh {
		note += fmt.Sprintf(" (wanted %d: growth budget used up)", cfg.updHigh)
	}
	extra := []string{fmt.Sprintf("live_high=%d", high.live), fmt.Sprintf("live_low=%d", low.live), fmt.Sprintf("n=%d", cfg.updN)}
	vsCreate := func(u Samples) []string {
		return []string{fmt.Sprintf("low_vs_create_p50=%.3f", u.Pct(50)/low.create.Pct(50))}
	}
	name := fmt.Sprintf("update%d", cfg.updHigh)
	rep.Add(Result{Name: name + "-add1-p50", Unit: "ms", Ours: high.add.Pct(50), Peer: low.add.Pct(50), Goal: AtMost, Target: 1.2,
		Note: note + "; PATCH adding one address entry", Extra: append(append(append([]string{}, extra...), vsCreate(low.add)...),
			fmt.Sprintf("high_p99_ms=%.3f", high.add.Pct(99)), fmt.Sprintf("low_p99_ms=%.3f", low.add.Pct(99)),
			fmt.Sprintf("revoke1_p50_ms=%.3f/%.3f", low.revoke.Pct(50), high.revoke.Pct(50)))})
	rep.Add(Result{Name: name + "-replace100-p50", Unit: "ms", Ours: high.replace.Pct(50), Peer: low.replace.Pct(50), Goal: AtMost, Target: 1.2,
		Note: note + "; PUT of 100 entries (50 names, 50 addresses) replacing 100 others", Extra: append(append(append([]string{}, extra...), vsCreate(low.replace)...),
			fmt.Sprintf("high_p99_ms=%.3f", high.replace.Pct(99)), fmt.Sprintf("low_p99_ms=%.3f", low.replace.Pct(99)))})
	rep.Add(Result{Name: name + "-create-p50", Unit: "ms", Ours: high.create.Pct(50), Peer: low.create.Pct(50),
		Note: note + "; create beside the updates, same run; no target here", Extra: []string{fmt.Sprintf("live_high=%d", high.live),
			fmt.Sprintf("live_low=%d", low.live), fmt.Sprintf("n=%d", cfg.updCreates),
			fmt.Sprintf("high_p99_ms=%.3f", high.create.Pct(99)), fmt.Sprintf("low_p99_ms=%.3f", low.create.Pct(99))}})
	return g.removeAll(ctx)
}
