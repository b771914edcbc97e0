package integration

// A command killed at the sandbox's memory limit is not silent: exit 137
// with one line saying so, an "oom" event, and the limits readable (not
// writable) inside the sandbox so runtimes can size themselves.

import (
	"strings"
	"testing"
)

// cgroupMemoryLimit reads the sandbox's memory limit, cgroup v2 or v1.
const cgroupMemoryLimit = `if [ -e /sys/fs/cgroup/cgroup.controllers ]; then cat /sys/fs/cgroup/memory.max; else cat /sys/fs/cgroup/memory/memory.limit_in_bytes; fi`

func TestE2EOOMIsReported(t *testing.T) {
	e := newE2E(t)
	e.create("small", "--memory", "16m")

	// The limit is visible read-only inside (cgroup v1 or v2 layout).
	limit := e.mustSh("small", cgroupMemoryLimit)
	if strings.TrimSpace(limit) != "16777216" {
		t.Errorf("memory limit inside the sandbox: %q, want 16777216", limit)
	}
	// Root in the sandbox cannot raise it: the cgroup files are mounted
	// read-only (whatever the shell's exit status says, the value stays).
	e.sh("small", `echo 1073741824 > /sys/fs/cgroup/memory.max; echo 1073741824 > /sys/fs/cgroup/memory/memory.limit_in_bytes; echo x > /sys/fs/cgroup/fake`)
	if after := e.mustSh("small", cgroupMemoryLimit); strings.TrimSpace(after) != "16777216" {
		t.Errorf("the sandbox raised its own memory limit to %q", after)
	}
	if _, _, code := e.sh("small", `test -e /sys/fs/cgroup/fake`); code == 0 {
		t.Error("the sandbox could create files under /sys/fs/cgroup")
	}

	// The control: a command that stays under the limit ends normally.
	if out := e.mustSh("small", `x=$(head -c 1000000 /dev/zero | tr '\0' a); echo ${#x}`); strings.TrimSpace(out) != "1000000" {
		t.Errorf("control: %q", out)
	}
	// 64 MB in a shell variable: the kernel kills it at 16 MiB.
	out, errOut, code := e.run("session", "exec", "small", "--", "sh", "-c", `x=$(head -c 64000000 /dev/zero | tr '\0' a); echo survived`)
	if code != 137 || strings.Contains(out, "survived") {
		t.Fatalf("over the limit: exit %d stdout %q stderr %q, want 137", code, out, errOut)
	}
	// The command's own stderr may come first (busybox sh prints "Killed"
	// when the OOM killer picks a child); enforcerd's word is the last line.
	lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "out of memory") || !strings.Contains(last, "16 MiB") || !strings.HasPrefix(last, "enforcerd session exec: ") {
		t.Errorf("stderr %q: want its last line to be enforcerd's, saying out of memory and the 16 MiB limit", errOut)
	}
	events := e.cli("session", "events", "small")
	if !strings.Contains(events, `"action":"oom"`) {
		t.Errorf("no oom event:\n%s", events)
	}
	if strings.Count(events, `"action":"oom"`) != 1 {
		t.Errorf("the control made an oom event too:\n%s", events)
	}
	// A plain SIGKILL is not an OOM.
	if _, errOut, code := e.sh("small", `kill -KILL $$`); code != 137 || strings.Contains(errOut, "out of memory") {
		t.Errorf("kill -KILL: exit %d stderr %q, want 137 and no out-of-memory claim", code, errOut)
	}
}
