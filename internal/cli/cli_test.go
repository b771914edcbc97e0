package cli

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/api/apitest"
)

// testVersion and testCommit are the test binary's stamp.
const (
	testVersion = "0.1.0-test"
	testCommit  = "0123456789ab"
)

// testCLI is a CLI with buffers and an environment map.
type testCLI struct {
	*CLI
	out, errOut bytes.Buffer
	env         map[string]string
}

// newTestCLI is enforcerd's client commands as the program prog
// ("enforcerd" or "enforcerctl"): the daemon's own commands are
// cmd/enforcerd's and tested there.
func newTestCLI(t *testing.T, prog ...string) *testCLI {
	t.Helper()
	tc := &testCLI{env: map[string]string{}}
	tc.CLI = &CLI{
		Stdin:   strings.NewReader(""),
		Stdout:  &tc.out,
		Stderr:  &tc.errOut,
		Getenv:  func(k string) string { return tc.env[k] },
		Now:     func() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) },
		Prog:    "enforcerd",
		Version: testVersion,
		Commit:  testCommit,
	}
	if len(prog) > 0 {
		tc.Prog = prog[0]
	}
	return tc
}

func (tc *testCLI) run(args ...string) int {
	tc.out.Reset()
	tc.errOut.Reset()
	return tc.Run(args)
}

// TestThinClientCommandLine: the thin client (enforcerctl: no daemon
// commands) has every client command with enforcerd's flags and exit
// statuses, names itself in usage and errors, and refuses the daemon's
// commands as unknown. The control: the same tree with daemon commands
// added (as cmd/enforcerd does) runs them.
func TestThinClientCommandLine(t *testing.T) {
	c := newTestCLI(t, "enforcerctl")
	for _, tc := range []struct {
		args    []string
		code    int
		errLine string
	}{
		{[]string{"session", "create", "s1", "--cpus", "0"}, ExitUsage,
			`enforcerctl session create: invalid value "0" for flag --cpus: ` + "want 0.01 to "},
		{[]string{"session", "create", "s1", "--memory", "1M"}, ExitUsage,
			`enforcerctl session create: invalid value "1M" for flag --memory: want at least 4 MiB`},
		{[]string{"image", "import", "Bad/Name", "x.tar"}, ExitUsage, "enforcerctl image import: "},
		{[]string{"serve"}, ExitUsage, `enforcerctl: unknown command "serve"`},
		{[]string{"reap"}, ExitUsage, `enforcerctl: unknown command "reap"`},
		{[]string{"doctor"}, ExitUsage, `enforcerctl: unknown command "doctor"`},
		{[]string{"init"}, ExitUsage, `enforcerctl: unknown command "init"`},
		{nil, ExitUsage, "enforcerctl: missing command (run 'enforcerctl help')"},
	} {
		code := c.run(tc.args...)
		if code != tc.code || !strings.HasPrefix(c.errOut.String(), tc.errLine) || strings.Count(c.errOut.String(), "\n") != 1 {
			t.Errorf("enforcerctl %s: exit %d, stderr %q; want exit %d and one line starting %q", strings.Join(tc.args, " "), code, c.errOut.String(), tc.code, tc.errLine)
		}
	}
	if code := c.run("--help"); code != ExitOK || !strings.HasPrefix(c.out.String(), "usage: enforcerctl [--socket PATH] COMMAND [ARGS]") ||
		strings.Contains(c.out.String(), "serve") || !strings.Contains(c.out.String(), "session") {
		t.Errorf("enforcerctl --help: exit %d: %q", code, c.out.String())
	}

	d := newTestCLI(t)
	served := false
	d.DaemonCommands = func(*GlobalOpts) []*cobra.Command {
		return []*cobra.Command{{Use: "serve", RunE: func(*cobra.Command, []string) error { served = true; return nil }}}
	}
	if code := d.run("serve"); code != ExitOK || !served {
		t.Errorf("control: enforcerd serve with the daemon's commands: exit %d, served %v", code, served)
	}
}

// TestThinClientEveryCommandHelpAndJSON: the thin client's every command
// answers --help (exit 0, its usage line on stdout), and the same
// commands have --json as enforcerd's (noJSON: the groups and the
// commands that print no data of the program's own).
func TestThinClientEveryCommandHelpAndJSON(t *testing.T) {
	noJSON := map[string]bool{"enforcerctl": true, "enforcerctl session": true, "enforcerctl image": true,
		"enforcerctl completion": true, "enforcerctl man": true, "enforcerctl session logs": true}
	root := newTestCLI(t, "enforcerctl").RootCommand()
	n := 0
	for _, cmd := range AllCommands(root) {
		path := cmd.CommandPath()
		if !noJSON[path] && cmd.Flags().Lookup("json") == nil {
			t.Errorf("%s has no --json", path)
		}
		if cmd.Hidden {
			continue
		}
		n++
		c := newTestCLI(t, "enforcerctl")
		args := append(strings.Fields(path)[1:], "--help")
		if code := c.run(args...); code != 0 || !strings.HasPrefix(c.out.String(), "usage: "+path) || c.errOut.Len() != 0 {
			t.Errorf("%s --help: exit %d, stdout %q, stderr %q", path, code, c.out.String(), c.errOut.String())
		}
	}
	if n < 15 {
		t.Errorf("control: %d visible commands, want the client's (session's twelve and more)", n)
	}
}

