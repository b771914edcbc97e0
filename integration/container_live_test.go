package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/integration/world"
)

// libcontainer re-executes this test binary as the container's init (os.Args[1] == "init"):
// that must be handled before the testing package parses flags, hence init rather than
// TestMain (which the package's other live tests may want).
func init() { container.MaybeInit() }

// ctEnv is one live test's sandbox setting: a world, an image and a Manager whose prefix is
// unique to the run.
type ctEnv struct {
	w      *world.World
	m      *container.Manager
	cfg    container.Config
	rootfs string
	nets   int // session netns made so far
}

// ctBuildRootfs builds a fresh busybox image with scripts/mkrootfs.sh.
func ctBuildRootfs(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("../scripts/mkrootfs.sh", dir).CombinedOutput(); err != nil {
		t.Fatalf("mkrootfs: %v\n%s", err, out)
	}
	return dir
}

func newCtEnv(t *testing.T) *ctEnv {
	t.Helper()
	w := world.New(t)
	world.RequireTool(t, "ip")
	e := &ctEnv{w: w}
	if e.rootfs = os.Getenv("ENFORCERD_ROOTFS"); e.rootfs == "" {
		e.rootfs = ctBuildRootfs(t)
	}
	tmp := t.TempDir()
	// A user-namespaced sandbox's root (host uid 100000) must be able to reach its layer dir.
	for _, d := range []string{filepath.Dir(tmp), tmp} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	e.cfg = container.Config{
		StateDir: filepath.Join(tmp, "state"),
		LayerDir: filepath.Join(tmp, "layers"),
		Prefix:   "ct" + w.ID,
	}
	m, err := container.New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	// Registered after TempDir: runs before it, so nothing is removed under a live overlay.
	t.Cleanup(func() {
		if gone, err := m.Reap(nil); err != nil {
			t.Errorf("reap %s: %v (removed %v)", e.cfg.Prefix, err, gone)
		}
		e.checkNoResidue(t)
	})
	return e
}

// checkNoResidue asserts the prefix left no container state, layer dir or cgroup, and that
// the test process has no zombie child.
func (e *ctEnv) checkNoResidue(t *testing.T) {
	t.Helper()
	for _, dir := range []string{e.cfg.StateDir, e.cfg.LayerDir} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Errorf("read %s: %v", dir, err)
		}
		for _, ent := range ents {
			t.Errorf("residue in %s: %s", dir, ent.Name())
		}
	}
	paths, err := e.m.CgroupPaths("x")
	if err != nil {
		t.Fatal(err)
	}
	for ctrl, p := range paths {
		if _, err := os.Stat(filepath.Dir(p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cgroup parent %s (%s) left behind: %v", filepath.Dir(p), ctrl, err)
		}
	}
	ctCheckNoZombies(t)
}

