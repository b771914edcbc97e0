package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// floodHelperArg makes this binary figure 7's flooding session: run in a
// session's netns, it sends one UDP datagram after another, each a new flow
// (the destination address and port change every packet), to a range the
// session's policy does not allow, as fast as one thread can, and prints
// what it sent.
const floodHelperArg = "flood-udp"

// floodDst is where the flood goes: inside the world's public override
// (198.18.0.0/15, public to the daemon's guard), allowed to no session, so
// every packet is a new flow dropped as not-allowed.
var floodDst = netip.MustParsePrefix("198.19.0.0/16")

func floodHelperMain(args []string) int {
	fs := flag.NewFlagSet(floodHelperArg, flag.ContinueOnError)
	dst := fs.String("dst", floodDst.String(), "destination range (IPv4)")
	dur := fs.Duration("duration", 5*time.Second, "how long to send")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	p, err := netip.ParsePrefix(*dst)
	if err != nil || !p.Addr().Is4() || p.Bits() > 30 {
		fmt.Fprintln(os.Stderr, floodHelperArg+": -dst: want an IPv4 prefix of /30 or wider")
		return 2
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, floodHelperArg+":", err)
		return 1
	}
	defer unix.Close(fd)
	b := p.Masked().Addr().As4()
	base := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	hosts := uint32(1)<<(32-p.Bits()) - 2
	payload := make([]byte, 18)
	var sent, failed uint64
	sa := &unix.SockaddrInet4{}
	start := time.Now()
	deadline := start.Add(*dur)
	for i := uint32(0); ; i++ {
		if i&1023 == 0 && time.Now().After(deadline) {
			break
		}
		a := base + 1 + i%hosts
		sa.Addr = [4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}
		sa.Port = 1024 + int(i%60000)
		if err := unix.Sendto(fd, payload, 0, sa); err != nil {
			failed++
		} else {
			sent++
		}
	}
	fmt.Printf("sent=%d failed=%d elapsed_ns=%d\n", sent, failed, time.Since(start).Nanoseconds())
	return 0
}

// floodRun is one flood, as the flooder and the table saw it.
type floodRun struct {
	sent, drops, unlogged uint64
	elapsed               time.Duration
	daemonCPU             int64 // ns, over the flood
}

func (r floodRun) dropsPerS() float64 { return float64(r.drops) / r.elapsed.Seconds() }

// figDropLog is figure 7: the drop path under a flood of denied new flows.
// The enforcerd binary serves in a world; one session (beside
// cfg.floodLive others) floods new flows to a range its policy does not
// allow, from one thread pinned to CPU 1. Each repetition floods twice:
// once with the daemon reading the drop log (as it always does), once with
// the daemon stopped (SIGSTOP to its PID, SIGCONT after), so nothing reads
// the log; the table is the same, its reason chains and per-session log
// budget included (it has no variant without them). Drops per second are
// the table's own count (inspect's dropped_by_reason), over the flooder's
// sending time. The daemon's CPU is measured over the flood it reads, and
// over as long a window with no flood (its idle floor).
func figDropLog(ctx context.Context, cfg *config, rep *Report) error {
	section("7. drop path under a flood of denied new flows: the daemon reading the drop log vs not reading it")
	return inDaemonEnv(cfg, "droplog", func(de *daemonEnv) error { return figDropLogIn(ctx, cfg, rep, de) })
}

