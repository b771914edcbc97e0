package container

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/enforcerd/enforcerd/container/rules"
)

// Errors callers branch on.
var (
	// ErrTimeout: an exec ran past its Timeout; its whole process group was killed. The CLI
	// maps it to exit status 124.
	ErrTimeout = errors.New("exec timed out")
	// ErrNotFound: no sandbox of that name (or its init is gone).
	ErrNotFound = errors.New("sandbox not found")
	// ErrExists: a sandbox of that name already exists.
	ErrExists = errors.New("sandbox already exists")
)

// CPUPeriod is the CFS period of every sandbox (100 ms, the kernel's and docker's default);
// Spec.CPUs is the share of it the sandbox may run for, summed over all its CPUs.
const CPUPeriod = 100000 // microseconds

// minCPUQuota is the kernel's smallest CFS quota (1 ms): Spec.CPUs 0.01 with CPUPeriod.
const minCPUQuota = 1000

// User namespace mapping used when Spec.UserNS: container ids 0..65535 map to host ids
// 100000..165535 (the usual first /etc/subuid range).
const (
	UserNSHostID = 100000
	UserNSSize   = 65536
)

// Config is the Manager's fixed configuration.
type Config struct {
	// StateDir is libcontainer's state root (e.g. <state-dir>/containers), one directory per
	// container id.
	StateDir string
	// LayerDir holds one directory per sandbox: overlay upper/work dirs, the mounted rootfs and
	// the per-session /etc files.
	LayerDir string
	// Prefix tags everything this Manager makes: container ids and layer dirs are
	// "<Prefix>-<name>", the cgroup is "<Prefix>/<Prefix>-<name>". 1 to 16 of [a-z0-9].
	Prefix string
	// InitPath and InitArgs name the binary libcontainer re-executes as the container's init.
	// libcontainer v1.5.3 hard-codes them (/proc/self/exe init), so the only accepted values
	// are those (or empty); they are kept to make the contract explicit.
	InitPath string
	InitArgs []string
}

// Spec describes one sandbox.
type Spec struct {
	// Name is the session name: 1 to 32 of [a-z0-9-], starting with a letter or digit.
	Name string
	// Rootfs is the image directory, shared by many sessions and never written.
	Rootfs string
	// Writable gives the sandbox a writable root (an overlay upper dir under LayerDir);
	// otherwise the root is read-only with a tmpfs /tmp.
	Writable bool
	// NetnsPath is the session's network namespace (e.g. /run/netns/enf-s1). Empty: a new,
	// empty netns with only loopback (for egress none without nsmgr).
	NetnsPath string
	// NetRaw grants CAP_NET_RAW (SYN scans, ICMP).
	NetRaw bool
	// ExtraCaps asks for more capabilities; ForbiddenCapabilities are dropped whatever it says.
	ExtraCaps []string
	// UserNS runs the sandbox in a user namespace (see UserNSHostID). Its root then has no
	// capability over the network at all (NET_RAW included), and /sys is not mounted.
	UserNS bool
	// MemoryBytes limits memory (no swap); 0 means rules.DefaultMemoryBytes.
	MemoryBytes int64
	// PidsMax limits the number of tasks; 0 means rules.DefaultPidsMax.
	PidsMax int64
	// CPUs limits CPU time like docker's --cpus: 1.5 is one and a half CPUs' worth per period
	// (a CFS quota of 1.5 * CPUPeriod); 0 means rules.DefaultCPUs. At least 0.01.
	CPUs float64
	// Hostname defaults to Name.
	Hostname string
	// DNS is the only nameserver in the guest's /etc/resolv.conf (no search domains).
	DNS netip.Addr
	// Hosts are pinned /etc/hosts entries.
	Hosts map[string][]netip.Addr
}

// ExecSpec describes one command run in a sandbox.
type ExecSpec struct {
	Args []string
	// Env entries are KEY=VALUE; PATH, HOME, TERM and LANG get defaults
	// when absent (see execEnv).
	Env []string
	// Dir is the working directory inside the sandbox (default / on a
	// writable root, /tmp on a read-only one, so downloads land somewhere).
	Dir string
	// User is "uid[:gid]" (numbers; gid defaults to uid; default 0:0).
	User string
	// Stdin, when set, is copied to the command's standard input (closed at EOF); else the
	// command reads /dev/null. Exec does not wait for the copy: a reader that blocks forever
	// keeps one goroutine until it returns.
	Stdin io.Reader
	// Stdout and Stderr receive the output as it comes; nil discards it. Passing the same
	// writer for both interleaves them in one stream.
	Stdout, Stderr io.Writer
	// Timeout, when positive, kills the command's whole process group and makes Exec return
	// ErrTimeout.
	Timeout time.Duration
}

const (
	maxNameLen   = 32
	maxPrefixLen = 16
)

func validName(s string, max int, dash bool) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
		case r == '-' && dash && i > 0:
		default:
			return false
		}
	}
	return true
}