// ctCheckNoZombies fails when a child of this process stays a zombie (given a moment for a
// concurrent Wait to reap a process that just exited).
func ctCheckNoZombies(t *testing.T) {
	t.Helper()
	var zombies []string
	for range 50 {
		zombies = ctZombieChildren(t)
		if len(zombies) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("zombie children of the test process: %v", zombies)
}

func ctZombieChildren(t *testing.T) []string {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	me := strconv.Itoa(os.Getpid())
	var out []string
	for _, ent := range ents {
		if _, err := strconv.Atoi(ent.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + ent.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[0] == "Z" && f[1] == me {
			out = append(out, ent.Name()+" "+s[:strings.LastIndexByte(s, ')')+1])
		}
	}
	return out
}

func ctIpCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// ctSessionNet is a session network made the way nsmgr makes one: a named netns with a veth
// pair whose other end (gw) is in the simulated host.
type ctSessionNet struct {
	path      string
	gw, guest netip.Addr
}

// newSessionNet makes a named netns with lo up and eth0, a veth to the simulated host
// (10.20.250.4n+1/30 on the host side, +2 in the session, default route via the host side),
// and removes both by name at cleanup.
func (e *ctEnv) newSessionNet(t *testing.T) ctSessionNet {
	t.Helper()
	n := e.nets
	e.nets++
	name := fmt.Sprintf("ct%ss%d", e.w.ID, n)
	veth := fmt.Sprintf("ct%sv%d", e.w.ID, n)
	gw := netip.AddrFrom4([4]byte{10, 20, 250, byte(4*n + 1)})
	guest := gw.Next()
	ctIpCmd(t, "netns", "add", name)
	t.Cleanup(func() {
		_ = exec.Command("ip", "-n", e.w.HostName, "link", "del", veth).Run()
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v %s", name, err, out)
		}
	})
	ctIpCmd(t, "-n", e.w.HostName, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
	ctIpCmd(t, "-n", e.w.HostName, "addr", "add", gw.String()+"/30", "dev", veth)
	ctIpCmd(t, "-n", e.w.HostName, "link", "set", veth, "up")
	ctIpCmd(t, "-n", name, "link", "set", "lo", "up")
	ctIpCmd(t, "-n", name, "addr", "add", guest.String()+"/30", "dev", "eth0")
	ctIpCmd(t, "-n", name, "link", "set", "eth0", "up")
	ctIpCmd(t, "-n", name, "route", "add", "default", "via", gw.String())
	return ctSessionNet{path: "/run/netns/" + name, gw: gw, guest: guest}
}

// create makes a sandbox (image and name filled in) and destroys it at cleanup.
func (e *ctEnv) create(t *testing.T, spec container.Spec) {
	t.Helper()
	if spec.Rootfs == "" {
		spec.Rootfs = e.rootfs
	}
	if err := e.m.Create(spec); err != nil {
		t.Fatalf("create %s: %v", spec.Name, err)
	}
	t.Cleanup(func() {
		if err := e.m.Destroy(spec.Name); err != nil {
			t.Errorf("destroy %s: %v", spec.Name, err)
		}
	})
}

type ctResult struct {
	stdout, stderr string
	code           int
	err            error
}

func (r ctResult) String() string {
	return fmt.Sprintf("code %d err %v\nstdout: %s\nstderr: %s", r.code, r.err, r.stdout, r.stderr)
}

// run runs a shell command in sandbox name with a generous timeout.
func (e *ctEnv) run(t *testing.T, name, script string) ctResult {
	t.Helper()
	return e.exec(t, name, container.ExecSpec{Args: []string{"sh", "-c", script}, Timeout: 30 * time.Second})
}

func (e *ctEnv) exec(t *testing.T, name string, p container.ExecSpec) ctResult {
	t.Helper()
	var so, se bytes.Buffer
	p.Stdout, p.Stderr = &so, &se
	code, err := e.m.Exec(context.Background(), name, p)
	return ctResult{so.String(), se.String(), code, err}
}

// mustRun runs script and fails unless it exits 0.
func (e *ctEnv) mustRun(t *testing.T, name, script string) string {
	t.Helper()
	r := e.run(t, name, script)
	if r.err != nil || r.code != 0 {
		t.Fatalf("%s: %q: %s", name, script, r)
	}
	return r.stdout
}

func TestContainerLifecycle(t *testing.T) {
	e := newCtEnv(t)
	sn := e.newSessionNet(t)
	dns := netip.MustParseAddr("10.20.255.254")
	spec := container.Spec{
		Name: "life", Rootfs: e.rootfs, NetnsPath: sn.path, DNS: dns,
		Hosts: map[string][]netip.Addr{"api.example.test": {netip.MustParseAddr("198.18.1.10")}},
	}
	start := time.Now()
	if err := e.m.Create(spec); err != nil {
		t.Fatal(err)
	}
	t.Logf("create+start: %v", time.Since(start))
	if err := e.m.Create(spec); !errors.Is(err, container.ErrExists) {
		t.Errorf("second create: %v, want ErrExists", err)
	}
	if !e.m.Exists("life") {
		t.Error("Exists(life) = false after create")
	}
	if names, err := e.m.List(); err != nil || !slices.Equal(names, []string{"life"}) {
		t.Errorf("List = %v, %v", names, err)
	}
	// A read-only root's layer dir is a tmpfs of its own, as private as a disk-backed one
	// (root's, 0700); the layer root beside it stays on the disk.
	layer := filepath.Join(e.cfg.LayerDir, e.cfg.Prefix+"-life")
	var fsLayer, fsRoot syscall.Statfs_t
	if err := syscall.Statfs(layer, &fsLayer); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Statfs(e.cfg.LayerDir, &fsRoot); err != nil {
		t.Fatal(err)
	}
	const tmpfsMagic = 0x01021994
	if fsLayer.Type != tmpfsMagic || fsRoot.Type == tmpfsMagic {
		t.Errorf("layer dir on fs %#x, layer root on %#x: want the layer dir alone a tmpfs", fsLayer.Type, fsRoot.Type)
	}
	fi, err := os.Stat(layer)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("layer dir %s: mode %v uid %d, want root's, mode 0700", layer, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
	}

	var times []time.Duration
	for range 5 {
		s := time.Now()
		e.mustRun(t, "life", "true")
		times = append(times, time.Since(s))
	}
	t.Logf("exec round trips: %v", times)

	if got := e.mustRun(t, "life", "hostname"); got != "life\n" {
		t.Errorf("hostname %q, want the session name", got)
	}
	if got := e.mustRun(t, "life", "grep -v '^#' /etc/resolv.conf"); got != "nameserver 10.20.255.254\noptions ndots:0\n" {
		t.Errorf("resolv.conf:\n%s", got)
	}
	if got := e.mustRun(t, "life", "grep api.example.test /etc/hosts"); got != "198.18.1.10\tapi.example.test\n" {
		t.Errorf("hosts entry %q", got)
	}
	if got := e.mustRun(t, "life", "ip -4 -o addr show dev eth0 | grep -o 'inet [0-9./]*'"); got != "inet "+sn.guest.String()+"/30\n" {
		t.Errorf("sandbox is not in the session netns: %q", got)
	}
	// The etc files are the session's, read-only.
	if r := e.run(t, "life", "echo nameserver 9.9.9.9 > /etc/resolv.conf"); r.code == 0 {
		t.Errorf("guest rewrote /etc/resolv.conf: %s", r)
	}

	// Arguments, env, working dir, user, stdin, separate streams, exit code.
	r := e.exec(t, "life", container.ExecSpec{
		Args:  []string{"sh", "-c", `pwd; echo "$FOO"; id -u; id -g; cat; echo to-stderr >&2; exit 7`},
		Env:   []string{"FOO=bar baz"},
		Dir:   "/tmp",
		User:  "1000:1001",
		Stdin: strings.NewReader("from stdin\n"),
	})
	if r.err != nil || r.code != 7 || r.stdout != "/tmp\nbar baz\n1000\n1001\nfrom stdin\n" || r.stderr != "to-stderr\n" {
		t.Errorf("exec with options: %s", r)
	}
	// One writer for both streams: one interleaved stream.
	var both bytes.Buffer
	code, err := e.m.Exec(context.Background(), "life", container.ExecSpec{
		Args: []string{"sh", "-c", "echo a; echo b >&2; echo c"}, Stdout: &both, Stderr: &both,
	})
	if err != nil || code != 0 || both.String() != "a\nb\nc\n" {
		t.Errorf("shared writer: %d %v %q", code, err, both.String())
	}
	// A signal's exit code is 128+N.
	if r := e.run(t, "life", "kill -TERM $$"); r.err != nil || r.code != 128+int(syscall.SIGTERM) {
		t.Errorf("killed by SIGTERM: %s", r)
	}
	// A missing program is an error, not a code.
	if r := e.exec(t, "life", container.ExecSpec{Args: []string{"/no/such/program"}}); r.err == nil {
		t.Errorf("missing program: %s", r)
	}
	if _, err := e.m.Exec(context.Background(), "nosuch", container.ExecSpec{Args: []string{"true"}}); !errors.Is(err, container.ErrNotFound) {
		t.Errorf("exec in unknown sandbox: %v, want ErrNotFound", err)
	}
	// pid 1 (the keeper) ignores every signal from inside the sandbox.
	if r := e.run(t, "life", "kill -9 1; kill -TERM 1; sleep 0.2; echo still-here"); r.stdout != "still-here\n" || !e.m.Exists("life") {
		t.Errorf("the sandbox's pid 1 died of a signal from inside: %s", r)
	}
	ctCheckNoZombies(t)

	// Destroy ends the execs still running, which return at once with SIGKILL's status.
	running := make(chan ctResult, 1)
	go func() { running <- e.run(t, "life", "echo started; exec sleep 1000") }()
	for e.mustRun(t, "life", "pidof sleep || true") == "" {
		time.Sleep(10 * time.Millisecond)
	}
	start = time.Now()
	if err := e.m.Destroy("life"); err != nil {
		t.Fatal(err)
	}
	t.Logf("destroy: %v", time.Since(start))
	select {
	case r := <-running:
		if r.err != nil || r.code != 128+int(syscall.SIGKILL) || r.stdout != "started\n" {
			t.Errorf("exec running through destroy: %s", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("exec still running 10s after its sandbox was destroyed")
	}
	if err := e.m.Destroy("life"); err != nil {
		t.Errorf("second destroy: %v", err)
	}
	if e.m.Exists("life") {
		t.Error("Exists(life) after destroy")
	}
	if _, err := e.m.Exec(context.Background(), "life", container.ExecSpec{Args: []string{"true"}}); !errors.Is(err, container.ErrNotFound) {
		t.Errorf("exec after destroy: %v, want ErrNotFound", err)
	}
	// The session netns is the session's: destroying the sandbox leaves it intact.
	out, err := exec.Command("ip", "-n", filepath.Base(sn.path), "-4", "-o", "addr", "show", "dev", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), sn.guest.String()) {
		t.Errorf("session netns after destroy: %v %s", err, out)
	}
	// Destroy removes the sandbox's own cgroups; the prefix's parents stay for the next
	// sandbox until Reap, which removes them once empty.
	paths, err := e.m.CgroupPaths("life")
	if err != nil {
		t.Fatal(err)
	}
	parentKept := false
	for ctrl, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cgroup %s (%s) left after destroy: %v", p, ctrl, err)
		}
		if _, err := os.Stat(filepath.Dir(p)); err == nil {
			parentKept = true
		}
	}
	if !parentKept {
		t.Error("the prefix's cgroup parents are gone after destroy, want them kept until Reap")
	}
	if gone, err := e.m.Reap(nil); err != nil || len(gone) != 0 {
		t.Errorf("reap after destroy: %v, removed %v, want nothing left to remove", err, gone)
	}
	e.checkNoResidue(t)
}

// ctCapEff returns the CapEff mask of a sandbox's shell.
func ctCapEff(t *testing.T, e *ctEnv, name string) uint64 {
	t.Helper()
	out := e.mustRun(t, name, "grep CapEff /proc/self/status")
	f := strings.Fields(out)
	v, err := strconv.ParseUint(f[len(f)-1], 16, 64)
	if err != nil {
		t.Fatalf("CapEff %q: %v", out, err)
	}
	return v
}

func ctHasCap(mask uint64, name string) bool {
	b, ok := container.CapabilityBit(name)
	if !ok {
		panic("unknown capability " + name)
	}
	return mask&(1<<b) != 0
}

func TestContainerCannotTouchTheNetwork(t *testing.T) {
	e := newCtEnv(t)
	sn := e.newSessionNet(t)
	// Ask for everything: the forbidden capabilities must still be absent.
	e.create(t, container.Spec{Name: "net", NetnsPath: sn.path, NetRaw: true, ExtraCaps: container.ForbiddenCapabilities()})
	mask := ctCapEff(t, e, "net")
	for _, c := range container.ForbiddenCapabilities() {
		if ctHasCap(mask, c) {
			t.Errorf("CapEff %#x has %s", mask, c)
		}
	}
	before := ctNetState(t, sn)
	for _, script := range []string{
		"ip link add evil0 type dummy",
		"ip link set eth0 down",
		"ip addr add 10.9.9.9/32 dev eth0",
		"ip addr del " + sn.guest.String() + "/30 dev eth0",
		"ip route add 198.18.0.0/15 dev eth0",
		"ip route del default",
		"ip route replace default via " + sn.gw.String() + " dev eth0 metric 1",
		"ip rule add from all lookup 100",
	} {
		r := e.run(t, "net", script)
		if r.code == 0 || !strings.Contains(r.stderr, "Operation not permitted") {
			t.Errorf("%q: want \"Operation not permitted\", got %s", script, r)
		}
	}
	for _, script := range []string{
		"echo 1 > /proc/sys/net/ipv4/ip_forward",
		"echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter",
		"sysctl -w net.ipv4.ip_forward=1",
		"echo b > /proc/sysrq-trigger",
	} {
		if r := e.run(t, "net", script); r.code == 0 {
			t.Errorf("%q succeeded: %s", script, r)
		}
	}
	// The ways out of the sandbox's namespaces (and into another netns, like the daemon's,
	// where the rules live) are closed by seccomp and the missing capabilities.
	// (busybox mount reports EPERM as "permission denied (are you root?)".)
	for _, script := range []string{
		"unshare -n true",
		"unshare -U -r true",
		"nsenter -t 1 -n true",
		"mount -t tmpfs none /mnt",
		"mount -o remount,rw /proc/sys",
	} {
		r := e.run(t, "net", script)
		if r.code == 0 || !(strings.Contains(r.stderr, "not permitted") || strings.Contains(r.stderr, "permission denied")) {
			t.Errorf("%q: want EPERM, got %s", script, r)
		}
	}
	if got := e.mustRun(t, "net", "cat /proc/sys/net/ipv4/ip_forward"); got != "0\n" && got != "1\n" {
		t.Errorf("/proc/sys not readable: %q", got)
	}
	if after := ctNetState(t, sn); after != before {
		t.Errorf("session netns changed:\nbefore %s\nafter  %s", before, after)
	}
}

// ctNetState is what the session netns looks like: links, addresses, routes, rules.
func ctNetState(t *testing.T, sn ctSessionNet) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{{"-o", "link"}, {"-4", "-o", "addr"}, {"route"}, {"rule"}} {
		out, err := exec.Command("ip", append([]string{"-n", filepath.Base(sn.path)}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
		b.Write(out)
	}
	return b.String()
}

func TestContainerNetRaw(t *testing.T) {
	e := newCtEnv(t)
	plain, raw := e.newSessionNet(t), e.newSessionNet(t)
	e.create(t, container.Spec{Name: "plain", NetnsPath: plain.path})
	e.create(t, container.Spec{Name: "raw", NetnsPath: raw.path, NetRaw: true})
	if m := ctCapEff(t, e, "plain"); ctHasCap(m, "CAP_NET_RAW") {
		t.Errorf("plain CapEff %#x has CAP_NET_RAW", m)
	}
	if m := ctCapEff(t, e, "raw"); !ctHasCap(m, "CAP_NET_RAW") || ctHasCap(m, "CAP_NET_ADMIN") {
		t.Errorf("raw CapEff %#x: want CAP_NET_RAW without CAP_NET_ADMIN", m)
	}
	// The neighbour is the session's gateway in the simulated host; it answers ICMP.
	if err := world.Ping(plain.path, plain.gw, 2*time.Second); err != nil {
		t.Fatalf("the gateway does not answer a ping from the session netns itself: %v", err)
	}
	if r := e.run(t, "plain", "ping -c 1 -W 2 "+plain.gw.String()); r.code == 0 {
		t.Errorf("ping without NET_RAW worked: %s", r)
	}
	if r := e.run(t, "raw", "ping -c 1 -W 2 "+raw.gw.String()); r.code != 0 || !strings.Contains(r.stdout, "1 packets received") {
		t.Errorf("ping with NET_RAW failed: %s", r)
	}
}

func TestContainerMemoryLimit(t *testing.T) {
	e := newCtEnv(t)
	e.create(t, container.Spec{Name: "mem", MemoryBytes: 32 << 20})
	// tail keeps the "last line" of an endless line in memory: it grows until killed.
	r := e.exec(t, "mem", container.ExecSpec{Args: []string{"tail", "/dev/zero"}, Timeout: 60 * time.Second})
	// Killed by the kernel at the limit: 137, and Exec says why.
	var oom *container.OOMError
	if !errors.As(r.err, &oom) || r.code != 128+int(syscall.SIGKILL) || oom.Limit != 32<<20 {
		t.Fatalf("memory hog: want SIGKILL (137) with an *OOMError naming the 32 MiB limit, got %s", r)
	}
	paths, err := e.m.CgroupPaths("mem")
	if err != nil {
		t.Fatal(err)
	}
	if kills := ctOomKills(t, paths); kills < 1 {
		t.Errorf("oom_kill count %d, want at least 1", kills)
	}
	// The sandbox (and this process) carry on.
	if got := e.mustRun(t, "mem", "echo alive"); got != "alive\n" {
		t.Errorf("after the OOM kill: %q", got)
	}
}

// ctOomKills reads the oom_kill counter of a sandbox's memory cgroup (v1 or v2).
func ctOomKills(t *testing.T, paths map[string]string) int {
	t.Helper()
	file := filepath.Join(paths["memory"], "memory.oom_control")
	if p, ok := paths[""]; ok && paths["memory"] == "" {
		file = filepath.Join(p, "memory.events")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatalf("no oom_kill in %s:\n%s", file, b)
	return 0
}

func ctCgroupInt(t *testing.T, paths map[string]string, ctrl, file string) int {
	t.Helper()
	dir := paths[ctrl]
	if dir == "" {
		dir = paths[""]
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s/%s: %q", dir, file, b)
	}
	return n
}

// ctWaitTasks waits (up to 5s) until the sandbox's pids cgroup holds want tasks.
func ctWaitTasks(t *testing.T, paths map[string]string, want int) {
	t.Helper()
	n := 0
	for range 500 {
		if n = ctCgroupInt(t, paths, "pids", "pids.current"); n == want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%d tasks in the sandbox, want %d", n, want)
}

func TestContainerPidsLimit(t *testing.T) {
	e := newCtEnv(t)
	const limit = 32
	e.create(t, container.Spec{Name: "pids", PidsMax: limit})
	paths, err := e.m.CgroupPaths("pids")
	if err != nil {
		t.Fatal(err)
	}
	// A fork bomb, stopped by the exec timeout; meanwhile the task count stays at the limit.
	// The leader starts it and then only sleeps (exec: no fork that could fail), so it is
	// the timeout that ends it, killing the whole process group.
	done := make(chan ctResult, 1)
	go func() {
		done <- e.exec(t, "pids", container.ExecSpec{
			Args:    []string{"sh", "-c", "b() { b | b & }; b; exec sleep 100"},
			Timeout: 3 * time.Second,
		})
	}()
	peak := 0
	for r := (ctResult{}); ; {
		select {
		case r = <-done:
		case <-time.After(50 * time.Millisecond):
			peak = max(peak, ctCgroupInt(t, paths, "pids", "pids.current"))
			continue
		}
		if !errors.Is(r.err, container.ErrTimeout) {
			t.Errorf("fork bomb: want ErrTimeout, got %s", r)
		}
		break
	}
	if peak > limit || peak < limit-4 {
		t.Errorf("pids.current peaked at %d, want the limit %d", peak, limit)
	}
	ctWaitTasks(t, paths, 1) // the bomb's process group is gone: only the keeper is left

	// A bounded loop of background sleeps hits the limit with a fork error and no more.
	// (Short sleeps: while they run, the full pids cgroup leaves no room to exec anything.)
	r := e.run(t, "pids", "i=0; while [ $i -lt 100 ]; do sleep 2 & i=$((i+1)); done; echo all-started")
	if r.code == 0 || strings.Contains(r.stdout, "all-started") || !strings.Contains(r.stderr, "can't fork") {
		t.Errorf("100 background sleeps under a limit of %d: %s", limit, r)
	}
	if n := ctCgroupInt(t, paths, "pids", "pids.current"); n > limit {
		t.Errorf("pids.current %d over %d", n, limit)
	}
	ctWaitTasks(t, paths, 1) // the sleeps end; the keeper reaps them
	if got := e.mustRun(t, "pids", "echo alive"); got != "alive\n" {
		t.Errorf("after the bomb: %q", got)
	}
}

func TestContainerExecTimeout(t *testing.T) {
	e := newCtEnv(t)
	e.create(t, container.Spec{Name: "slow"})
	paths, err := e.m.CgroupPaths("slow")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := e.exec(t, "slow", container.ExecSpec{
		Args:    []string{"sh", "-c", "sleep 1000 & sleep 1000 & echo started; wait"},
		Timeout: time.Second,
	})
	took := time.Since(start)
	if !errors.Is(r.err, container.ErrTimeout) || r.code != -1 || r.stdout != "started\n" {
		t.Errorf("want ErrTimeout after the output, got %s", r)
	}
	if took > 5*time.Second {
		t.Errorf("timeout of 1s took %v", took)
	}
	ctWaitTasks(t, paths, 1) // the whole process group is gone: only the keeper is left
	// Cancelling the context kills the group the same way.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	code, err := e.m.Exec(ctx, "slow", container.ExecSpec{Args: []string{"sleep", "1000"}})
	if !errors.Is(err, context.DeadlineExceeded) || code != -1 {
		t.Errorf("cancelled exec: %d %v", code, err)
	}
	ctCheckNoZombies(t)
}

func TestContainerConcurrentExecs(t *testing.T) {
	e := newCtEnv(t)
	e.create(t, container.Spec{Name: "par"})
	const n = 10
	results := make([]ctResult, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			results[i] = e.exec(t, "par", container.ExecSpec{
				Args:    []string{"sh", "-c", fmt.Sprintf("for j in 1 2 3; do echo out-%d-$j; echo err-%d-$j >&2; done; sleep 0.2; exit %d", i, i, i)},
				Timeout: 30 * time.Second,
			})
		})
	}
	wg.Wait()
	t.Logf("%d concurrent execs: %v", n, time.Since(start))
	for i, r := range results {
		wantOut := fmt.Sprintf("out-%d-1\nout-%d-2\nout-%d-3\n", i, i, i)
		wantErr := fmt.Sprintf("err-%d-1\nerr-%d-2\nerr-%d-3\n", i, i, i)
		if r.err != nil || r.code != i || r.stdout != wantOut || r.stderr != wantErr {
			t.Errorf("exec %d: %s", i, r)
		}
	}
	ctCheckNoZombies(t)
}

// ctTreeHash hashes every path, type, mode, owner, size, modification time, link target and
// file content under dir.
func ctTreeHash(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %v %d:%d %d %d.%d\n", rel, info.Mode(), st.Uid, st.Gid, info.Size(), st.Mtim.Sec, st.Mtim.Nsec)
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "-> %s\n", target)
		case info.Mode().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(h, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestContainerImageUnchanged(t *testing.T) {
	e := newCtEnv(t)
	image := ctBuildRootfs(t) // this test's own image, whatever ENFORCERD_ROOTFS is
	before := ctTreeHash(t, image)

	e.create(t, container.Spec{Name: "rw", Rootfs: image, Writable: true})
	e.create(t, container.Spec{Name: "ro", Rootfs: image})
	e.mustRun(t, "rw", strings.Join([]string{
		"echo hello > /etc/newfile",
		"echo 'eve:x:0:0::/:/bin/sh' >> /etc/passwd",
		"rm /bin/cat",
		"mkdir -p /root/deep/dir && echo x > /root/deep/dir/f",
		"touch /bin/sh",
		"chmod 000 /etc/group",
		"ln -s /etc/newfile /newlink",
	}, " && "))
	if got := e.mustRun(t, "rw", "/bin/busybox cat /etc/newfile; /bin/busybox grep -c eve /etc/passwd"); got != "hello\n1\n" {
		t.Errorf("writable session does not see its writes: %q", got)
	}
	// The other session shares the image and sees none of it.
	if got := e.mustRun(t, "ro", "ls /etc/newfile 2>/dev/null; grep -c eve /etc/passwd; ls /bin/cat"); got != "0\n/bin/cat\n" {
		t.Errorf("read-only session sees the other's writes: %q", got)
	}
	// The read-only root refuses writes; /tmp is a writable tmpfs.
	if r := e.run(t, "ro", "echo x > /etc/newfile"); r.code == 0 || !strings.Contains(r.stderr, "Read-only file system") {
		t.Errorf("write to a read-only root: %s", r)
	}
	if got := e.mustRun(t, "ro", "echo x > /tmp/f && cat /tmp/f"); got != "x\n" {
		t.Errorf("/tmp in a read-only session: %q", got)
	}
	for _, n := range []string{"rw", "ro"} {
		if err := e.m.Destroy(n); err != nil {
			t.Fatal(err)
		}
	}
	if after := ctTreeHash(t, image); after != before {
		t.Error("the image directory changed after sessions wrote to their filesystems")
	}
}

func TestContainerReapAndAdopt(t *testing.T) {
	e := newCtEnv(t)
	for _, n := range []string{"a", "b", "c"} {
		e.create(t, container.Spec{Name: n})
	}
	// The remains of an interrupted create: a layer dir and a cgroup, no container state.
	stray := filepath.Join(e.cfg.LayerDir, e.cfg.Prefix+"-d")
	if err := os.MkdirAll(filepath.Join(stray, "upper"), 0o755); err != nil {
		t.Fatal(err)
	}
	paths, err := e.m.CgroupPaths("e")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Another prefix's sandbox in the same directories is not ours to reap.
	otherCfg := e.cfg
	otherCfg.Prefix = e.cfg.Prefix + "x"
	other, err := container.New(otherCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Create(container.Spec{Name: "a", Rootfs: e.rootfs}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := other.Destroy("a"); err != nil {
			t.Errorf("destroy other prefix's a: %v", err)
		}
	})

	removed, err := e.m.Reap(map[string]bool{"b": true})
	if err != nil || !slices.Equal(removed, []string{"a", "c", "d", "e"}) {
		t.Fatalf("Reap = %v, %v; want [a c d e]", removed, err)
	}
	if names, _ := e.m.List(); !slices.Equal(names, []string{"b"}) {
		t.Errorf("List after reap = %v", names)
	}
	if _, err := os.Stat(stray); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stray layer dir left: %v", err)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("stray cgroup %s left: %v", p, err)
		}
	}
	if !other.Exists("a") {
		t.Error("reap removed another prefix's sandbox")
	}

	// A restarted daemon (a new Manager on the same directories) re-adopts b.
	again, err := container.New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Exists("b") || again.Exists("a") {
		t.Errorf("after restart: Exists(b)=%v Exists(a)=%v", again.Exists("b"), again.Exists("a"))
	}
	if err := again.Load("b"); err != nil {
		t.Fatal(err)
	}
	if err := again.Load("a"); !errors.Is(err, container.ErrNotFound) {
		t.Errorf("Load(a) after reap: %v, want ErrNotFound", err)
	}
	var out bytes.Buffer
	if code, err := again.Exec(context.Background(), "b", container.ExecSpec{Args: []string{"hostname"}, Stdout: &out}); err != nil || code != 0 || out.String() != "b\n" {
		t.Errorf("exec in adopted sandbox: %d %v %q", code, err, out.String())
	}
	if err := again.Destroy("b"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Destroy("b"); err != nil {
		t.Errorf("destroy b through the old manager after the new one did: %v", err)
	}
}

func TestContainerUserNS(t *testing.T) {
	e := newCtEnv(t)
	sn := e.newSessionNet(t)
	e.create(t, container.Spec{Name: "uns", NetnsPath: sn.path, UserNS: true, NetRaw: true, Writable: true})
	if got := e.mustRun(t, "uns", "id -u; cat /proc/self/uid_map"); !strings.Contains(got, "0\n") || !strings.Contains(got, fmt.Sprint(container.UserNSHostID)) {
		t.Errorf("user namespace mapping: %q", got)
	}
	// The image's files belong to host root, unmapped here (nobody); the sticky /tmp and the
	// session's own upper layer root are writable.
	e.mustRun(t, "uns", "echo x > /tmp/f && cat /tmp/f && mkdir /own && touch /own/f")
	// Root in a user namespace that does not own the netns has no power over it, NET_RAW
	// included.
	if r := e.run(t, "uns", "ip link add evil0 type dummy"); r.code == 0 || !strings.Contains(r.stderr, "Operation not permitted") {
		t.Errorf("ip link add in a user namespace: %s", r)
	}
	if r := e.run(t, "uns", "ping -c 1 -W 2 "+sn.gw.String()); r.code == 0 {
		t.Errorf("ping worked from a user namespace: %s", r)
	}
	// A read-only root in a user namespace: its layer dir is a tmpfs its root may search (and
	// nobody else), holding the writable home; the root itself stays read-only.
	e.create(t, container.Spec{Name: "unsro", NetnsPath: sn.path, UserNS: true})
	if got := e.mustRun(t, "unsro", "id -u; echo x > /root/f && cat /root/f; echo y > /tmp/g && cat /tmp/g"); got != "0\nx\ny\n" {
		t.Errorf("read-only root in a user namespace: %q, want root with a writable home and /tmp", got)
	}
	if r := e.run(t, "unsro", "touch /own"); r.code == 0 {
		t.Errorf("wrote to a read-only root in a user namespace: %s", r)
	}
}

// ctBenchManager is a Manager for a benchmark, with its own image and prefix.
func ctBenchManager(b *testing.B) (*container.Manager, string) {
	b.Helper()
	world.RequireRoot(b)
	tmp := b.TempDir()
	image := filepath.Join(tmp, "rootfs")
	if out, err := exec.Command("../scripts/mkrootfs.sh", image).CombinedOutput(); err != nil {
		b.Fatalf("mkrootfs: %v\n%s", err, out)
	}
	m, err := container.New(container.Config{
		StateDir: filepath.Join(tmp, "state"),
		LayerDir: filepath.Join(tmp, "layers"),
		Prefix:   "cb" + strconv.Itoa(os.Getpid()),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if _, err := m.Reap(nil); err != nil {
			b.Errorf("reap: %v", err)
		}
	})
	return m, image
}

// BenchmarkContainerCreateDestroy: create+start of a sandbox (own netns, read-only root), and
// its destroy, reported separately.
func BenchmarkContainerCreateDestroy(b *testing.B) {
	m, image := ctBenchManager(b)
	var create, destroy time.Duration
	for i := 0; b.Loop(); i++ {
		name := "b" + strconv.Itoa(i)
		s := time.Now()
		if err := m.Create(container.Spec{Name: name, Rootfs: image}); err != nil {
			b.Fatal(err)
		}
		create += time.Since(s)
		s = time.Now()
		if err := m.Destroy(name); err != nil {
			b.Fatal(err)
		}
		destroy += time.Since(s)
	}
	b.ReportMetric(float64(create.Microseconds())/float64(b.N)/1000, "create-ms/op")
	b.ReportMetric(float64(destroy.Microseconds())/float64(b.N)/1000, "destroy-ms/op")
}

// BenchmarkContainerExec: the round trip of `true` in a running sandbox.
func BenchmarkContainerExec(b *testing.B) {
	m, image := ctBenchManager(b)
	if err := m.Create(container.Spec{Name: "x", Rootfs: image}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if code, err := m.Exec(context.Background(), "x", container.ExecSpec{Args: []string{"true"}}); err != nil || code != 0 {
			b.Fatal(code, err)
		}
	}
}