func figDropLogIn(ctx context.Context, cfg *config, rep *Report, de *daemonEnv) error {
	c, pid := de.c, de.d.PID()
	if _, err := parallel(ctx, cfg.floodLive, func(i int) error {
		_, err := c.createNet(ctx, fmt.Sprintf("f%d", i))
		return err
	}); err != nil {
		return err
	}
	const name = "flood"
	if _, err := c.createNet(ctx, name); err != nil {
		return err
	}
	info, err := c.c.Inspect(ctx, name)
	if err != nil {
		return err
	}
	nsPath := info.Netns // a name under world.NetnsDir, or (attached) a path
	if nsPath == "" {
		return fmt.Errorf("session %s has no netns", name)
	}
	if !filepath.IsAbs(nsPath) {
		nsPath = filepath.Join(world.NetnsDir, nsPath)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	stopped := false
	cont := func() {
		if stopped {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				logf("SIGCONT enforcerd (pid %d): %v", pid, err)
			}
			stopped = false
		}
	}
	defer cont()

	counters := func() (drops, unlogged uint64, err error) {
		in, err := c.c.Inspect(ctx, name)
		if err != nil {
			return 0, 0, err
		}
		return in.Counters.DroppedByReason["not-allowed"], in.Counters.DropsNotLogged, nil
	}
	flood := func(stop bool) (floodRun, error) {
		var r floodRun
		d0, u0, err := counters()
		if err != nil {
			return r, err
		}
		if stop {
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				return r, err
			}
			stopped = true
		}
		cpu0, err := cpuNS(pid)
		if err != nil {
			return r, err
		}
		out, err := run(ctx, cfg.floodDuration+30*time.Second, inNS(nsPath, "taskset", "-c", "1",
			self, floodHelperArg, "-dst", floodDst.String(), "-duration", cfg.floodDuration.String())...)
		if err != nil {
			return r, err
		}
		cpu1, err := cpuNS(pid)
		if err != nil {
			return r, err
		}
		r.daemonCPU = cpu1 - cpu0
		cont()
		var failed uint64
		var ns int64
		if _, err := fmt.Sscanf(strings.TrimSpace(out), "sent=%d failed=%d elapsed_ns=%d", &r.sent, &failed, &ns); err != nil {
			return r, fmt.Errorf("flooder output %q: %w", out, err)
		}
		r.elapsed = time.Duration(ns)
		// The counters are the kernel's: exact, whether or not the daemon
		// read the log meanwhile.
		d1, u1, err := counters()
		if err != nil {
			return r, err
		}
		r.drops, r.unlogged = d1-d0, u1-u0
		if r.drops == 0 || r.drops > r.sent {
			return r, fmt.Errorf("the table counted %d not-allowed drops for %d packets sent", r.drops, r.sent)
		}
		return r, nil
	}
	// settle waits for the daemon's unlogged poll to go quiet (it runs
	// while lines arrived in the last 2 s) and the log budget to refill.
	settle := func() {
		select {
		case <-ctx.Done():
		case <-time.After(3 * time.Second):
		}
	}
	idle := func() (int64, error) {
		cpu0, err := cpuNS(pid)
		if err != nil {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(cfg.floodDuration):
		}
		cpu1, err := cpuNS(pid)
		return cpu1 - cpu0, err
	}

	if _, err := flood(false); err != nil { // warm: first-use costs, conntrack growth
		return fmt.Errorf("warm flood: %w", err)
	}
	settle()
	var read, unread []floodRun
	var idleCPU []int64
	for i := 0; i < cfg.floodReps; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := flood(false)
		if err != nil {
			return err
		}
		read = append(read, r)
		settle()
		icpu, err := idle()
		if err != nil {
			return err
		}
		idleCPU = append(idleCPU, icpu)
		u, err := flood(true)
		if err != nil {
			return err
		}
		unread = append(unread, u)
		settle()
		logf("rep %d/%d: log read: %.0f drops/s (sent %.0f/s, %d lines logged, %d not), daemon CPU %.2f%%; log not read: %.0f drops/s; daemon idle %.2f%%",
			i+1, cfg.floodReps, r.dropsPerS(), float64(r.sent)/r.elapsed.Seconds(), r.drops-r.unlogged, r.unlogged,
			pctOf(r.daemonCPU, r.elapsed), u.dropsPerS(), pctOf(icpu, cfg.floodDuration))
	}
	var rd, ud, rcpu, icpu, lines []float64
	for i := range read {
		rd = append(rd, read[i].dropsPerS())
		ud = append(ud, unread[i].dropsPerS())
		rcpu = append(rcpu, pctOf(read[i].daemonCPU, read[i].elapsed))
		icpu = append(icpu, pctOf(idleCPU[i], cfg.floodDuration))
		lines = append(lines, float64(read[i].drops-read[i].unlogged))
	}
	extra := []string{fmt.Sprintf("reps=%d", cfg.floodReps), fmt.Sprintf("duration_s=%g", cfg.floodDuration.Seconds()),
		fmt.Sprintf("live=%d", cfg.floodLive+1), "pin=taskset-c1-flooder"}
	rep.Add(Result{Name: "droplog-flood-drops-per-s", Unit: "1/s", Ours: median(rd), Peer: median(ud),
		Note: "peer = the same table, the daemon stopped (SIGSTOP) so nothing reads the drop log; no target in the issue",
		Extra: append(append([]string{}, extra...), "ours_all="+joinInts(rd), "peer_all="+joinInts(ud),
			"lines_logged_per_flood="+joinInts(lines), fmt.Sprintf("log_budget_per_s=%d", nft.DefaultLogRate))})
	rep.Add(Result{Name: "droplog-flood-daemon-cpu", Unit: "%cpu", Ours: median(rcpu), Peer: median(icpu),
		Note:  "daemon CPU (all threads) while it reads the log of a flood; peer = the same daemon idle as long; no target",
		Extra: append(append([]string{}, extra...), "ours_all="+joinFloats(rcpu), "peer_all="+joinFloats(icpu))})
	return nil
}

func joinInts(v []float64) string {
	s := make([]string, len(v))
	for i, f := range v {
		s[i] = fmt.Sprintf("%.0f", f)
	}
	return strings.Join(s, ",")
}
