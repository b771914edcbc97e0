// Command bench is `make bench`: it measures enforcerd side by side with the
// peers it replaces, in the same run, and prints the ratios.
//
// Every figure runs inside a test world (integration/world: a simulated host
// and a simulated internet at 198.18.0.0/15 in network namespaces this
// program creates); nothing touches the machine's real interfaces or the
// real root netns's nftables. Everything is named with the world's run ID
// and removed by exact name; only processes this program started are
// signalled, by PID. Speed is never asserted: the output is a table and one
// `RESULT name=... k=v` line per figure.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/enforcerd/enforcerd/container"
)

// progress receives the running commentary (stderr); results go to stdout.
var progress io.Writer = os.Stderr

// config sizes every figure; quick shrinks them to a smoke run.
type config struct {
	quick  bool
	bin    string // the enforcerd binary (figure 6)
	rootfs string // a busybox image (figures 5, 6)
	tmp    string // scratch directory, removed at the end

	netN        int           // fig 1: sessions each way
	scaleHigh   int           // fig 2: live sessions at the high level
	scaleProbes int           // fig 2: creates measured per level
	attests     int           // fig 2: attests measured per level
	scaleBudget time.Duration // fig 2: longest time spent growing

	iperfReps     int           // fig 3: interleaved repetitions
	iperfDuration time.Duration // fig 3: one iperf3 run
	dpSessions    int           // fig 3: sessions in the table
	natFloor      bool          // fig 3: also measure conntrack+masquerade alone

	dnsNames    int           // fig 4: names in the zone
	dnsSat      time.Duration // fig 4: saturation run
	dnsLat      time.Duration // fig 4: fixed-rate run
	dnsLatQPS   int           // fig 4: the fixed rate
	dnsReps     int           // fig 4: interleaved repetitions
	dnsHigh     int           // fig 4: live sessions at the high level
	dnsPool     int           // fig 4: live sessions at the whole-pool level (0: not measured)
	runcN       int           // fig 5: create+start samples
	execN       int           // fig 5: exec samples
	apiN        int           // fig 6: create/delete samples
	apiSandboxN int           // fig 6: sandbox session samples
	apiConc     int           // fig 6: sessions created by 4 concurrent clients
	peerConc    int           // fig 6: ptp ADDs by 4 concurrent runners
	churn       int           // fig 6: creates+deletes of the churn
	memSessions int           // fig 6: live sessions for the memory figure

	floodReps     int           // fig 7: interleaved repetitions (log read, log not read)
	floodDuration time.Duration // fig 7: one flood
	floodLive     int           // fig 7: live sessions beside the flooding one
	updN          int           // fig 8: updates measured per kind and level
	updCreates    int           // fig 8: creates measured per level
	poolHigh      int           // fig 10: live sessions at the high level (the default pool's size)
	poolCreates   int           // fig 10: creates timed at each level
	poolBudget    time.Duration // fig 10: longest time spent growing
	updHigh       int           // fig 8: live sessions at the high level
	updBudget     time.Duration // fig 8: longest time spent growing
	cniN          int           // fig 9: ADD/DEL samples
	cniBin        string        // fig 9: the enforcerd-cni plugin
	ctlBin        string        // fig 6: enforcerctl, the thin client (cli-net-*)
}

func fullConfig() config {
	return config{
		netN: 200, scaleHigh: 4000, scaleProbes: 100, attests: 2000, scaleBudget: 4 * time.Minute,
		iperfReps: 4, iperfDuration: 5 * time.Second, dpSessions: 4096, natFloor: true,
		dnsNames: 1000, dnsSat: 10 * time.Second, dnsLat: 10 * time.Second, dnsLatQPS: 2000, dnsReps: 3, dnsHigh: 4000,
		dnsPool: 16383, runcN: 20, execN: 50,
		apiN: 100, apiSandboxN: 15, apiConc: 1000, peerConc: 200, churn: 1000, memSessions: 1000,
		floodReps: 3, floodDuration: 5 * time.Second, floodLive: 100,
		updN: 100, updCreates: 50, updHigh: 4000, updBudget: 4 * time.Minute,
		cniN:     100,
		poolHigh: 16383, poolCreates: 50, poolBudget: 6 * time.Minute,
	}
}

func quickConfig() config {
	return config{
		quick: true,
		netN:  30, scaleHigh: 400, scaleProbes: 20, attests: 300, scaleBudget: 40 * time.Second,
		iperfReps: 1, iperfDuration: 2 * time.Second, dpSessions: 4096,
		dnsNames: 1000, dnsSat: 3 * time.Second, dnsLat: 3 * time.Second, dnsLatQPS: 2000, dnsReps: 1, dnsHigh: 4000,
		runcN: 5, execN: 10,
		apiN: 20, apiSandboxN: 3, apiConc: 40, peerConc: 20, churn: 40, memSessions: 100,
		floodReps: 1, floodDuration: 2 * time.Second, floodLive: 10,
		updN: 20, updCreates: 10, updHigh: 400, updBudget: 40 * time.Second,
		cniN:     20,
		poolHigh: 400, poolCreates: 10, poolBudget: 40 * time.Second,
	}
}

// figure is one named part of the run.
type figure struct {
	key string
	run func(context.Context, *config, *Report) error
}

