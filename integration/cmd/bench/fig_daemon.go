package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/integration/enforcerd"
	"github.com/enforcerd/enforcerd/integration/world"
)

// figDaemon is figure 6: the real enforcerd binary in a world's simulated
// host, driven through its API over the unix socket.
func figDaemon(ctx context.Context, cfg *config, rep *Report) error {
	section("6. through the daemon API: the enforcerd binary in the simulated host")
	if cfg.bin == "" {
		return fmt.Errorf("no enforcerd binary: set ENFORCERD_BIN (make bench builds it)")
	}
	w, err := world.Build()
	if err != nil {
		return err
	}
	defer w.Close()
	dir := filepath.Join(cfg.tmp, "daemon")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return err
	}
	d := enforcerd.New(cfg.bin, w, dir)
	if err := d.Start(); err != nil {
		return err
	}
	defer func() {
		if err := d.Stop(); err != nil {
			logf("cleanup: stop enforcerd: %v", err)
		}
		if out, err := d.Reap(); err != nil {
			logf("cleanup: reap %s: %v: %s", d.Prefix, err, out)
		}
	}()
	c := newAPIClient(d.Client())
	peer, err := newPtpPeer(w.Host, "pd"+w.ID, cfg.tmp)
	if err != nil {
		return err
	}
	defer peer.Close()
	f := &daemonFig{cfg: cfg, rep: rep, w: w, d: d, c: c, peer: peer}
	for _, step := range []func(context.Context) error{f.warm, f.memoryAndRate, f.latency, f.cliLatency, f.sandbox, f.churn} {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := step(ctx); err != nil {
			return fmt.Errorf("%w\ndaemon log tail:\n%s", err, lastLines(d.Log(), 10))
		}
	}
	return nil
}

type daemonFig struct {
	cfg  *config
	rep  *Report
	w    *world.World
	d    *enforcerd.Daemon
	c    *apiClient
	peer *ptpPeer
	next int // ptp session index
}