// TestThinClientErrorJSON: a refusal from the daemon, with --json, is the
// same one line on stderr and {"error", "code"} on stdout, exit 1, as
// enforcerd's.
func TestThinClientErrorJSON(t *testing.T) {
	for _, prog := range []string{"enforcerd", "enforcerctl"} {
		_, c, _ := startAPI(t)
		c.Prog = prog
		out, errOut := c.expect(t, ExitRefused, "session", "inspect", "nosuch", "--json")
		var body api.ErrorBody
		if err := json.Unmarshal([]byte(out), &body); err != nil || body.Code == "" || body.Error != strings.TrimSuffix(errOut, "\n") ||
			!strings.HasPrefix(errOut, prog+" session inspect: ") {
			t.Errorf("%s: stdout %q, stderr %q (%v)", prog, out, errOut, err)
		}
	}
}

// TestCLIVersion: the client's version, commit, Go and API version, then
// the daemon's (asked through the socket): the same, another (version
// skew, said on a third line), or none (unreachable, said why); exit 0 in
// every case. --json carries both, the daemon's error and the skew.
func TestCLIVersion(t *testing.T) {
	client := buildInfo{Version: testVersion, Commit: testCommit, Go: runtime.Version(), API: "v1"}
	clientLine := "client: " + client.String() + "\n"
	for _, tc := range []struct {
		name        string
		daemon      *api.HandlerOptions // nil: no daemon on the socket
		wantLines   []string
		wantSkew    bool
		wantDaemon  *buildInfo
		wantErrPart string
	}{
		{name: "same", daemon: &api.HandlerOptions{Version: testVersion, Commit: testCommit},
			wantDaemon: &buildInfo{Version: testVersion, Commit: testCommit, Go: runtime.Version(), API: "v1"}},
		{name: "skew", daemon: &api.HandlerOptions{Version: "0.0.9", Commit: "feedfacecafe"}, wantSkew: true,
			wantDaemon: &buildInfo{Version: "0.0.9", Commit: "feedfacecafe", Go: runtime.Version(), API: "v1"}},
		{name: "unreachable", wantErrPart: "not reachable: cannot reach enforcerd at "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCLI(t)
			sock := filepath.Join(t.TempDir(), "none.sock")
			if tc.daemon != nil {
				sock = apitest.ServeWith(t, apitest.New(), *tc.daemon)
			}
			c.env["ENFORCERD_SOCKET"] = sock
			if code := c.run("version"); code != 0 || c.errOut.String() != "" {
				t.Fatalf("exit %d, stderr %q", code, c.errOut.String())
			}
			lines := strings.SplitAfter(c.out.String(), "\n")
			if lines[0] != clientLine {
				t.Errorf("first line %q, want %q", lines[0], clientLine)
			}
			switch {
			case tc.wantDaemon != nil:
				if want := "daemon: " + tc.wantDaemon.String() + " at " + sock + "\n"; lines[1] != want {
					t.Errorf("second line %q, want %q", lines[1], want)
				}
			default:
				if !strings.HasPrefix(lines[1], "daemon: "+tc.wantErrPart) || !strings.Contains(lines[1], sock) {
					t.Errorf("second line %q, want it to say the daemon is %s", lines[1], tc.wantErrPart)
				}
			}
			skewLine := tc.wantSkew && strings.HasPrefix(lines[2], "version skew: the daemon runs 0.0.9 (commit feedfacecafe, api v1), this binary is "+testVersion)
			if tc.wantSkew != skewLine || (!tc.wantSkew && lines[2] != "") {
				t.Errorf("output %q: want a version skew line: %v", c.out.String(), tc.wantSkew)
			}

			if code := c.run("version", "--json"); code != 0 {
				t.Fatalf("version --json: exit %d: %s", code, c.errOut.String())
			}
			var got VersionReport
			if err := json.Unmarshal(c.out.Bytes(), &got); err != nil {
				t.Fatalf("version --json: %v: %q", err, c.out.String())
			}
			if got.buildInfo != client || got.Socket != sock || got.Skew != tc.wantSkew ||
				!reflect.DeepEqual(got.Daemon, tc.wantDaemon) || !strings.HasPrefix(got.DaemonError, tc.wantErrPart) || (tc.wantErrPart == "") != (got.DaemonError == "") {
				t.Errorf("version --json: %+v (daemon %+v)", got, got.Daemon)
			}
		})
	}
}

