package integration

// The README's Install and Uninstall sections, followed literally: make build, install.sh,
// systemctl enable, a live daemon holding a session, then systemctl stop and
// uninstall.sh --purge, after which nothing of ours is left. The test host may run no
// systemd, so a stand-in systemctl on PATH records each call and, for a stop of enforcerd,
// does what systemd does with KillMode=process: SIGTERM to the daemon (which the test started
// as systemd would). Installed files go under a staging DESTDIR, and RUNDIR stands for
// /run/enforcerd, which every daemon on this machine shares: the test checks instead that reap
// took the daemon's own entry out of it.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/api"
)

const fakeSystemctl = `#!/bin/sh
# A stand-in for systemctl: records the call; "stop" (or "disable --now") of enforcerd sends
# SIGTERM to the daemon whose pid the test wrote, as systemd does under KillMode=process.
echo "$*" >>"$FAKE_SYSTEMCTL_LOG"
case "$1" in
stop) ;;
disable) case " $* " in *" --now "*) ;; *) exit 0 ;; esac ;;
*) exit 0 ;;
esac
for u in "$@"; do
	case $u in
	enforcerd | enforcerd.service)
		pid=$(cat "$FAKE_ENFORCERD_PID" 2>/dev/null) || exit 0
		rm -f "$FAKE_ENFORCERD_PID"
		kill -TERM "$pid" 2>/dev/null || exit 0
		i=0
		while kill -0 "$pid" 2>/dev/null && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
		;;
	esac
done
`

