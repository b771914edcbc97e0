package integration

// The sandbox's pid 1 (the keeper): its name in ps, and the SIGTERM that ends it. At host
// shutdown systemd sends SIGTERM to every process left and waits up to 90 s for them; an init
// of a pid namespace gets no signal it has no handler for, so a keeper without one held the
// shutdown for the whole timeout.

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/container"
)

// ctInitPid is the pid (on the host) of sandbox name's init: the process of its cgroup that
// is pid 1 of its pid namespace.
func ctInitPid(t *testing.T, e *ctEnv, name string) int {
	t.Helper()
	paths, err := e.m.CgroupPaths(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if nsPidOne(f) {
				pid, _ := strconv.Atoi(f)
				return pid
			}
		}
	}
	t.Fatalf("%s: no process of its cgroups is pid 1 of its pid namespace (%v)", name, paths)
	return 0
}

// nsPidOne reports whether pid is pid 1 of its own pid namespace (NSpid's last field is 1).
func nsPidOne(pid string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f, ok := strings.CutPrefix(line, "NSpid:"); ok {
			ids := strings.Fields(f)
			return len(ids) > 1 && ids[len(ids)-1] == "1"
		}
	}
	return false
}

// procCmdline is /proc/PID/cmdline with its NULs as spaces, trailing ones dropped.
func procCmdline(pid int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
}

func procComm(pid int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	return strings.TrimSpace(string(b))
}

func TestContainerInitTitleAndSIGTERM(t *testing.T) {
	e := newCtEnv(t)
	e.create(t, container.Spec{Name: "term", NetnsPath: e.newSessionNet(t).path})
	pid := ctInitPid(t, e, "term")
	// Create returns once libcontainer's init runs; it executes the keeper right after.
	for deadline := time.Now().Add(2 * time.Second); procCmdline(pid) != "enforcerd init term" && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if got := procCmdline(pid); got != "enforcerd init term" {
		t.Errorf("init's command line %q, want %q", got, "enforcerd init term")
	}
	if got := procComm(pid); got != "enforcerd-init" {
		t.Errorf("init's comm %q, want enforcerd-init", got)
	}
	// Inside the sandbox ps shows the same name.
	if got := e.mustRun(t, "term", "tr '\\0' '\\n' </proc/1/cmdline"); got != "enforcerd init term\n" {
		t.Errorf("inside: /proc/1/cmdline %q", got)
	}

	// A SIGTERM from inside the sandbox is ignored (a guest cannot end its sandbox) ...
	e.mustRun(t, "term", "setsid sleep 4245 </dev/null >/dev/null 2>&1 &")
	if r := e.run(t, "term", "kill -TERM 1; sleep 0.3; echo still-here"); r.stdout != "still-here\n" || !e.m.Exists("term") {
		t.Fatalf("the sandbox's init died of a SIGTERM from inside: %s", r)
	}
	if !processAlive(pid) {
		t.Fatalf("init %d gone after a SIGTERM from inside", pid)
	}

	// ... one from the host (systemd at shutdown) ends it, and everything in it, at once.
	start := time.Now()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for e.m.Exists("term") || len(e2eProcesses("sleep", "4245")) > 0 {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("the sandbox still runs 2s after SIGTERM to its init %d (%q); sleep 4245: %v",
				pid, procCmdline(pid), e2eProcesses("sleep", "4245"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("sandbox gone %v after SIGTERM to its init", time.Since(start))
}

// processAlive reports whether pid runs and is not a zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}
