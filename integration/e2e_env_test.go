package integration

// End-to-end tests: the real enforcerd binary, started in a test world's
// simulated host (integration/enforcerd) and driven through its command line
// and its API client (api.Client), as an operator and their tools drive
// it; raw HTTP only where a test sends what no client would (rawRequest). Every test
// builds its own world and daemon with a prefix unique to the run, and at
// cleanup removes its sessions, stops the daemon, runs `enforcerd reap` for
// its prefix and checks that no object of the prefix is left.
//
// This file holds the environment: finding the binary and the rootfs,
// starting the daemon, running the CLI, and the cleanup with its leak check.
// E2E_TRACE=1 logs every CLI run with its duration.

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/enforcerd"
	"github.com/enforcerd/enforcerd/integration/world"
)

// e2eZone is the DNS zone every end-to-end world serves. TTLs are long so
// that attested elements outlive every test.
var e2eZone = []string{
	"api.e2e.test. 300 IN A 198.18.1.10",
	"docs.e2e.test. 300 IN A 198.18.1.11",
	"cdn.e2e.test. 300 IN A 198.18.2.10",
	"other.e2e.test. 300 IN A 198.18.1.11",
	"nov4.e2e.test. 300 IN AAAA 2001:db8::10",
	"meta.e2e.test. 300 IN A 169.254.169.254",
}

// e2eCommandTimeout bounds one CLI invocation; nothing a test asks for
// takes this long.
const e2eCommandTimeout = 60 * time.Second

// e2eArtifacts returns the enforcerd binary and the busybox rootfs: from
// ENFORCERD_BIN and ENFORCERD_ROOTFS (set by `make live`), else the repo's
// bin/enforcerd and .cache/rootfs. Missing ones fail the test under CI=true
// and skip it elsewhere.
func e2eArtifacts(t *testing.T) (bin, rootfs string) {
	t.Helper()
	bin = os.Getenv("ENFORCERD_BIN")
	if bin == "" {
		bin = filepath.Join("..", "bin", "enforcerd")
	}
	rootfs = os.Getenv("ENFORCERD_ROOTFS")
	if rootfs == "" {
		rootfs = filepath.Join("..", ".cache", "rootfs")
	}
	var missing []string
	var err error
	if bin, err = filepath.Abs(bin); err != nil {
		t.Fatal(err)
	}
	if rootfs, err = filepath.Abs(rootfs); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		missing = append(missing, "binary "+bin+" (make build)")
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "bin", "busybox")); err != nil || !fi.Mode().IsRegular() {
		missing = append(missing, "rootfs "+rootfs+" (make rootfs)")
	}
	if len(missing) == 0 {
		return bin, rootfs
	}
	msg := "end-to-end test needs the " + strings.Join(missing, " and the ")
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: failing instead of skipping)")
	}
	t.Skip(msg)
	return "", ""
}

// e2eEnv is one test's world and daemon.
type e2eEnv struct {
	t      *testing.T
	w      *world.World
	d      *enforcerd.Daemon
	bin    string
	rootfs string
}

// newE2E builds a world and starts a daemon in it with extra serve flags.
func newE2E(t *testing.T, extra ...string) *e2eEnv {
	t.Helper()
	e := prepareE2E(t, "", extra...)
	e.start()
	return e
}

// prepareE2E builds the world and describes the daemon (in dir, or a fresh
// temporary directory when dir is ""), registers the cleanup, and does not
// start it.
func prepareE2E(t *testing.T, dir string, extra ...string) *e2eEnv {
	t.Helper()
	world.RequireRoot(t)
	bin, rootfs := e2eArtifacts(t)
	w := world.New(t)
	for _, rr := range e2eZone {
		w.DNS.AddRR(rr)
	}
	if dir == "" {
		dir = t.TempDir()
	}
	e := &e2eEnv{t: t, w: w, bin: bin, rootfs: rootfs}
	e.d = enforcerd.New(bin, w, dir, extra...)
	if left := e.objects(); !left.empty() {
		t.Fatalf("objects of prefix %s exist before the test (a crashed run?): %s", e.d.Prefix, left)
	}
	t.Cleanup(e.cleanup)
	return e
}