// readmeBlock returns the command lines of the first sh block after heading in README.md,
// without their comments and without sudo (the test runs as root).
func readmeBlock(t *testing.T, readme, heading string) []string {
	t.Helper()
	i := strings.Index(readme, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no heading %q", heading)
	}
	rest := readme[i:]
	start := strings.Index(rest, "```sh\n")
	if start < 0 {
		t.Fatalf("README.md: no sh block after %q", heading)
	}
	rest = rest[start+len("```sh\n"):]
	end := strings.Index(rest, "```")
	var lines []string
	for _, l := range strings.Split(rest[:end], "\n") {
		if c := strings.Index(l, "#"); c >= 0 {
			l = l[:c]
		}
		l = strings.TrimSpace(l)
		l = strings.TrimPrefix(l, "sudo ")
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// installEnv is a staging install of the scripts: DESTDIR, the stand-in systemctl and the
// directories standing for /run/enforcerd, a CNI plugin dir and /run/systemd/system, and the
// operator's /etc/enforcerd.toml naming the test daemon's socket, state dir and prefix.
type installEnv struct {
	t                                      *testing.T
	e                                      *e2eEnv
	repo, dest, conf, toml, calls, pidFile string
	runDir, cniDir, installed              string
	env                                    []string
}

func newInstallEnv(t *testing.T, e *e2eEnv, repo string) *installEnv {
	t.Helper()
	root := t.TempDir()
	ie := &installEnv{t: t, e: e, repo: repo,
		dest:    filepath.Join(root, "dest"),
		calls:   filepath.Join(root, "systemctl.calls"),
		pidFile: filepath.Join(root, "enforcerd.pid"),
		runDir:  filepath.Join(root, "run-enforcerd"),
		cniDir:  filepath.Join(root, "cni-bin"),
	}
	fakeBin := filepath.Join(root, "fakebin")
	sysd := filepath.Join(root, "run-systemd-system")
	for _, d := range []string{fakeBin, ie.runDir, ie.cniDir, sysd, filepath.Join(ie.dest, "etc")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(fakeBin, "systemctl"), []byte(fakeSystemctl), 0o755); err != nil {
		t.Fatal(err)
	}
	// What /run/enforcerd would hold besides the registry: the socket unit's socket.
	if err := os.WriteFile(filepath.Join(ie.runDir, "enforcerd.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// The operator's configuration, written before install.sh (which keeps an existing one):
	// uninstall.sh and reap take the prefix, state dir and socket from it.
	ie.conf = filepath.Join(ie.dest, "etc", "enforcerd.toml")
	ie.toml = fmt.Sprintf("socket = %q\nstate-dir = %q\nname-prefix = %q\n", e.d.Socket, e.d.StateDir, e.d.Prefix)
	if err := os.WriteFile(ie.conf, []byte(ie.toml), 0o644); err != nil {
		t.Fatal(err)
	}
	ie.env = append(os.Environ(),
		"PATH="+fakeBin+":"+os.Getenv("PATH"),
		"DESTDIR="+ie.dest,
		"RUNDIR="+ie.runDir,
		"SYSTEMD_RUN_DIR="+sysd,
		"CNI_PLUGIN_DIRS="+ie.cniDir,
		"FAKE_SYSTEMCTL_LOG="+ie.calls,
		"FAKE_ENFORCERD_PID="+ie.pidFile,
	)
	ie.installed = filepath.Join(ie.dest, "usr", "local", "bin", "enforcerd")
	return ie
}

// sh runs one command line as the README gives it, in the simulated host (reap must see the
// daemon's objects there), from the repository's root.
func (ie *installEnv) sh(line string) (string, string, int) {
	ie.t.Helper()
	cmd := exec.Command("nsenter", "--net="+ie.e.w.HostPath, "bash", "-c", line)
	cmd.Dir, cmd.Env = ie.repo, ie.env
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), errOut.String(), ee.ExitCode()
	case err != nil:
		ie.t.Fatalf("%s: %v", line, err)
	}
	return out.String(), errOut.String(), 0
}

func (ie *installEnv) mustSh(line string) string {
	ie.t.Helper()
	out, errOut, code := ie.sh(line)
	if code != 0 {
		ie.t.Fatalf("%s: exit %d\n%s%s", line, code, out, errOut)
	}
	return out
}

// startAsSystemd is systemd's part: start the installed daemon and note its pid for the
// stand-in systemctl.
func (ie *installEnv) startAsSystemd() {
	ie.t.Helper()
	ie.e.d.Bin = ie.installed
	ie.e.start()
	if err := os.WriteFile(ie.pidFile, []byte(strconv.Itoa(ie.e.d.PID())), 0o644); err != nil {
		ie.t.Fatal(err)
	}
}

// systemctlCalls are the stand-in's calls so far, one line each.
func (ie *installEnv) systemctlCalls() []string {
	b, _ := os.ReadFile(ie.calls)
	return strings.Split(strings.TrimRight(string(b), "\n"), "\n")
}

// Without sessions, uninstall.sh (no --purge) stops the units, reaps what the daemon left in the
// kernel (its table and DNS interface) and removes the installed files, and keeps
// /etc/enforcerd.toml and the state dir.
func TestE2EUninstallKeepsConfigAndState(t *testing.T) {
	e := prepareE2E(t, "")
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	ie := newInstallEnv(t, e, repo)
	testBin := e.d.Bin
	defer func() { e.d.Bin = testBin }()
	ie.mustSh("scripts/install.sh")
	ie.startAsSystemd()
	e.create("gone")
	e.cli("session", "rm", "gone")
	if o := e.objects(); !o.Table || len(o.Links) != 1 {
		t.Fatalf("objects with no session: %s", o)
	}
	out := ie.mustSh("scripts/uninstall.sh")
	if !strings.Contains(out, "uninstalled;") {
		t.Errorf("uninstall.sh said %q", out)
	}
	if done, _ := e.d.Exited(); !done {
		t.Error("the daemon runs after uninstall.sh")
	}
	e.expectObjects(t, "after uninstall.sh", e2eObjects{})
	if got, _ := os.ReadFile(ie.conf); string(got) != ie.toml {
		t.Errorf("%s after uninstall.sh: %q", ie.conf, got)
	}
	if _, err := os.Stat(filepath.Join(e.d.StateDir, "lock")); err != nil {
		t.Errorf("state dir after uninstall.sh: %v", err)
	}
	_ = filepath.WalkDir(ie.dest, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && p != ie.conf {
			t.Errorf("left by uninstall.sh: %s", p)
		}
		return nil
	})
	want := []string{"daemon-reload", "stop enforcerd.socket enforcerd", "disable enforcerd.socket enforcerd", "daemon-reload"}
	if got := ie.systemctlCalls(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("systemctl calls %q, want %q", got, want)
	}
}

func TestE2EInstallUninstall(t *testing.T) {
	e := prepareE2E(t, "")
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(repo, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	install := readmeBlock(t, string(readme), "## Install")
	uninstall := readmeBlock(t, string(readme), "### Uninstall")
	if want := []string{"make build", "scripts/install.sh", "systemctl enable --now enforcerd.socket enforcerd"}; strings.Join(install, "\n") != strings.Join(want, "\n") {
		t.Fatalf("README's Install block is %q; this test runs it and checks what it leaves: update both", install)
	}
	if want := []string{"systemctl stop enforcerd.socket enforcerd", "scripts/uninstall.sh --purge"}; strings.Join(uninstall, "\n") != strings.Join(want, "\n") {
		t.Fatalf("README's Uninstall block is %q; this test runs it and checks what it leaves: update both", uninstall)
	}

	ie := newInstallEnv(t, e, repo)
	dest, conf, toml, cniDir, runDir := ie.dest, ie.conf, ie.toml, ie.cniDir, ie.runDir
	sh, mustSh, installed, testBin, startAsSystemd := ie.sh, ie.mustSh, ie.installed, e.d.Bin, ie.startAsSystemd

	var installOut string
	for _, line := range install {
		installOut += mustSh(line)
	}
	for _, p := range []string{"usr/local/bin/enforcerd", "usr/local/bin/enforcerd-cni", "usr/local/bin/enforcerctl",
		"usr/local/lib/systemd/system/enforcerd.service", "usr/local/lib/systemd/system/enforcerd.socket",
		"usr/local/share/man/man1/enforcerd.1", "usr/local/share/man/man1/enforcerctl-session-create.1",
		"usr/local/share/bash-completion/completions/enforcerctl", "usr/local/share/doc/enforcerd/README.md"} {
		if _, err := os.Stat(filepath.Join(dest, p)); err != nil {
			t.Errorf("install.sh: %v", err)
		}
	}
	if got, _ := os.ReadFile(conf); string(got) != toml {
		t.Errorf("install.sh changed an existing %s:\n%s", conf, got)
	}
	link := "ln -s /usr/local/bin/enforcerd-cni " + cniDir + "/enforcerd-cni"
	if !strings.Contains(installOut, link) {
		t.Errorf("install.sh did not say how to link the CNI plugin (%q):\n%s", link, installOut)
	}
	mustSh(link) // the operator follows it

	startAsSystemd()
	e.create("held")
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	if _, err := e.d.Client().ExecDetach(ctx, "held", api.ExecRequest{Args: []string{"sleep", "4249"}}); err != nil {
		t.Fatal(err)
	}
	before := e.objects()
	if len(before.Netns) != 1 || len(before.Records) != 1 || !before.Table || !before.Cgroups {
		t.Fatalf("objects with a live session: %s", before)
	}

	// Without --purge, uninstall.sh refuses while the session lives: asking the daemon, and
	// with the daemon stopped, from the records and netns it left.
	refused := func(when string) {
		t.Helper()
		out, errOut, code := sh("scripts/uninstall.sh")
		if code != 1 || !strings.Contains(errOut, "held") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%s: uninstall.sh without --purge: exit %d, stderr %q, want 1 and one line naming the session\n%s", when, code, errOut, out)
		}
		if _, err := os.Stat(installed); err != nil {
			t.Errorf("%s: the refused uninstall.sh removed the binary: %v", when, err)
		}
		if got := e.objects(); got.String() != before.String() {
			t.Errorf("%s: the refused uninstall.sh changed the objects:\n got  %s\n want %s", when, got, before)
		}
	}
	refused("daemon running")
	if got := e.inspect("held"); got.Name != "held" {
		t.Errorf("after the refusal: %+v", got)
	}
	mustSh("systemctl stop enforcerd")
	if done, _ := e.d.Exited(); !done {
		t.Fatal("systemctl stop enforcerd (the stand-in) did not stop the daemon")
	}
	refused("daemon stopped")
	startAsSystemd()
	if out := e.mustSh("held", "echo ok"); out != "ok\n" {
		t.Fatalf("the session after the refusals: %q", out)
	}

	for _, line := range uninstall {
		mustSh(line)
	}
	e.d.Bin = testBin // the binary is gone; the test's cleanup reaps with the test's own
	if done, _ := e.d.Exited(); !done {
		t.Error("the daemon runs after the README's uninstall")
	}
	e.expectObjects(t, "after uninstall.sh --purge", e2eObjects{})
	if left := e2eProcesses("sleep", "4249"); len(left) > 0 {
		t.Errorf("the session's exec still runs: %v", left)
	}
	for _, p := range []string{e.d.StateDir, runDir, filepath.Join(cniDir, "enforcerd-cni")} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after uninstall.sh --purge: %v", p, err)
		}
	}
	if recs, _ := filepath.Glob("/run/enforcerd/instances/*-" + e.d.Prefix + ".json"); len(recs) > 0 {
		t.Errorf("instance record of %s after uninstall.sh --purge: %v", e.d.Prefix, recs)
	}
	_ = filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			t.Errorf("left by uninstall.sh --purge: %s", p)
		}
		return nil
	})
	got := ie.systemctlCalls()
	want := []string{
		"daemon-reload", // install.sh
		"enable --now enforcerd.socket enforcerd",
		"stop enforcerd",                  // the offline refusal above
		"stop enforcerd.socket enforcerd", // the README
		"stop enforcerd.socket enforcerd", // uninstall.sh
		"disable enforcerd.socket enforcerd",
		"daemon-reload",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("systemctl calls:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