// warm creates and deletes a few sessions so first-use costs (connections,
// lazily built state) are paid before anything is measured.
func (f *daemonFig) warm(ctx context.Context) error {
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("w%d", i)
		if _, err := f.c.createNet(ctx, name); err != nil {
			return err
		}
		if _, err := f.c.delete(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// parallel runs fn(i) for i in [0, n) on 4 workers and returns the wall
// time.
func parallel(ctx context.Context, n int, fn func(i int) error) (time.Duration, error) {
	const workers = 4
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	next := make(chan int)
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := 0; i < n; i++ {
		select {
		case next <- i:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	took := time.Since(start)
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return took, err
}

// memoryAndRate creates cfg.memSessions network-only sessions with 4
// concurrent clients (sessions per second, against ptp ADD with 4
// concurrent runners), reads the daemon's RSS before and after (memory per
// 1000 live sessions: what n more cost on top of n kept live), and deletes
// them with 4 clients.
func (f *daemonFig) memoryAndRate(ctx context.Context) error {
	n := f.cfg.memSessions
	// nsenter execs the daemon, so the PID we started is the daemon's own.
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", f.d.PID())); err != nil || strings.TrimSpace(string(comm)) != "enforcerd" {
		return fmt.Errorf("pid %d is not the enforcerd daemon (comm %q, %v)", f.d.PID(), comm, err)
	}
	// The base: n sessions created and kept before the baseline, and the
	// figure is what n more cost. The first sessions also fill what the
	// daemon holds once, whatever its sessions: the collector's heap floor
	// (gctune, 32 MiB of garbage allowed) and the allocator's first arenas.
	// Measured from a fresh daemon, that one-off fill read as tens of MiB
	// "per 1000 sessions"; kept live (not created and deleted, whose freed
	// memory the next sessions would reuse and read as nearly free), the
	// base leaves the second n to pay their own way. The fill is printed
	// beside the figure.
	fresh, err := rssKiB(f.d.PID())
	if err != nil {
		return err
	}
	if _, err := parallel(ctx, n, func(i int) error {
		_, err := f.c.createNet(ctx, fmt.Sprintf("b%d", i))
		return err
	}); err != nil {
		return fmt.Errorf("base creates: %w", err)
	}
	time.Sleep(time.Second)
	before, err := rssKiB(f.d.PID())
	if err != nil {
		return err
	}
	took, err := parallel(ctx, n, func(i int) error {
		_, err := f.c.createNet(ctx, fmt.Sprintf("m%d", i))
		return err
	})
	if err != nil {
		return err
	}
	time.Sleep(time.Second) // let the runtime settle before reading RSS
	after, err := rssKiB(f.d.PID())
	if err != nil {
		return err
	}
	perK := float64(after-before) / 1024 / float64(n) * 1000
	logf("%d live sessions: daemon RSS %d -> %d KiB (%.2f MiB per 1000); created in %s (%.1f/s)",
		n, before, after, perK, took.Round(time.Millisecond), float64(n)/took.Seconds())
	f.rep.Add(Result{Name: "api-memory-per-1000", Unit: "MiB", Ours: perK, Peer: nan(), Goal: AtMost, Target: 16, Abs: true,
		Note: memNote(n),
		Extra: []string{fmt.Sprintf("live=%d+%d", n, n), fmt.Sprintf("rss_fresh_kib=%d", fresh), fmt.Sprintf("rss_before_kib=%d", before), fmt.Sprintf("rss_after_kib=%d", after),
			fmt.Sprintf("base_fill_mib=%.1f", float64(before-fresh)/1024)}})
	createRate := float64(n) / took.Seconds()

	dtook, err := parallel(ctx, n, func(i int) error {
		_, err := f.c.delete(ctx, fmt.Sprintf("m%d", i))
		return err
	})
	if err != nil {
		return err
	}
	deleteRate := float64(n) / dtook.Seconds()
	if _, err := parallel(ctx, n, func(i int) error {
		_, err := f.c.delete(ctx, fmt.Sprintf("b%d", i))
		return err
	}); err != nil {
		return fmt.Errorf("base deletes: %w", err)
	}

	// The peer: ptp ADD (then DEL) with 4 concurrent runners, each into a
	// netns made beforehand.
	pn, base := f.cfg.peerConc, f.next
	f.next += pn
	for i := 0; i < pn; i++ {
		if err := f.peer.NewNetns(ctx, base+i); err != nil {
			return err
		}
	}
	ptook, err := parallel(ctx, pn, func(i int) error { _, err := f.peer.Add(base + i); return err })
	if err != nil {
		return err
	}
	pdtook, err := parallel(ctx, pn, func(i int) error {
		if _, err := f.peer.Del(base + i); err != nil {
			return err
		}
		return f.peer.DelNetns(base + i)
	})
	if err != nil {
		return err
	}
	note := "CNI ptp ADD/DEL with 4 concurrent runners; no target"
	f.rep.Add(Result{Name: "api-creates-per-s-4-clients", Unit: "1/s", Ours: createRate, Peer: float64(pn) / ptook.Seconds(),
		Note: note, Extra: []string{fmt.Sprintf("ours_n=%d", n), fmt.Sprintf("peer_n=%d", pn)}})
	f.rep.Add(Result{Name: "api-deletes-per-s-4-clients", Unit: "1/s", Ours: deleteRate, Peer: float64(pn) / pdtook.Seconds(),
		Note: note + " (peer DEL includes removing its netns)", Extra: []string{fmt.Sprintf("ours_n=%d", n), fmt.Sprintf("peer_n=%d", pn)}})
	return nil
}

// latency: a network-only session's create and delete through the API
// against ptp ADD and DEL and the network floor (floor_net.go), interleaved
// one for one.
func (f *daemonFig) latency(ctx context.Context) error {
	n := f.cfg.apiN
	var oc, od, pc, pd, fc, fd Samples
	base := f.next
	f.next += n
	nf, err := newNetFloor(f.w.Host, "f"+f.w.ID[:5])
	if err != nil {
		return err
	}
	defer nf.Close()
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := f.peer.NewNetns(ctx, base+i); err != nil {
			return err
		}
		d, err := f.c.createNet(ctx, fmt.Sprintf("l%d", i))
		if err != nil {
			return err
		}
		oc = append(oc, d)
		if d, err = f.peer.Add(base + i); err != nil {
			return err
		}
		pc = append(pc, d)
		if d, err = nf.Create(i); err != nil {
			return err
		}
		fc = append(fc, d)
	}
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, err := f.c.delete(ctx, fmt.Sprintf("l%d", i))
		if err != nil {
			return err
		}
		od = append(od, d)
		if d, err = f.peer.Del(base + i); err != nil {
			return err
		}
		pd = append(pd, d)
		if err := f.peer.DelNetns(base + i); err != nil {
			return err
		}
		if d, err = nf.Delete(i); err != nil {
			return err
		}
		fd = append(fd, d)
	}
	note := "CNI ptp ADD/DEL (host-local), plugin exec only"
	// Where an API create's time goes: inside the daemon's Engine.Create
	// (its log's took=) and around it (the HTTP round trip, the request's
	// decoding, the reply).
	took := daemonCreateTookOf(f.d.Log(), "l")
	// Issue 25: create p50 <= the floor + 0.5 ms (no target on ptp); the
	// others keep issue 14's <= 0.15x ptp.
	for _, x := range []struct {
		op                string
		ours, peer, floor Samples
		p                 float64
		target, floorPlus float64
	}{{"create", oc, pc, fc, 50, 0, 0.5}, {"create", oc, pc, fc, 99, 0.15, 0},
		{"delete", od, pd, fd, 50, 0.15, 0}, {"delete", od, pd, fd, 99, 0.15, 0}} {
		extra := []string{fmt.Sprintf("n=%d", n)}
		if x.op == "create" {
			extra = append(extra, fmt.Sprintf("daemon_create_took_p%g_ms=%.3f", x.p, took.Pct(x.p)))
		}
		f.rep.Add(Result{Name: fmt.Sprintf("api-net-%s-p%g", x.op, x.p), Unit: "ms", Ours: x.ours.Pct(x.p), Peer: x.peer.Pct(x.p),
			Goal: AtMost, Target: x.target, Note: note,
			Floor: x.floor.Pct(x.p), FloorIs: "netlink-" + x.op + "-floor", FloorTarget: x.floorPlus, FloorPlus: true,
			Extra: extra})
	}
	return nil
}

// cliLatency: what a script or a plugin pays for one network-only
// session: one `enforcerctl session create --network-only` process (the
// thin client: its start, the API call, its output) against `ip netns add`
// plus one ptp ADD process; and one `enforcerctl session rm` process
// against ptp DEL plus `ip netns del`. Interleaved one for one, each
// exec'd from a thread in the simulated host. enforcerd's own client (the
// daemon's binary running the same command) is measured in the same loop,
// for reference: the RESULT line's enforcerd_*_ms fields.
func (f *daemonFig) cliLatency(ctx context.Context) error {
	if fi, err := os.Stat(f.cfg.ctlBin); f.cfg.ctlBin == "" || err != nil || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("no enforcerctl at %q (make build builds it; or set ENFORCERD_CTL_BIN)", f.cfg.ctlBin)
	}
	n := f.cfg.apiN
	var oc, od, pc, pd, ec, ed Samples
	base := f.next
	f.next += n
	cli := func(bin string, args ...string) (time.Duration, error) {
		cmd := f.d.ClientCommand(ctx, bin, args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		took, err := forkIn(f.w.Host, cmd)
		if err != nil {
			return 0, fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, out.String())
		}
		return took, nil
	}
	ipNetns := func(verb string, i int) (time.Duration, error) {
		cmd := exec.CommandContext(ctx, "ip", "netns", verb, f.peer.nsName(i))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		took, err := forkIn(f.w.Host, cmd)
		if err != nil {
			return 0, fmt.Errorf("ip netns %s %s: %w: %s", verb, f.peer.nsName(i), err, out.String())
		}
		return took, nil
	}
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, err := cli(f.cfg.ctlBin, "session", "create", "--network-only", fmt.Sprintf("c%d", i))
		if err != nil {
			return err
		}
		oc = append(oc, d)
		add, err := ipNetns("add", base+i)
		if err != nil {
			return err
		}
		f.peer.markNetns(base + i)
		d, err = f.peer.Add(base + i)
		if err != nil {
			return err
		}
		pc = append(pc, add+d)
		d, err = cli(f.cfg.bin, "session", "create", "--network-only", fmt.Sprintf("cd%d", i))
		if err != nil {
			return err
		}
		ec = append(ec, d)
	}
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, err := cli(f.cfg.ctlBin, "session", "rm", fmt.Sprintf("c%d", i))
		if err != nil {
			return err
		}
		od = append(od, d)
		d, err = f.peer.Del(base + i)
		if err != nil {
			return err
		}
		del, err := ipNetns("del", base+i)
		if err != nil {
			return err
		}
		f.peer.unmarkNetns(base + i)
		pd = append(pd, d+del)
		d, err = cli(f.cfg.bin, "session", "rm", fmt.Sprintf("cd%d", i))
		if err != nil {
			return err
		}
		ed = append(ed, d)
	}
	floor := spawnFloor(f.w.Host)
	for _, x := range []struct {
		op                   string
		ours, peer, enforcer Samples
		p                    float64
		note                 string
		target               float64
	}{
		{"create", oc, pc, ec, 50, "enforcerctl against `ip netns add` + CNI ptp ADD, two execs", 0.5},
		{"create", oc, pc, ec, 99, "enforcerctl against `ip netns add` + CNI ptp ADD, two execs", 0.5},
		{"delete", od, pd, ed, 50, "enforcerctl against CNI ptp DEL + `ip netns del`, two execs", 0.5},
		{"delete", od, pd, ed, 99, "enforcerctl against CNI ptp DEL + `ip netns del`, two execs", 0.5},
	} {
		f.rep.Add(Result{Name: fmt.Sprintf("cli-net-%s-p%g", x.op, x.p), Unit: "ms", Ours: x.ours.Pct(x.p), Peer: x.peer.Pct(x.p),
			Goal: AtMost, Target: x.target, Note: x.note, Floor: ms(floor), FloorIs: "fork-exec-true-in-host",
			Extra: []string{fmt.Sprintf("n=%d", n), fmt.Sprintf("spawn_floor_ms=%.2f", floor.Seconds()*1000),
				fmt.Sprintf("enforcerd_%s_p%g_ms=%.2f", x.op, x.p, x.enforcer.Pct(x.p))}})
	}
	return nil
}