func validateConfig(c Config) error {
	if !filepath.IsAbs(c.StateDir) {
		return fmt.Errorf("state dir %q: not an absolute path; want an absolute directory", c.StateDir)
	}
	if !filepath.IsAbs(c.LayerDir) {
		return fmt.Errorf("layer dir %q: not an absolute path; want an absolute directory", c.LayerDir)
	}
	if !validName(c.Prefix, maxPrefixLen, false) {
		return fmt.Errorf("prefix %q: use 1 to %d lower-case letters and digits", c.Prefix, maxPrefixLen)
	}
	if c.InitPath != "" && c.InitPath != "/proc/self/exe" {
		return fmt.Errorf("init path %q: libcontainer always re-executes /proc/self/exe; leave it empty", c.InitPath)
	}
	if len(c.InitArgs) > 0 && !(len(c.InitArgs) == 1 && c.InitArgs[0] == "init") {
		return fmt.Errorf("init args %q: libcontainer always passes \"init\"; leave them empty", c.InitArgs)
	}
	return nil
}

// validateSpec checks everything about a Spec that needs no kernel.
func validateSpec(s Spec) error {
	if !validName(s.Name, maxNameLen, true) {
		return fmt.Errorf("sandbox name %q: use 1 to %d of [a-z0-9-], starting with a letter or digit", s.Name, maxNameLen)
	}
	if !filepath.IsAbs(s.Rootfs) {
		return fmt.Errorf("rootfs %q: not an absolute path; want the image directory's absolute path", s.Rootfs)
	}
	if s.NetnsPath != "" && !filepath.IsAbs(s.NetnsPath) {
		return fmt.Errorf("netns path %q: not an absolute path; want e.g. /run/netns/NAME", s.NetnsPath)
	}
	if err := CheckResources(s.MemoryBytes, s.PidsMax, s.CPUs); err != nil {
		return err
	}
	if s.Hostname != "" && (len(s.Hostname) > 64 || !validHostname(s.Hostname)) {
		return fmt.Errorf("hostname %q: use at most 64 letters, digits, '-', '_' and dots", s.Hostname)
	}
	if s.DNS.IsValid() && s.DNS.Zone() != "" {
		return fmt.Errorf("dns address %s: zoned addresses are not accepted", s.DNS)
	}
	if _, err := capabilitySet(s); err != nil {
		return err
	}
	return validatePinned(s.Hosts)
}

// cpuQuota is the CFS quota (microseconds per CPUPeriod) of Spec.CPUs; 0 gives rules.DefaultCPUs'.
func cpuQuota(cpus float64) (int64, error) {
	if cpus == 0 {
		cpus = rules.DefaultCPUs
	}
	q := math.Round(cpus * CPUPeriod)
	if math.IsNaN(cpus) || math.IsInf(cpus, 0) || q < minCPUQuota || q > math.MaxInt32 {
		// (validateSpec refused it already, with CheckResources' text)
		return 0, fmt.Errorf("cpus %v: %s", cpus, rules.CPUsWant(runtime.NumCPU()))
	}
	return int64(q), nil
}

// parseUser parses ExecSpec.User: "", "uid" or "uid:gid".
func parseUser(s string) (uid, gid int, err error) {
	if s == "" {
		return 0, 0, nil
	}
	us, gs, hasGID := strings.Cut(s, ":")
	uid, err = parseID(us)
	if err == nil && hasGID {
		gid, err = parseID(gs)
	} else if err == nil {
		gid = uid
	}
	if err != nil {
		return 0, 0, fmt.Errorf("user %q: use numeric uid[:gid]", s)
	}
	return uid, gid, nil
}

func parseID(s string) (int, error) {
	n, err := strconv.ParseUint(s, 10, 31)
	return int(n), err
}

// defaultPath is the PATH an exec gets unless its Env sets one.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// execEnv validates env entries and adds PATH, HOME, TERM and LANG when
// absent. HOME is a directory the user can write, and for root the home its
// passwd entry names (ssh and git use that one): /root, unless noRootHome
// (a read-only root whose image has no /root directory: see mountRootHome),
// and for other users /tmp (the sandbox's tmpfs on a read-only root);
// LANG=C.UTF-8 so that tools accept the internationalised names a policy
// allows (curl and wget refuse an IDN URL in the C locale).
func execEnv(env []string, uid int, noRootHome bool) ([]string, error) {
	out := make([]string, 0, len(env)+4)
	seen := map[string]bool{}
	for _, e := range env {
		k, _, ok := strings.Cut(e, "=")
		if !ok || k == "" || strings.ContainsAny(k, "\x00") || strings.Contains(e, "\x00") {
			return nil, fmt.Errorf("env %q: use KEY=VALUE", e)
		}
		seen[k] = true
		out = append(out, e)
	}
	home := "/tmp"
	if uid == 0 && !noRootHome {
		home = "/root"
	}
	for _, d := range []struct{ k, v string }{{"PATH", defaultPath}, {"HOME", home}, {"TERM", "xterm"}, {"LANG", "C.UTF-8"}} {
		if !seen[d.k] {
			out = append(out, d.k+"="+d.v)
		}
	}
	return out, nil
}
