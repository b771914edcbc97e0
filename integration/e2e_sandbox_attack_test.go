package integration

// Attacks on the sandbox side of containment, through the real binary: an
// API caller in the socket group asking for the host's root as an image, a
// host user reaching what a writable sandbox wrote, a sandbox burning every
// CPU, and binary standard input. Each test performs the attack and, in the
// same run, a positive control that shows the path it attacks works.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
)

// e2eFakeImage makes dir/bin so that dir passes the "is a root filesystem"
// check: every refusal below is then the image grant's, not that one's.
func e2eFakeImage(t *testing.T, dir string, mode os.FileMode, uid int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
}

// TestE2ESandboxRootfsGrant: a socket-group member asks for the host's own
// root (and other directories the operator never granted) as a sandbox
// image. Every one is refused with one line naming it; an image inside
// --images-dir works for the same caller.
func TestE2ESandboxRootfsGrant(t *testing.T) {
	dir := e2eWorldSearchableDir(t, "e2e-rootfs-")
	e := prepareE2E(t, dir, "--socket-group", strconv.Itoa(e2eSocketGroup))
	client := filepath.Join(dir, "enforcerd-client")
	e2eCopyFile(t, e.bin, client, 0o755)

	// A second image directory with images the grant must refuse.
	images := filepath.Join(dir, "images")
	if err := os.Mkdir(images, 0o755); err != nil {
		t.Fatal(err)
	}
	// Both look like root filesystems too, so that the grant is what refuses them.
	e2eFakeImage(t, dir, 0o755, 0)
	e2eFakeImage(t, images, 0o755, 0)
	e2eFakeImage(t, filepath.Join(images, "userowned"), 0o755, e2eNobody)
	e2eFakeImage(t, filepath.Join(images, "groupwritable"), 0o775, 0)
	e2eFakeImage(t, filepath.Join(images, "otherwritable"), 0o757, 0)
	e2eFakeImage(t, filepath.Join(images, "userdir"), 0o755, e2eNobody)
	e2eFakeImage(t, filepath.Join(images, "userdir", "img"), 0o755, 0)
	for link, target := range map[string]string{"toroot": "/", "tousr": "/usr", "up": ".."} {
		if err := os.Symlink(target, filepath.Join(images, link)); err != nil {
			t.Fatal(err)
		}
	}
	e.d.ImagesDirs = append(e.d.ImagesDirs, images)
	e.start()
	member := func(args ...string) (string, string, int) {
		t.Helper()
		return e.asUser(client, e2eNobody, e2eNobody, []uint32{e2eSocketGroup}, args...)
	}

	// Positive control: the member gets a sandbox from a granted image and
	// is root in it.
	if out, errOut, code := member("session", "create", "granted", "--rootfs", e.rootfs); code != 0 {
		t.Fatalf("member: create from the granted image %s: exit %d %q %q", e.rootfs, code, out, errOut)
	}
	if out, errOut, code := member("session", "exec", "granted", "--", "id", "-u"); code != 0 || out != "0\n" {
		t.Fatalf("member: exec id -u in granted: exit %d %q %q", code, out, errOut)
	}

	// The attack: the host's root as the image, then read its shadow file.
	hostShadow, err := os.ReadFile("/etc/shadow")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, code := member("session", "create", "evil", "--rootfs", "/"); code == 0 {
		out, _, _ := member("session", "exec", "evil", "--", "cat", "/etc/shadow")
		t.Errorf("member: create --rootfs / succeeded; the sandbox read the host's /etc/shadow: %v", out == string(hostShadow) && out != "")
		member("session", "rm", "evil")
	}

	refused := func(rootfs, want string) {
		t.Helper()
		out, errOut, code := member("session", "create", "evil", "--rootfs", rootfs)
		if code == 0 {
			member("session", "rm", "evil")
		}
		if code != 1 || out != "" || !strings.Contains(errOut, fmt.Sprintf("rootfs %q", rootfs)) || !strings.Contains(errOut, want) {
			t.Errorf("member: create --rootfs %s: exit %d stdout %q stderr %q; want exit 1, the value named and %q", rootfs, code, out, errOut, want)
		}
		if code != 0 {
			e2eOneLine(t, "create --rootfs "+rootfs, errOut)
		}
	}
	refused("/", "the host's root directory is never an image")
	refused("/usr", "not inside an image directory")
	refused(filepath.Dir(images), "not inside an image directory")
	refused(images, "is the image directory")
	refused(filepath.Join(images, "toroot"), "the host's root directory is never an image")
	refused(filepath.Join(images, "tousr"), "not inside an image directory")
	refused(filepath.Join(images, "up"), "not inside an image directory")
	refused(filepath.Join(images, "userowned"), "owned by uid 65534, not root")
	refused(filepath.Join(images, "groupwritable"), "writable by group or others")
	refused(filepath.Join(images, "otherwritable"), "writable by group or others")
	refused(filepath.Join(images, "userdir", "img"), "owned by uid 65534, not root")

	// An image directory that itself became writable by others grants
	// nothing any more.
	if err := os.Chmod(images, 0o777); err != nil {
		t.Fatal(err)
	}
	e2eFakeImage(t, filepath.Join(images, "fine"), 0o755, 0)
	refused(filepath.Join(images, "fine"), "writable by group or others")
	e.expectConsistent("after the refused images")

	// Default: no --images-dir, every --rootfs is refused (root included),
	// with a line that says what the operator must do.
	if err := e.d.Stop(); err != nil {
		t.Fatal(err)
	}
	e.d.ImagesDirs = nil
	e.start()
	msg := e.expectFail(1, "session", "create", "again", "--rootfs", e.rootfs)
	if !strings.Contains(msg, fmt.Sprintf("rootfs %q", e.rootfs)) || !strings.Contains(msg, "--images-dir") {
		t.Errorf("create without --images-dir: %q, want the value named and --images-dir", msg)
	}
	// The session made before the restart is still served.
	if out := e.cli("session", "exec", "granted", "--", "echo", "up"); out != "up\n" {
		t.Errorf("exec in granted after the restart: %q", out)
	}
}

