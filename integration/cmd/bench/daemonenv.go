package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/enforcerd/enforcerd/integration/enforcerd"
	"github.com/enforcerd/enforcerd/integration/world"
)

// daemonEnv is the enforcerd binary serving in a world of its own (figures
// 7, 8 and 9), driven through api.Client over its socket.
type daemonEnv struct {
	w *world.World
	d *enforcerd.Daemon
	c *apiClient
}

// startDaemonEnv builds a world and starts the daemon in its simulated host,
// its state under cfg.tmp/sub.
func startDaemonEnv(cfg *config, sub string) (de *daemonEnv, err error) {
	if cfg.bin == "" {
		return nil, fmt.Errorf("no enforcerd binary: set ENFORCERD_BIN (make bench builds it)")
	}
	w, err := world.Build()
	if err != nil {
		return nil, err
	}
	de = &daemonEnv{w: w}
	defer func() {
		if err != nil {
			de.Close()
			de = nil
		}
	}()
	dir := filepath.Join(cfg.tmp, sub)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return de, err
	}
	de.d = enforcerd.New(cfg.bin, w, dir)
	if err := de.d.Start(); err != nil {
		return de, err
	}
	// nsenter execs the daemon, so the PID we started is the daemon's own.
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", de.d.PID())); err != nil || strings.TrimSpace(string(comm)) != "enforcerd" {
		return de, fmt.Errorf("pid %d is not the enforcerd daemon (comm %q, %v)", de.d.PID(), comm, err)
	}
	de.c = newAPIClient(de.d.Client())
	return de, nil
}

// inDaemonEnv runs fn against a daemon in a world of its own (state under
// cfg.tmp/sub), closes both after, and adds the daemon's log tail to fn's
// error.
func inDaemonEnv(cfg *config, sub string, fn func(de *daemonEnv) error) error {
	de, err := startDaemonEnv(cfg, sub)
	if err != nil {
		return err
	}
	defer de.Close()
	if err := fn(de); err != nil {
		return fmt.Errorf("%w\ndaemon log tail:\n%s", err, de.logTail())
	}
	return nil
}

// grower grows a daemon's live network-only sessions, named g0, g1, ...,
// by 4 concurrent clients in batches; others counts the live sessions it
// did not make (a probe).
type grower struct {
	c      *apiClient
	made   int
	others int
	batch  int // sessions per parallel batch
	every  int // a progress line every this many live sessions
}

func (g *grower) live() int { return g.made + g.others }

// to grows to `to` live sessions, or until budget (0: none) is used up,
// and returns how long it took.
func (g *grower) to(ctx context.Context, to int, budget time.Duration) (time.Duration, error) {
	start, from := time.Now(), g.made
	for g.live() < to {
		if budget > 0 && time.Since(start) > budget {
			logf("growth budget %s used up at %d live sessions", budget, g.live())
			break
		}
		n := min(g.batch, to-g.live())
		base := g.made
		if _, err := parallel(ctx, n, func(i int) error {
			_, err := g.c.createNet(ctx, fmt.Sprintf("g%d", base+i))
			return err
		}); err != nil {
			return 0, fmt.Errorf("grow to %d live sessions: %w", to, err)
		}
		g.made += n
		if g.made/g.every != (g.made-n)/g.every { // crossed a multiple of every
			logf("%d live sessions (%.1f/s)", g.live(), float64(g.made-from)/time.Since(start).Seconds())
		}
	}
	return time.Since(start), nil
}

// timedCreates times n network-only creates named prefix0, prefix1, ...,
// each deleted right after (untimed), so the live count stays put.
func timedCreates(ctx context.Context, c *apiClient, prefix string, n int) (Samples, error) {
	var s Samples
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s%d", prefix, i)
		d, err := c.createNet(ctx, name)
		if err != nil {
			return s, err
		}
		s = append(s, d)
		if _, err := c.delete(ctx, name); err != nil {
			return s, err
		}
	}
	return s, nil
}

// removeAll deletes every session the grower made.
func (g *grower) removeAll(ctx context.Context) error {
	logf("removing %d live sessions", g.made)
	_, err := parallel(ctx, g.made, func(i int) error {
		_, err := g.c.delete(ctx, fmt.Sprintf("g%d", i))
		return err
	})
	return err
}

// logTail is the end of the daemon's log, for a figure's error.
func (de *daemonEnv) logTail() string { return lastLines(de.d.Log(), 10) }

// Close stops the daemon (SIGTERM to its PID), reaps what it left by its
// prefix, and removes the world.
func (de *daemonEnv) Close() {
	if de.d != nil {
		if err := de.d.Stop(); err != nil {
			logf("cleanup: stop enforcerd: %v", err)
		}
		if out, err := de.d.Reap(); err != nil {
			logf("cleanup: reap %s: %v: %s", de.d.Prefix, err, out)
		}
	}
	if err := de.w.Close(); err != nil {
		logf("cleanup: close world %s: %v", de.w.ID, err)
	}
}

// cpuNS is the CPU time (user and system, every thread) a process has used,
// from /proc/PID/task/*/schedstat (nanoseconds, unlike /proc/PID/stat's
// clock ticks). Threads that have already exited are not counted.
func cpuNS(pid int) (int64, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("no threads of pid %d: %v", pid, err)
	}
	var sum int64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited meanwhile
		}
		var ns int64
		if _, err := fmt.Sscan(string(b), &ns); err == nil {
			sum += ns
		}
	}
	return sum, nil
}

// pctOf is CPU time as a percentage of one CPU over wall.
func pctOf(cpu int64, wall time.Duration) float64 {
	return 100 * float64(cpu) / float64(wall.Nanoseconds())
}
