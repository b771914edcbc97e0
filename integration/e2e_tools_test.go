package integration

// Defaults that common tools need: unprivileged ping without --net-raw,
// NET_RAW kept by a non-root --user with --net-raw, a UTF-8 locale, and a
// writable working directory and HOME on a read-only root.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/integration/world"
)

// capEff reads the effective capability mask of the exec'd process.
func capEff(t *testing.T, e *e2eEnv, session string, user string) uint64 {
	t.Helper()
	out := e.cli("session", "exec", session, "--user", user, "--", "grep", "CapEff", "/proc/self/status")
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("CapEff line %q", out)
	}
	v, err := strconv.ParseUint(f[1], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

const capNetRaw = 13

func TestE2EToolDefaults(t *testing.T) {
	e := newE2E(t)
	e.create("plain", "--allow", "198.18.1.10")
	e.create("raw", "--allow", "198.18.1.10", "--net-raw")

	// Unprivileged ICMP echo (an ICMP datagram socket, as iputils ping
	// makes without NET_RAW) works for any uid; busybox's ping insists on a
	// raw socket, so the test sends its own small static pinger in.
	pinger := buildDgramPing(t)
	ping := func(session, user string) int {
		t.Helper()
		cmd := e.d.Command(context.Background(), "session", "exec", session, "--user", user, "--stdin", "--",
			"sh", "-c", `cat > "$HOME/dgramping" && chmod 755 "$HOME/dgramping" && exec "$HOME/dgramping" 198.18.1.10`)
		cmd.Stdin = bytes.NewReader(pinger)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatalf("exec dgramping: %v\n%s", err, out)
		}
		return 0
	}
	if code := ping("plain", "65534"); code != 0 {
		t.Errorf("unprivileged ping (ICMP datagram socket) as uid 65534 without --net-raw: exit %d, want 0 (2: the socket was refused)", code)
	}
	// The control: busybox's raw-socket ping is refused without NET_RAW.
	if _, _, code := e.run("session", "exec", "plain", "--user", "65534", "--", "ping", "-c", "1", "-W", "2", "198.18.1.10"); code == 0 {
		t.Error("a raw-socket ping worked without --net-raw")
	}
	// With --net-raw, busybox's raw ping works for a non-root user too.
	if out, errOut, code := e.run("session", "exec", "raw", "--user", "65534", "--", "ping", "-c", "1", "-W", "3", "198.18.1.10"); code != 0 {
		t.Errorf("raw ping as uid 65534 with --net-raw: exit %d\n%s%s", code, out, errOut)
	}
	if c := capEff(t, e, "plain", "0"); c&(1<<capNetRaw) != 0 {
		t.Errorf("plain sandbox root holds CAP_NET_RAW (CapEff %x) without --net-raw", c)
	}

	// With --net-raw, a non-root user keeps NET_RAW (ambient) and nothing
	// else; root has it too.
	if c := capEff(t, e, "raw", "65534"); c != 1<<capNetRaw {
		t.Errorf("--net-raw, uid 65534: CapEff %x, want only CAP_NET_RAW (%x)", c, uint64(1)<<capNetRaw)
	}
	if c := capEff(t, e, "raw", "0"); c&(1<<capNetRaw) == 0 {
		t.Errorf("--net-raw, root: CapEff %x lacks CAP_NET_RAW", c)
	}
	if c := capEff(t, e, "plain", "65534"); c != 0 {
		t.Errorf("uid 65534 without --net-raw: CapEff %x, want none", c)
	}

	// A UTF-8 locale, and on a read-only root a writable working directory
	// and HOME, root's passwd home (see TestE2ESandboxRootHomeWritable): a
	// download lands where the tool runs.
	out := e.mustSh("plain", `echo "$LANG"; pwd; echo "$HOME"; echo data > ./got && cat ./got && echo ok > "$HOME/.probe" && echo home-ok`)
	if want := "C.UTF-8\n/tmp\n/root\ndata\nhome-ok\n"; out != want {
		t.Errorf("read-only root defaults: %q, want %q", out, want)
	}
	// wget URL, as a user types it: the file lands in the working directory.
	if out := e.mustSh("plain", `timeout 5 wget -q http://198.18.1.10/ && cat index.html`); out != "hello from 198.18.1.10\n" {
		t.Errorf("wget URL on a read-only root: %q", out)
	}
	// An explicit --workdir and --env still win.
	if out := e.cli("session", "exec", "plain", "--workdir", "/", "--env", "LANG=C", "--", "sh", "-c", `pwd; echo "$LANG"`); out != "/\nC\n" {
		t.Errorf("--workdir / --env LANG=C: %q", out)
	}
	// The root filesystem itself stays read-only.
	if _, _, code := e.run("session", "exec", "plain", "--", "sh", "-c", "echo x > /etc/probe"); code == 0 {
		t.Error("wrote to /etc on a read-only root")
	}
}

// buildDgramPing compiles testdata/dgramping.c (x86-64, no libc: a few KB,
// within an exec's stdin limit) and returns the binary.
func buildDgramPing(t *testing.T) []byte {
	t.Helper()
	world.RequireTool(t, "gcc")
	if runtime.GOARCH != "amd64" {
		t.Fatalf("dgramping is x86-64 only; this is %s", runtime.GOARCH)
	}
	bin := filepath.Join(t.TempDir(), "dgramping")
	out, err := exec.Command("gcc", "-static", "-nostdlib", "-Os", "-s", "-fno-stack-protector", "-o", bin, filepath.Join("testdata", "dgramping.c")).CombinedOutput()
	if err != nil {
		t.Fatalf("build dgramping: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Nothing in a sandbox names a host path: its root's overlay options are
// relative to the layer dir, and the etc files come from a tmpfs of their
// own, so neither /proc/mounts nor mountinfo shows the image directory or
// the state directory.
func TestE2ESandboxShowsNoHostPaths(t *testing.T) {
	e := newE2E(t)
	e.create("ro")
	e.create("rw", "--writable")
	for _, s := range []string{"ro", "rw"} {
		out := e.mustSh(s, "cat /proc/mounts /proc/self/mountinfo")
		for _, host := range append([]string{e.rootfs, e.d.StateDir, e.d.Dir}, e.d.ImagesDirs...) {
			if strings.Contains(out, host) {
				t.Errorf("%s: the sandbox's mount table names the host path %s:\n%s", s, host, out)
			}
		}
		// The control: the overlay root and the etc binds are there.
		if !strings.Contains(out, "lowerdir=lower") || !strings.Contains(out, "/etc/resolv.conf") {
			t.Errorf("%s: mount table lacks the overlay root or the etc files:\n%s", s, out)
		}
	}
	// The etc files stay the session's and read-only.
	if _, _, code := e.sh("rw", "echo nameserver 9.9.9.9 > /etc/resolv.conf"); code == 0 {
		t.Error("a writable sandbox rewrote /etc/resolv.conf")
	}
}