// TestE2ESandboxLayerUnreachable: a writable sandbox writes a setuid-root
// copy of a binary into its root; a host user cannot reach it through the
// session's layer directory, even when the state directory pre-exists
// world-searchable.
func TestE2ESandboxLayerUnreachable(t *testing.T) {
	dir := e2eSetuidSearchableDir(t, "e2e-layers-")
	e := prepareE2E(t, dir)
	// The state and layer dirs pre-exist, world-searchable (an operator's
	// mkdir, a package's default).
	for _, d := range []string{e.d.StateDir, filepath.Join(e.d.StateDir, "layers")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	client := filepath.Join(dir, "enforcerd-client")
	e2eCopyFile(t, e.bin, client, 0o755)
	e.start()
	e.create("rw", "--writable")
	e.mustSh("rw", "cp /bin/busybox /suid && chmod 4755 /suid")

	layer := filepath.Join(e.d.StateDir, "layers", e.d.Prefix+"-rw")
	planted := []string{filepath.Join(layer, "upper", "suid"), filepath.Join(layer, "rootfs", "suid")}
	// Positive control: the file is there, setuid root, for root.
	for _, p := range planted {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatalf("root: stat %s: %v", p, err)
		}
		if fi.Mode()&os.ModeSetuid == 0 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Fatalf("root: %s: mode %v uid %d, want setuid root", p, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
		}
	}
	// asNobody runs name as uid and gid 65534; started is false when the
	// kernel refused to execute it at all.
	asNobody := func(name string, args ...string) (out string, started bool, err error) {
		cmd := exec.Command(name, args...)
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: e2eNobody, Gid: e2eNobody, Groups: []uint32{}}}
		b, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		return string(b), err == nil || errors.As(err, &ee), err
	}
	// Positive control: the host user runs programs and reaches the state
	// directory; only the layer dirs stand in its way.
	if out, _, err := asNobody(client, "version"); err != nil {
		t.Fatalf("nobody: run %s version: %v %q", client, err, out)
	}
	if out, _, err := asNobody("stat", e.d.StateDir); err != nil {
		t.Fatalf("nobody: stat %s: %v %q", e.d.StateDir, err, out)
	}
	// The attack: execute the planted binary (busybox picks its applet from
	// argv[0]: "sh -c id" shows whether the setuid bit took), or even see it.
	for _, p := range planted {
		if out, started, err := asNobody(p, "sh", "-c", "id"); started {
			t.Errorf("nobody: executed %s (setuid root, written by the sandbox): %v %q", p, err, out)
		}
		if out, _, err := asNobody("stat", p); err == nil {
			t.Errorf("nobody: stat %s: reachable: %q", p, out)
		}
	}
	for _, d := range []string{filepath.Join(e.d.StateDir, "layers"), layer} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm()&0o007 != 0 {
			t.Errorf("%s: %v %v, want no access for others", d, fi.Mode(), err)
		}
	}
}