// start starts (or restarts) the daemon.
func (e *e2eEnv) start() {
	e.t.Helper()
	if err := e.d.Start(); err != nil {
		e.t.Fatalf("start enforcerd: %v", err)
	}
}

// cleanup removes what the test left: every session through the CLI, then
// the daemon, then `enforcerd reap`; and checks that no object of the
// prefix is left.
func (e *e2eEnv) cleanup() {
	t := e.t
	// Whatever fails first (a Fatalf ends this function early), the daemon
	// this test started is stopped and its prefix reaped: nothing of the
	// test outlives it.
	defer func() {
		if done, _ := e.d.Exited(); !done && e.d.PID() != 0 {
			if err := e.d.Stop(); err != nil {
				t.Errorf("cleanup: stop enforcerd: %v", err)
			} else if left := e2ePrepared(t, e.d.Prefix); len(left) > 0 {
				t.Errorf("cleanup: prepared netns left after the daemon stopped: %v", left)
			}
		}
		if out, err := e.d.Reap(); err != nil {
			t.Errorf("cleanup: enforcerd reap --name-prefix %s: %v\n%s", e.d.Prefix, err, out)
		}
		e.expectObjects(t, "after enforcerd reap", e2eObjects{})
		if left := e2ePrepared(t, e.d.Prefix); len(left) > 0 {
			t.Errorf("cleanup: prepared netns left after enforcerd reap: %v", left)
		}
		if t.Failed() {
			t.Logf("enforcerd log (%s):\n%s", e.d.LogPath, e2eTail(e.d.Log(), 80))
		}
	}()
	if done, _ := e.d.Exited(); !done && e.d.PID() != 0 {
		if list, err := e.tryList(); err == nil {
			for _, s := range list {
				if out, errOut, code := e.run("session", "rm", s.Name); code != 0 {
					t.Errorf("cleanup: session rm %s: exit %d: %s%s", s.Name, code, out, errOut)
				}
			}
			// Every delete went through the product: nothing but the shared
			// objects may be left.
			e.expectObjects(t, "after removing every session", e2eObjects{
				Links: []string{e.dnsIface()}, Table: true,
			})
		} else {
			t.Errorf("cleanup: daemon not answering: %v", err)
		}
	}
}

func e2eTail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// ---- the command line -----------------------------------------------------

// run runs the CLI and returns stdout, stderr and the exit status; it
// fails the test only when the CLI could not be run at all.
func (e *e2eEnv) run(args ...string) (string, string, int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	start := time.Now()
	out, errOut, code, err := e.d.CLIStatus(ctx, args...)
	if os.Getenv("E2E_TRACE") != "" {
		e.t.Logf("TRACE %v %s", time.Since(start).Round(time.Millisecond), strings.Join(args, " "))
	}
	if err != nil {
		e.t.Fatalf("run enforcerd %s: %v", strings.Join(args, " "), err)
	}
	return out, errOut, code
}

