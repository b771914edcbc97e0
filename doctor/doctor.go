package doctor

import (
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netns"
)

// Run is `enforcerd doctor`: a preflight an operator runs before and
// after installing, and whose fatal subset `serve` runs before its first
// kernel change. Every check reads the kernel (netlink, nftables, /proc,
// /sys); the kernel-feature checks change nothing of the host: they work in
// a throwaway netns that is gone when they return. Only the datapath check
// (Options.Datapath) makes objects in the daemon's netns, under a
// throwaway prefix and pool, and removes them before it returns.

// The statuses of a check.
const (
	StatusOK   = "ok"
	StatusWarn = "warn" // worth reading; doctor still exits 0
	StatusFail = "fail" // doctor exits 1; serve refuses to start when the check is Fatal
)

// The names of the checks, in the order Run runs them.
const (
	CheckRoot         = "root"
	CheckNetnsVeth    = "netns-veth"
	CheckNftables     = "nftables"
	CheckProcSysNet   = "proc-sys-net"
	CheckOverlay      = "overlay"
	CheckSeccomp      = "seccomp"
	CheckCgroup       = "cgroup"
	CheckPropagation  = "netns-propagation"
	CheckForeignLinks = "foreign-links"
	CheckPoolOverlap  = "pool-overlap"
	CheckForwardDrop  = "forward-firewall"
	CheckLegacyTables = "iptables-legacy"
	CheckUpstreams    = "upstreams"
	CheckUnits        = "units"
	CheckRunning      = "daemon"
	CheckDatapath     = "datapath"
)

// Check is the outcome of one check. Fatal says that serve refuses to
// start when this check fails (it is a property of the check, shown also
// when it passed).
type Check struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail"`
	Fatal  bool   `json:"fatal"`
}

// Report is the outcome of every check, in the order they ran.
type Report []Check

// Failed reports whether a check failed.
func (r Report) Failed() bool {
	for _, c := range r {
		if c.Status == StatusFail {
			return true
		}
	}
	return false
}

// FatalFailure returns the first failed check serve refuses to start on.
func (r Report) FatalFailure() (Check, bool) {
	for _, c := range r {
		if c.Fatal && c.Status == StatusFail {
			return c, true
		}
	}
	return Check{}, false
}

// Config is what the checks need to know of the daemon's configuration:
// the fields of daemon.Config they read (cmd/enforcerd fills both from the
// same ServeConfig).
type Config struct {
	StateDir        string           // where the datapath check records its runs (datapathRunsDir)
	NamePrefix      string           // tags every kernel object
	Pool            netip.Prefix     // the /30s of the sessions come from here
	Pool6           netip.Prefix     // the sessions' /126s (dual-stack); invalid: IPv4-only
	Upstreams       []netip.AddrPort // DNS resolvers the proxy forwards to
	PublicOverrides []netip.Prefix   // special-purpose ranges treated as public
	MaxFlows        int              // per-session cap on concurrent tracked flows
	FlowRate        int              // per-session new flows per second
	MaxAttested     int              // per-session cap on live DNS-attested elements
}

// defaultUpstreamTimeout bounds each upstream's answer when
// Options.UpstreamTimeout is zero: the daemon's own bound on one try.
const defaultUpstreamTimeout = 2 * time.Second

// Options select the checks.
type Options struct {
	// FatalOnly runs only the checks serve refuses to start on (serve's
	// start: they take a few tens of milliseconds).
	FatalOnly bool
	// Datapath adds the datapath check: a throwaway pair of sessions whose
	// counters must show one packet accepted and one dropped.
	Datapath bool
	// DatapathPool is the throwaway pool of the datapath check (zero:
	// DefaultDatapathPool). It must not overlap Config.Pool nor anything
	// of the host.
	DatapathPool netip.Prefix
	// UpstreamTimeout bounds each upstream's answer, and the running
	// daemon's (zero: 2 s).
	UpstreamTimeout time.Duration
	// Socket, SocketGroup and ConfigFile are serve's API socket, its group
	// ("" = root only) and its --config file ("" = none): the units check
	// compares the socket unit with them, and the daemon check asks the
	// daemon on Socket (zero: api.DefaultSocket).
	Socket, SocketGroup, ConfigFile string
	// UnitDirs are where the units check looks for enforcerd.socket,
	// highest precedence first (nil: DefaultUnitDirs).
	UnitDirs []string
	// Version is this binary's version, compared with the daemon's.
	Version string
	// Commit is the git commit this binary was built from ("": unknown),
	// compared with the daemon's when both are known (two builds of one
	// version string differ by it).
	Commit string
}