// e2eSandboxCgroup is the cpu (v2: unified) cgroup directory of a session's
// sandbox: "<prefix>/<prefix>-<name>" below the daemon's own cgroup (v1) or
// its parent (v2), as libcontainer places it for a relative parent.
func e2eSandboxCgroup(t *testing.T, e *e2eEnv, name string) (dir string, v2 bool) {
	t.Helper()
	own, err := cgroups.ParseCgroupFile(fmt.Sprintf("/proc/%d/cgroup", e.d.PID()))
	if err != nil {
		t.Fatal(err)
	}
	rel := filepath.Join(e.d.Prefix, e.d.Prefix+"-"+name)
	if cgroups.IsCgroup2UnifiedMode() {
		dir = filepath.Join("/sys/fs/cgroup", filepath.Dir(own[""]), rel)
		v2 = true
	} else {
		mnt, err := cgroups.FindCgroupMountpoint("", "cpu")
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(mnt, own["cpu"], rel)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("cgroup of %s: %v", name, err)
	}
	return dir, v2
}

// e2eCPUUsage is the CPU time the session's cgroup has used.
func e2eCPUUsage(t *testing.T, e *e2eEnv, name string) time.Duration {
	t.Helper()
	dir, v2 := e2eSandboxCgroup(t, e, name)
	if v2 {
		stat, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(stat), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return time.Duration(us) * time.Microsecond
			}
		}
		t.Fatalf("%s/cpu.stat: no usage_usec", dir)
	}
	mnt, err := cgroups.FindCgroupMountpoint("", "cpuacct")
	if err != nil {
		t.Fatal(err)
	}
	cpuMnt, _ := cgroups.FindCgroupMountpoint("", "cpu")
	b, err := os.ReadFile(filepath.Join(mnt, strings.TrimPrefix(dir, cpuMnt), "cpuacct.usage"))
	if err != nil {
		t.Fatal(err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(ns)
}

// e2eCPULimit is the session's CPU limit as the kernel holds it, in CPUs
// (+Inf when unlimited).
func e2eCPULimit(t *testing.T, e *e2eEnv, name string) float64 {
	t.Helper()
	dir, v2 := e2eSandboxCgroup(t, e, name)
	var quota, period string
	if v2 {
		b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
		if err != nil {
			t.Fatal(err)
		}
		quota, period, _ = strings.Cut(strings.TrimSpace(string(b)), " ")
	} else {
		q, err1 := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us"))
		p, err2 := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us"))
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		quota, period = strings.TrimSpace(string(q)), strings.TrimSpace(string(p))
	}
	if quota == "max" || quota == "-1" {
		return math.Inf(1)
	}
	q, err1 := strconv.ParseFloat(quota, 64)
	p, err2 := strconv.ParseFloat(period, 64)
	if err1 != nil || err2 != nil || p == 0 {
		t.Fatalf("cgroup %s: quota %q period %q", dir, quota, period)
	}
	return q / p
}

// e2eBurn runs a busy loop of n processes in each named sandbox at once,
// for d (exec --timeout), and returns each cgroup's CPU use over the wall
// time, in CPUs.
func e2eBurn(t *testing.T, e *e2eEnv, n int, d time.Duration, names ...string) map[string]float64 {
	t.Helper()
	script := strings.Repeat("while :; do :; done & ", n-1) + "while :; do :; done"
	before := map[string]time.Duration{}
	for _, name := range names {
		before[name] = e2eCPUUsage(t, e, name)
	}
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
			defer cancel()
			_, _, code, _ := e.d.CLIStatus(ctx, "session", "exec", name, "--timeout", d.String(), "--", "sh", "-c", script)
			mu.Lock()
			codes[name] = code
			mu.Unlock()
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	used := map[string]float64{}
	for _, name := range names {
		if codes[name] != exitTimeoutE2E {
			t.Fatalf("busy loop in %s: exit %d, want %d (killed at its timeout)", name, codes[name], exitTimeoutE2E)
		}
		used[name] = float64(e2eCPUUsage(t, e, name)-before[name]) / float64(wall)
	}
	t.Logf("CPU use of %d busy loops over %v: %v (CPUs)", n, wall.Round(time.Millisecond), used)
	return used
}

// TestE2ESandboxCPULimit: a sandbox without --cpus cannot take more than
// the default one CPU, however many busy loops it runs; a busy loop with
// --cpus 0.2 gets about a fifth of a CPU while one with --cpus 1 (the
// control, at the same time) gets several times more; out-of-range values
// are refused with one line.
func TestE2ESandboxCPULimit(t *testing.T) {
	e := newE2E(t)
	// The attack: every CPU of the machine, from a sandbox created with no
	// limit asked for.
	e.create("dflt")
	if got := e2eCPULimit(t, e, "dflt"); got != 1 {
		t.Errorf("no --cpus: kernel CPU limit %v, want the default 1", got)
	}
	if runtime.NumCPU() >= 2 {
		if used := e2eBurn(t, e, 2, 3*time.Second, "dflt"); used["dflt"] > 1.15 {
			t.Errorf("no --cpus: two busy loops used %.2f CPUs, want at most the default 1", used["dflt"])
		}
	}

	e.create("slow", "--cpus", "0.2")
	e.create("fast", "--cpus", "1")
	for name, want := range map[string]float64{"slow": 0.2, "fast": 1} {
		if got := e2eCPULimit(t, e, name); math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: kernel CPU limit %v, want %v", name, got, want)
		}
	}
	used := e2eBurn(t, e, 1, 3*time.Second, "slow", "fast")
	if used["slow"] > 0.3 {
		t.Errorf("--cpus 0.2: the busy loop used %.2f of a CPU, want at most 0.3", used["slow"])
	}
	// The control, with margin for a loaded machine (its other tenants
	// take from fast, never from slow's quota): fast gets well over 0.2.
	if used["fast"] < 1.5*used["slow"] || used["fast"] < 0.25 {
		t.Errorf("control --cpus 1: the busy loop used %.2f of a CPU, want at least 1.5 times the --cpus 0.2 one's %.2f", used["fast"], used["slow"])
	}

	// Refusals: the command line's own (exit 2) and the daemon's (exit 1).
	for _, v := range []string{"0", "-1", "abc", "NaN", "Inf"} {
		msg := e.expectFail(2, "session", "create", "bad", "--rootfs", e.rootfs, "--cpus", v)
		if !strings.Contains(msg, strconv.Quote(v)) {
			t.Errorf("--cpus %s: %q, want the value named", v, msg)
		}
	}
	tooMany := strconv.Itoa(runtime.NumCPU() + 1)
	msg := e.expectFail(1, "session", "create", "bad", "--rootfs", e.rootfs, "--cpus", tooMany)
	if !strings.Contains(msg, "cpus "+tooMany) || !strings.Contains(msg, strconv.Itoa(runtime.NumCPU())) {
		t.Errorf("--cpus %s: %q, want the value and the machine's CPU count named", tooMany, msg)
	}
	e.expectConsistent("after the CPU limits")
}