// cli runs the CLI and fails the test unless it exits 0.
func (e *e2eEnv) cli(args ...string) string {
	e.t.Helper()
	out, errOut, code := e.run(args...)
	if code != 0 {
		e.t.Fatalf("enforcerd %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// expectFail runs the CLI and checks the exit status and that stderr is
// exactly one line (returned without its newline) and stdout is empty.
func (e *e2eEnv) expectFail(code int, args ...string) string {
	e.t.Helper()
	out, errOut, got := e.run(args...)
	if got != code {
		e.t.Fatalf("enforcerd %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), got, code, out, errOut)
	}
	e2eOneLine(e.t, "enforcerd "+strings.Join(args, " "), errOut)
	if out != "" {
		e.t.Errorf("enforcerd %s: stdout %q, want nothing", strings.Join(args, " "), out)
	}
	return strings.TrimSuffix(errOut, "\n")
}

// e2eOneLine checks that s is exactly one non-empty line.
func e2eOneLine(t *testing.T, what, s string) {
	t.Helper()
	if s == "" || strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") || strings.TrimSpace(s) == "" {
		t.Errorf("%s: stderr is not exactly one line: %q", what, s)
	}
}

// e2eAttested returns the addresses of the session's attested set.
func e2eAttested(info api.SessionInfo) []string {
	var out []string
	for _, a := range info.Attested {
		out = append(out, a.IP)
	}
	return out
}

// create creates a session with a sandbox from the test rootfs.
func (e *e2eEnv) create(name string, args ...string) api.SessionInfo {
	e.t.Helper()
	return e.createWith(append([]string{"--rootfs", e.rootfs}, args...), name)
}

// createNetOnly creates a --network-only session.
func (e *e2eEnv) createNetOnly(name string, args ...string) api.SessionInfo {
	e.t.Helper()
	return e.createWith(append([]string{"--network-only"}, args...), name)
}

func (e *e2eEnv) createWith(args []string, name string) api.SessionInfo {
	e.t.Helper()
	out := e.cli(append([]string{"session", "create", name, "--json"}, args...)...)
	var info api.SessionInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		e.t.Fatalf("session create %s --json: %v\n%s", name, err, out)
	}
	if info.Name != name {
		e.t.Fatalf("session create %s: printed session %q", name, info.Name)
	}
	return info
}

// inspect returns `session inspect NAME`.
func (e *e2eEnv) inspect(name string) api.SessionInfo {
	e.t.Helper()
	out := e.cli("session", "inspect", name)
	var info api.SessionInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		e.t.Fatalf("session inspect %s: %v\n%s", name, err, out)
	}
	return info
}

// list returns `session ls --json` (with an optional label filter).
func (e *e2eEnv) list(label ...string) []api.SessionInfo {
	e.t.Helper()
	args := []string{"session", "ls", "--json"}
	if len(label) > 0 {
		args = append(args, "--label", label[0])
	}
	out := e.cli(args...)
	var list []api.SessionInfo
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		e.t.Fatalf("session ls --json: %v\n%s", err, out)
	}
	return list
}

// tryList is list for the cleanup, through the API client: an error
// instead of a failure.
func (e *e2eEnv) tryList() ([]api.SessionInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return e.d.Client().List(ctx, "", "")
}

func e2eNames(list []api.SessionInfo) []string {
	names := []string{}
	for _, s := range list {
		names = append(names, s.Name)
	}
	return names
}

// sh runs a shell script in a session's sandbox and returns its stdout,
// stderr and exit status.
func (e *e2eEnv) sh(name, script string) (string, string, int) {
	e.t.Helper()
	return e.run("session", "exec", name, "--", "sh", "-c", script)
}

// mustSh runs a script that must succeed and returns its stdout.
func (e *e2eEnv) mustSh(name, script string) string {
	e.t.Helper()
	out, errOut, code := e.sh(name, script)
	if code != 0 {
		e.t.Fatalf("exec in %s: sh -c %q: exit %d\nstdout: %s\nstderr: %s", name, script, code, out, errOut)
	}
	return out
}

// nsPath is the bind mount of a session's network namespace.
func (e *e2eEnv) nsPath(name string) string {
	return filepath.Join(world.NetnsDir, e.d.Prefix+"-"+name)
}

func (e *e2eEnv) dnsIface() string { return e.d.Prefix + "dns" }

// rawRequest sends one HTTP request over the daemon's unix socket as
// written, for the tests that send what api.Client never would (malformed
// JSON, unknown fields, wrong methods), and returns the status, the
// headers and the whole body. It fails the test only when no answer came.
func rawRequest(t *testing.T, socket, method, path, body string) (int, http.Header, []byte) {
	t.Helper()
	c := &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", socket)
			},
			DisableKeepAlives: true,
		},
	}
	req, err := http.NewRequest(method, "http://enforcerd"+path, strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read response: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, data
}