// sandbox: a session with a sandbox (network, policy, DNS registration,
// sandbox) through the API against `runc run -d` of the same image alone,
// the creates in a rotating order (rotated).
func (f *daemonFig) sandbox(ctx context.Context) error {
	peer, err := newRuncPeer(ctx, f.cfg.tmp, f.cfg.rootfs, "rd"+f.w.ID)
	if err != nil {
		return err
	}
	defer peer.Close()
	lf := newSandboxFloor(f.cfg.tmp, f.cfg.rootfs, "ld"+f.w.ID)
	defer lf.Close()
	var oc, pc, fc Samples
	const warm = 1
	for i := 0; i < f.cfg.apiSandboxN+warm; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		name, id := fmt.Sprintf("x%d", i), fmt.Sprintf("%s-%d", peer.prefix, i)
		var dOurs, dPeer, dFloor time.Duration
		err := rotated(i, func() (err error) {
			dOurs, err = f.c.createSandbox(ctx, name, f.cfg.rootfs)
			return err
		}, func() (err error) {
			dPeer, err = peer.Run(id)
			return err
		}, func() (err error) {
			dFloor, err = lf.Run(name)
			return err
		})
		if err != nil {
			return err
		}
		if _, err := f.c.delete(ctx, name); err != nil {
			return err
		}
		if _, err := peer.Delete(id); err != nil {
			return err
		}
		if _, err := lf.Destroy(name); err != nil {
			return err
		}
		if i >= warm {
			oc, pc, fc = append(oc, dOurs), append(pc, dPeer), append(fc, dFloor)
		}
	}
	f.rep.Add(Result{Name: "api-sandbox-session-create-p50", Unit: "ms", Ours: oc.Pct(50), Peer: pc.Pct(50),
		Goal: AtMost, Target: 1.1, Note: "runc run -d of the same image alone",
		Floor: fc.Pct(50), FloorIs: "libcontainer-create-start-runc-spec",
		Extra: []string{fmt.Sprintf("n=%d", len(oc)), fmt.Sprintf("ours_p99_ms=%.3f", oc.Pct(99)), fmt.Sprintf("peer_p99_ms=%.3f", pc.Pct(99))}})
	return nil
}