var figures = []figure{
	{"net", figSessionNet},
	{"datapath", figDatapath},
	{"dns", figDNS},
	{"net6", figNet6},           // issue 26: dual-stack create/delete vs IPv4-only
	{"datapath6", figDatapath6}, // issue 26: TCP over IPv6 vs IPv4 through the dual-stack table
	{"dns6", figDNS6},           // issue 26: AAAA through the dual-stack proxy vs A
	{"runc", figRunc},
	{"daemon", figDaemon},
	{"droplog", figDropLog},
	{"limits", figLimits}, // issue 24: the ledger's events and the counted limits, on vs off
	{"namecheck", figNameCheck},
	{"cni", figCNI},
	{"update", figUpdate}, // leaves the kernel tearing down its sessions' netns
	{"scale", figScale},   // it leaves the kernel tearing down thousands of netns
	{"pool", figPool},     // last: the whole pool, 16,383 netns to tear down
}

func main() {
	container.MaybeInit() // libcontainer re-executes this binary as the sandbox init
	if len(os.Args) > 1 && os.Args[1] == floodHelperArg {
		os.Exit(floodHelperMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == dnsForwardArg {
		os.Exit(dnsForwardMain(os.Args[2:]))
	}
	quick := flag.Bool("quick", os.Getenv("BENCH_QUICK") == "1", "a short smoke run (also BENCH_QUICK=1)")
	bin := flag.String("bin", os.Getenv("ENFORCERD_BIN"), "the enforcerd binary (default $ENFORCERD_BIN)")
	rootfs := flag.String("rootfs", os.Getenv("ENFORCERD_ROOTFS"), "a busybox rootfs from scripts/mkrootfs.sh (default $ENFORCERD_ROOTFS)")
	only := flag.String("only", os.Getenv("BENCH_ONLY"), "comma-separated figures to run: net,datapath,dns,net6,datapath6,dns6,runc,daemon,droplog,namecheck,update,cni,scale,pool (default all)")
	flag.Parse()
	if err := mainErr(*quick, *bin, *rootfs, *only); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func mainErr(quick bool, bin, rootfs, only string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("the benchmarks build network namespaces: run as root")
	}
	cfg := fullConfig()
	if quick {
		cfg = quickConfig()
	}
	cfg.bin, cfg.rootfs = bin, rootfs
	// BENCH_SCALE_HIGH: figure 2's high level, the live sessions beside
	// the measured creates; its growth budget grows in proportion. Each
	// measured create needs a slot of its own (a deleted session's slot is
	// quarantined until its veth is gone), so of the default pool's 16383
	// slots, scaleProbes+1 stay free.
	if v := os.Getenv("BENCH_SCALE_HIGH"); v != "" {
		most := 16383 - cfg.scaleProbes - 1
		n, err := strconv.Atoi(v)
		if err != nil || n < 20 || n > most {
			return fmt.Errorf("BENCH_SCALE_HIGH %q: want a number from 20 to %d", v, most)
		}
		cfg.scaleBudget = cfg.scaleBudget * time.Duration(max(n, cfg.scaleHigh)) / time.Duration(cfg.scaleHigh)
		cfg.scaleHigh = n
	}
	// The CNI plugin: $ENFORCERD_CNI_BIN, else beside the daemon binary
	// (make build builds both into bin/).
	if cfg.cniBin = os.Getenv("ENFORCERD_CNI_BIN"); cfg.cniBin == "" && bin != "" {
		cfg.cniBin = filepath.Join(filepath.Dir(bin), "enforcerd-cni")
	}
	// The thin client: $ENFORCERD_CTL_BIN, else beside the daemon binary.
	if cfg.ctlBin = os.Getenv("ENFORCERD_CTL_BIN"); cfg.ctlBin == "" && bin != "" {
		cfg.ctlBin = filepath.Join(filepath.Dir(bin), "enforcerctl")
	}
	for _, p := range []*string{&cfg.bin, &cfg.rootfs, &cfg.cniBin, &cfg.ctlBin} {
		if *p != "" {
			abs, err := filepath.Abs(*p)
			if err != nil {
				return err
			}
			*p = abs
		}
	}
	tmp, err := os.MkdirTemp("", "enforcerd-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o711); err != nil {
		return err
	}
	cfg.tmp = tmp

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	want := map[string]bool{}
	for _, k := range strings.Split(only, ",") {
		if k = strings.TrimSpace(k); k != "" {
			want[k] = true
		}
	}
	for k := range want {
		known := false
		for _, f := range figures {
			known = known || f.key == k
		}
		if !known {
			return fmt.Errorf("BENCH_ONLY: no figure %q", k)
		}
	}
	mode := "full"
	if quick {
		mode = "quick (BENCH_QUICK=1)"
	}
	fmt.Fprintf(progress, "enforcerd bench: %s run, %d CPUs, kernel %s, %s, started %s\n",
		mode, runtime.NumCPU(), kernel(), runtime.Version(), time.Now().Format(time.RFC3339))
	rep := &Report{out: os.Stdout}
	start := time.Now()
	var failed []string
	for _, f := range figures {
		if len(want) > 0 && !want[f.key] {
			continue
		}
		fstart := time.Now()
		if err := f.run(ctx, &cfg, rep); err != nil {
			fmt.Fprintf(progress, "  FIGURE %s FAILED: %v\n", f.key, err)
			failed = append(failed, f.key)
		}
		logf("(%s took %s)", f.key, time.Since(fstart).Round(time.Second))
		if ctx.Err() != nil {
			break
		}
	}
	fmt.Println()
	fmt.Printf("enforcerd bench (%s): nproc=%d kernel=%s date=%s wall=%s\n", mode, runtime.NumCPU(), kernel(),
		time.Now().UTC().Format("2006-01-02"), time.Since(start).Round(time.Second))
	rep.Table(os.Stdout)
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted")
	}
	if len(failed) > 0 {
		return fmt.Errorf("figures failed: %s", strings.Join(failed, ", "))
	}
	return nil
}

func kernel() string {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		return "?"
	}
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}