// exitTimeoutE2E is session exec's exit status on --timeout.
const exitTimeoutE2E = 124

// TestE2ESandboxStdinBytes: `session exec --stdin` delivers every byte value
// and invalid UTF-8 exactly; the hash inside the sandbox equals the local
// one. The control: plain ASCII through the same path.
func TestE2ESandboxStdinBytes(t *testing.T) {
	e := newE2E(t)
	e.create("box")
	var all []byte
	for range 4 {
		for b := range 256 {
			all = append(all, byte(b))
		}
	}
	all = append(all, "\xc3\x28 \xa0\xa1 \xe2\x28\xa1 \xf0\x28\x8c\x28 \xed\xa0\x80 \xef\xbf\xbd \x00\x00"...)
	big := bytes.Repeat(all, 200) // ~200 KiB: several pipe buffers
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"ascii (control)", []byte("one\ntwo\nthree\n")},
		{"every byte value and invalid UTF-8", all},
		{"200 KiB of them", big},
	} {
		sum := sha256.Sum256(tc.data)
		want := hex.EncodeToString(sum[:])
		out := e2eExecStdin(t, e, tc.data, "sha256sum")
		if got, _, _ := strings.Cut(string(out), " "); got != want {
			t.Errorf("%s: sha256sum in the sandbox %q, want %s (%d bytes sent)", tc.name, got, want, len(tc.data))
		}
		if out := e2eExecStdin(t, e, tc.data, "cat"); !bytes.Equal(out, tc.data) {
			t.Errorf("%s: cat in the sandbox returned %d bytes, not the %d sent", tc.name, len(out), len(tc.data))
		}
	}
}

func e2eExecStdin(t *testing.T, e *e2eEnv, data []byte, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	cmd := e.d.Command(ctx, append([]string{"session", "exec", "box", "--stdin", "--"}, args...)...)
	cmd.Stdin = bytes.NewReader(data)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("exec --stdin %v: %v %q", args, err, errOut.String())
	}
	return out
}