// churn: cfg.churn creates and deletes by 4 concurrent clients, each
// deleting what it created; then every kind of residue is counted.
func (f *daemonFig) churn(ctx context.Context) error {
	n := f.cfg.churn
	took, err := parallel(ctx, n, func(i int) error {
		name := fmt.Sprintf("c%d", i)
		if _, err := f.c.createNet(ctx, name); err != nil {
			return err
		}
		_, err := f.c.delete(ctx, name)
		return err
	})
	if err != nil {
		return err
	}
	r, wait, err := countResidue(ctx, f.w, f.d)
	if err != nil {
		return err
	}
	logf("churn of %d creates+deletes in %s; residue: %s (veths gone after %s)", n, took.Round(time.Millisecond), r, wait.Round(time.Millisecond))
	f.rep.Add(Result{Name: "api-churn-residue", Unit: "objects", Ours: float64(r.total()), Peer: nan(), Goal: AtMost, Target: 0, Abs: true,
		Note: fmt.Sprintf("after %d creates+deletes by 4 clients; must be 0; %s", n, r),
		Extra: []string{fmt.Sprintf("churn=%d", n), fmt.Sprintf("netns=%d", r.netns), fmt.Sprintf("links=%d", r.links),
			fmt.Sprintf("records=%d", r.records), fmt.Sprintf("nft_session_elements=%d", r.elements),
			fmt.Sprintf("sandbox_dirs=%d", r.sandboxes), fmt.Sprintf("wall_s=%.1f", took.Seconds()),
			fmt.Sprintf("veth_gone_after_ms=%d", wait.Milliseconds())}})
	return nil
}

// memNote says what the memory figure is; below 1000 sessions (a quick run)
// it is extrapolated, and fixed costs make it read high.
func memNote(n int) string {
	note := "daemon RSS delta per 1000 live network-only sessions, created on top of as many kept live (their one-off fill: base_fill_mib); no peer"
	if n < 1000 {
		note += fmt.Sprintf(" (extrapolated from %d sessions: reads high)", n)
	}
	return note
}