// TestCLIInterleaved: flags may come before or after positionals; "--"
// ends flags; exec's command starts after "--" or at the first non-flag
// after NAME, and keeps its own options.
func TestCLIInterleaved(t *testing.T) {
	f, c, _ := startAPI(t)
	for _, tc := range []struct {
		args  []string
		allow []string
	}{
		{[]string{"s1", "--network-only", "--allow", "a.test", "--json"}, []string{"a.test"}},
		{[]string{"--allow=a.test", "s1", "--allow", "b.test", "--network-only"}, []string{"a.test", "b.test"}},
		{[]string{"s1", "--network-only", "--allow", "--json"}, []string{"--json"}}, // a value that looks like a flag
		{[]string{"--network-only", "--", "s1"}, nil},
	} {
		before := len(f.Creates())
		c.expect(t, 0, append([]string{"session", "create"}, tc.args...)...)
		got := f.Creates()[before]
		if got.Name != "s1" || !reflect.DeepEqual(got.Allow, tc.allow) {
			t.Errorf("create %q: name %q allow %q, want s1 %q", tc.args, got.Name, got.Allow, tc.allow)
		}
		c.expect(t, 0, "session", "rm", "s1")
	}
	_, errOut := c.expect(t, ExitUsage, "session", "create", "s1", "--network-only", "--", "--json")
	if errOut != `enforcerd session create: unexpected argument "--json" after NAME "s1"`+"\n" {
		t.Errorf("-- then --json: %q", errOut)
	}

	c.expect(t, 0, "session", "create", "box", "--rootfs", "/r")
	for _, tc := range []struct {
		args    []string
		command []string
		env     []string
	}{
		{[]string{"box", "--env", "A=1", "--", "sh", "-c", "echo --json"}, []string{"sh", "-c", "echo --json"}, []string{"A=1"}},
		{[]string{"--env", "A=1", "box", "--", "ls"}, []string{"ls"}, []string{"A=1"}},
		{[]string{"box", "ls", "-la", "--env", "B=2"}, []string{"ls", "-la", "--env", "B=2"}, nil},
		{[]string{"box", "--env", "A=1", "ls", "--", "x"}, []string{"ls", "--", "x"}, []string{"A=1"}},
		{[]string{"--socket", c.env["ENFORCERD_SOCKET"], "box", "-", "x"}, []string{"-", "x"}, nil},
	} {
		before := len(f.Execs())
		c.expect(t, 0, append([]string{"session", "exec"}, tc.args...)...)
		got := f.Execs()[before]
		if !reflect.DeepEqual(got.Args, tc.command) || !reflect.DeepEqual(got.Env, tc.env) {
			t.Errorf("exec %q: args %q env %q, want %q %q", tc.args, got.Args, got.Env, tc.command, tc.env)
		}
	}
}

func TestParseSize(t *testing.T) {
	ok := map[string]int64{
		"1": 1, "512M": 512 << 20, "512m": 512 << 20, "512MiB": 512 << 20, "512MB": 512 << 20,
		"2G": 2 << 30, "2g": 2 << 30, "64k": 64 << 10, "1T": 1 << 40, "1048576": 1 << 20, "100b": 100,
		"0": 0, // (--memory refuses it with the limit's own text)
	}
	for in, want := range ok {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "M", "-1", "1.5G", "12X", "99999999999T"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q): no error", in)
		}
	}
}

// TestLabelsCell: the ls table's LABELS stays within its width whatever
// the labels: the attachment labels a CNI session carries are left out,
// what does not fit is counted, and a single long label is cut.
func TestLabelsCell(t *testing.T) {
	cni := map[string]string{
		"enforcerd.io/cni-network":  "enftest",
		"enforcerd.io/container-id": strings.Repeat("9fd7df28", 8),
		"enforcerd.io/netns":        "/run/netns/netns-57e05fa9-1a54-50da-03a0-692089827914",
		"enforcerd.io/ifname":       "eth0",
	}
	withPod := map[string]string{"k8s.pod": "web-1", "team": "payments", "a": "1", "b": "2", "c": "3", "d": "4", "e": "5"}
	for k, v := range cni {
		withPod[k] = v
	}
	for _, c := range []struct {
		labels map[string]string
		want   string
	}{
		{nil, ""},
		{map[string]string{"owner": "me", "run": "7"}, "owner=me,run=7"},
		{cni, "enforcerd.io/cni-network=enftest"},
		{withPod, "a=1,b=2,c=3,d=4,e=5,+3"},
		{map[string]string{"k8s.pod": "web-1", "note": strings.Repeat("x", 60)}, "k8s.pod=web-1,+1"},
		{map[string]string{"note": strings.Repeat("x", 60)}, "note=" + strings.Repeat("x", 34) + "…"},
		{map[string]string{"note": strings.Repeat("x", 60), "z": "1"}, "note=" + strings.Repeat("x", 31) + "…,+1"},
	} {
		got := labelsCell(c.labels)
		if got != c.want {
			t.Errorf("labelsCell(%v) = %q, want %q", c.labels, got, c.want)
		}
		if n := len([]rune(got)); n > labelsCellWidth {
			t.Errorf("labelsCell(%v) is %d characters, more than %d", c.labels, n, labelsCellWidth)
		}
	}
}
