package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/enforcerd/enforcerd/integration/world"
	"golang.org/x/sys/unix"
)

// unitSettings reads scripts/enforcerd.service: key -> values (repeated
// keys accumulate).
func unitSettings(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "scripts", "enforcerd.service"))
	if err != nil {
		t.Fatalf("read the shipped unit: %v", err)
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("unit line %q: no '='", line)
		}
		out[k] = append(out[k], v)
	}
	return out
}

// capNumbers maps the capability names a unit may list to their numbers.
var capNumbers = map[string]int{
	"CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "CAP_DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH,
	"CAP_FOWNER": unix.CAP_FOWNER, "CAP_FSETID": unix.CAP_FSETID, "CAP_KILL": unix.CAP_KILL, "CAP_SETGID": unix.CAP_SETGID,
	"CAP_SETUID": unix.CAP_SETUID, "CAP_SETPCAP": unix.CAP_SETPCAP, "CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE,
	"CAP_NET_RAW": unix.CAP_NET_RAW, "CAP_NET_ADMIN": unix.CAP_NET_ADMIN, "CAP_SYS_CHROOT": unix.CAP_SYS_CHROOT,
	"CAP_SYS_PTRACE": unix.CAP_SYS_PTRACE, "CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN, "CAP_SYS_RESOURCE": unix.CAP_SYS_RESOURCE,
	"CAP_MKNOD": unix.CAP_MKNOD, "CAP_AUDIT_WRITE": unix.CAP_AUDIT_WRITE,
}

// TestE2EUnitSettings: the shipped unit gives the daemon
// no mount namespace of its own and no seccomp filter its sandboxes would
// inherit, delegates its cgroup, and bounds its capabilities; a daemon
// started with exactly that bounding set (read from the unit, applied with
// setpriv) runs a --net-raw sandbox, survives a restart with its sessions,
// and its netns stays usable with `ip netns exec` from the test's own mount
// namespace. Control: the daemon's CapBnd is the unit's set, so the
// restriction was in force.
func TestE2EUnitSettings(t *testing.T) {
	u := unitSettings(t)
	for _, key := range []string{"ProtectSystem", "ProtectHome", "PrivateTmp", "ReadWritePaths", "ReadOnlyPaths",
		"InaccessiblePaths", "PrivateDevices", "ProtectKernelModules", "ProtectKernelLogs", "ProtectKernelTunables",
		"ProtectControlGroups", "TemporaryFileSystem", "BindPaths", "PrivateMounts", "MountFlags",
		"RestrictAddressFamilies", "SystemCallArchitectures", "SystemCallFilter"} {
		if v, ok := u[key]; ok {
			t.Errorf("the unit sets %s=%s: it would give the daemon a mount namespace or its sandboxes a seccomp filter", key, strings.Join(v, " "))
		}
	}
	for key, want := range map[string]string{"Delegate": "yes", "KillMode": "process", "Type": "notify"} {
		if got := u[key]; len(got) != 1 || got[0] != want {
			t.Errorf("the unit sets %s=%v, want %s", key, got, want)
		}
	}
	var caps []string
	var mask uint64
	for _, v := range u["CapabilityBoundingSet"] {
		for _, c := range strings.Fields(v) {
			n, ok := capNumbers[c]
			if !ok {
				t.Fatalf("the unit's CapabilityBoundingSet names %s, unknown to this test", c)
			}
			caps = append(caps, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
			mask |= 1 << n
		}
	}
	if len(caps) == 0 {
		t.Fatal("the unit sets no CapabilityBoundingSet")
	}
	world.RequireTool(t, "setpriv")

	e := prepareE2E(t, "")
	wrapper := filepath.Join(t.TempDir(), "enforcerd-bounded")
	script := fmt.Sprintf("#!/bin/sh\nexec setpriv --bounding-set -all,%s -- %s \"$@\"\n", strings.Join(caps, ","), e.bin)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	e.d.Bin = wrapper
	e.start()
	capBnd := func(pid string) uint64 {
		t.Helper()
		b, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			t.Fatalf("read the daemon's status: %v", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
				n, _ := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				return n
			}
		}
		t.Fatal("no CapBnd in the daemon's status")
		return 0
	}
	// The test can bound only what it holds itself.
	if own := capBnd("self"); mask&^own != 0 {
		t.Logf("the unit's bounding set has %#x, which this machine does not give the test", mask&^own)
		mask &= own
	}
	if got := capBnd(strconv.Itoa(e.d.PID())); got != mask {
		t.Fatalf("control: the daemon's bounding set is %#x, want the unit's %#x", got, mask)
	}

	e.create("scan", "--net-raw", "--allow", "198.18.1.10")
	e.createNetOnly("net", "--allow", "api.e2e.test")
	ping := func(when string) {
		t.Helper()
		if out, errOut, code := e.sh("scan", "ping -c 1 -W 2 198.18.1.10"); code != 0 {
			t.Errorf("%s: ping from the --net-raw sandbox under the unit's bounding set: exit %d\n%s%s", when, code, out, errOut)
		}
		cmd := exec.Command("ip", "netns", "exec", e.d.Prefix+"-net", "true")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: ip netns exec %s-net from the test's mount namespace: %v\n%s", when, e.d.Prefix, err, out)
		}
	}
	ping("before the restart")
	if err := e.d.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("stop: %v", err)
	}
	e.start()
	if got := e2eNames(e.expectConsistent("after the restart")); strings.Join(got, ",") != "net,scan" {
		t.Errorf("after the restart under the unit's settings the daemon lists %v, want [net scan]", got)
	}
	ping("after the restart")
}