// DefaultDatapathPool is the pool of the datapath check's throwaway
// sessions: the smallest pool (three /30s) at the top of the shared
// address space, where hosts rarely number anything.
var DefaultDatapathPool = netip.MustParsePrefix("100.127.255.240/28")

// check is one check of the list: the function returns its status and
// detail.
type check struct {
	name  string
	fatal bool
	root  bool // needs root: not run (warn) when the root check failed
	run   func(*doctorEnv) (string, string)
}

// doctorEnv is what the checks share.
type doctorEnv struct {
	cfg  Config
	opts Options
	host netns.NsHandle
	// probe is the throwaway-netns probe, run once for both the netns-veth
	// and the nftables checks.
	probe *kernelProbe
}

// doctorChecks lists every check in order. Fatal ones: without root,
// nf_tables, netns or veth, or a writable /proc/sys/net (the sysctls of
// forwarding and of every session's interfaces), serve cannot enforce
// anything; a foreign link
// with the prefix would be judged (and cut off) as a session veth; a pool
// overlapping the host's addresses or routes makes sessions' traffic and
// the host's collide. Another firewall's forward drop is a failure but not
// fatal: it drops sessions' traffic after our table accepted it, so
// enforcement fails closed (nothing the policy denies gets out), and its
// rules may accept our interfaces in ways this check cannot evaluate.
func doctorChecks() []check {
	return []check{
		{CheckRoot, true, false, checkRoot},
		{CheckNetnsVeth, true, true, func(e *doctorEnv) (string, string) { return e.kernel().netnsVeth() }},
		{CheckNftables, true, true, func(e *doctorEnv) (string, string) { return e.kernel().nftables() }},
		{CheckProcSysNet, true, true, func(e *doctorEnv) (string, string) { return e.kernel().procSysNet() }},
		{CheckOverlay, false, false, checkOverlay},
		{CheckSeccomp, false, false, checkSeccomp},
		{CheckCgroup, false, false, checkCgroup},
		{CheckPropagation, false, false, checkPropagation},
		{CheckForeignLinks, true, true, checkForeignLinks},
		{CheckPoolOverlap, true, true, checkPoolOverlap},
		{CheckForwardDrop, false, true, checkForwardDrop},
		{CheckLegacyTables, false, false, checkLegacyIptables},
		{CheckUpstreams, false, false, checkUpstreams},
		{CheckUnits, false, false, checkUnits},
		{CheckRunning, false, false, checkRunning},
		{CheckDatapath, false, true, checkDatapath},
	}
}

// Run runs the checks in the calling thread's netns (the daemon's).
func Run(cfg Config, opts Options) Report {
	if !opts.DatapathPool.IsValid() {
		opts.DatapathPool = DefaultDatapathPool
	}
	if opts.UpstreamTimeout <= 0 {
		opts.UpstreamTimeout = defaultUpstreamTimeout
	}
	e := &doctorEnv{cfg: cfg, opts: opts}
	var report Report
	host, err := netns.Get()
	if err != nil {
		return Report{{Name: CheckRoot, Status: StatusFail, Fatal: true, Detail: fmt.Sprintf("open own netns: %v", err)}}
	}
	defer host.Close()
	e.host = host
	rootOK := true
	for _, c := range doctorChecks() {
		if opts.FatalOnly && !c.fatal {
			continue
		}
		if c.name == CheckDatapath && !opts.Datapath {
			continue
		}
		out := Check{Name: c.name, Fatal: c.fatal}
		if c.root && !rootOK {
			out.Status, out.Detail = StatusWarn, "not checked: needs root"
		} else {
			out.Status, out.Detail = c.run(e)
		}
		if c.name == CheckRoot && out.Status == StatusFail {
			rootOK = false
		}
		report = append(report, out)
	}
	return report
}

// kernel returns the throwaway-netns probe, running it on first use.
func (e *doctorEnv) kernel() *kernelProbe {
	if e.probe == nil {
		e.probe = runKernelProbe(e.cfg)
	}
	return e.probe
}

// checkRoot: euid 0 with CAP_NET_ADMIN and CAP_SYS_ADMIN effective.
func checkRoot(*doctorEnv) (string, string) {
	if os.Geteuid() != 0 {
		return StatusFail, fmt.Sprintf("euid %d: enforcerd runs as root", os.Geteuid())
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return StatusFail, fmt.Sprintf("read /proc/self/status: %v", err)
	}
	missing, err := missingCaps(string(b))
	if err != nil {
		return StatusFail, err.Error()
	}
	if len(missing) > 0 {
		return StatusFail, fmt.Sprintf("root without %v in the effective capability set", missing)
	}
	return StatusOK, "euid 0 with CAP_NET_ADMIN and CAP_SYS_ADMIN"
}
