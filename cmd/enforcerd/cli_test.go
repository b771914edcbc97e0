package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// testCLI is a cli with buffers, an environment map and fake daemon entry
// points that record what they were given.
type testCLI struct {
	*cli
	out, errOut bytes.Buffer
	env         map[string]string
	served      *ServeConfig
	reaped      []string
}

func newTestCLI(t *testing.T) *testCLI {
	t.Helper()
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(rc, []byte("# test\nnameserver 192.0.2.53\nsearch example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tc := &testCLI{env: map[string]string{}}
	tc.cli = &cli{
		stdin:      strings.NewReader(""),
		stdout:     &tc.out,
		stderr:     &tc.errOut,
		getenv:     func(k string) string { return tc.env[k] },
		now:        func() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) },
		resolvConf: rc,
		serve: func(cfg ServeConfig) error {
			tc.served = &cfg
			return nil
		},
		reap: func(prefix, stateDir string, pool netip.Prefix, force bool) error {
			tc.reaped = []string{prefix, stateDir, pool.String()}
			return nil
		},
	}
	return tc
}

func (tc *testCLI) run(args ...string) int {
	tc.out.Reset()
	tc.errOut.Reset()
	return tc.cli.run(args)
}

// TestCLIUsageErrors: every malformed command line exits 2 with exactly one
// line on stderr naming the problem, before any daemon is contacted (the
// default socket does not exist here, and the env names none).
func TestCLIUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string // the whole stderr line
	}{
		{nil, "enforcerd: missing command (run 'enforcerd help')"},
		{[]string{"bogus"}, `enforcerd: unknown command "bogus" (run 'enforcerd help')`},
		{[]string{"--bogus"}, "enforcerd: flag provided but not defined: --bogus"},
		{[]string{"init"}, "enforcerd: init is internal to the sandbox runtime and must be the first argument"},
		{[]string{"version", "x"}, `enforcerd version: unexpected argument "x"`},
		{[]string{"serve", "--bogus"}, "enforcerd serve: flag provided but not defined: --bogus"},
		{[]string{"serve", "now"}, `enforcerd serve: unexpected argument "now" (serve takes options only)`},
		{[]string{"serve", "--pool"}, "enforcerd serve: flag needs an argument: --pool"},
		{[]string{"reap", "--name-prefix", "Enf"}, `enforcerd reap: --name-prefix: invalid prefix "Enf": character 'E' not allowed; want 1 to 6 characters of a-z and 0-9, starting with a letter`},
		{[]string{"reap", "x"}, `enforcerd reap: unexpected argument "x" (reap takes options only)`},
		{[]string{"session"}, "enforcerd session: missing subcommand (create, exec, exec-status, logs, ls, inspect, update, rm, events or why)"},
		{[]string{"session", "bogus"}, `enforcerd session: unknown subcommand "bogus"; did you mean "logs"?`},
		{[]string{"session", "frobnicate"}, `enforcerd session: unknown subcommand "frobnicate" (create, exec, exec-status, logs, ls, inspect, update, rm, events or why)`},
		{[]string{"session", "--json", "ls"}, "enforcerd session: flag --json before the subcommand (flags go after it)"},
		{[]string{"session", "create"}, "enforcerd session create: missing session NAME"},
		{[]string{"session", "create", "--network-only"}, "enforcerd session create: missing session NAME"},
		{[]string{"session", "create", "s1"}, "enforcerd session create: missing --image IMAGE, --rootfs DIR or --network-only"},
		{[]string{"session", "create", "s1", "s2", "--network-only"}, `enforcerd session create: unexpected argument "s2" after NAME "s1"`},
		{[]string{"session", "create", "s1", "--rootfs", "/r", "--network-only"}, `enforcerd session create: --rootfs "/r" and --network-only exclude each other`},
		{[]string{"session", "create", "s1", "--rootfs="}, `enforcerd session create: invalid value "" for flag --rootfs: want a directory`},
		{[]string{"session", "create", "s1", "--network-only", "--bogus"}, "enforcerd session create: flag provided but not defined: --bogus"},
		{[]string{"session", "create", "s1", "--network-only", "--allow"}, "enforcerd session create: flag needs an argument: --allow"},
		{[]string{"session", "create", "s1", "--network-only", "--label", "novalue"}, `enforcerd session create: invalid value "novalue" for flag --label: want KEY=VALUE with a non-empty KEY`},
		{[]string{"session", "create", "s1", "--network-only", "--label", "=v"}, `enforcerd session create: invalid value "=v" for flag --label: want KEY=VALUE with a non-empty KEY`},
		{[]string{"session", "create", "s1", "--network-only", "--label", "a=1", "--label", "a=2"}, `enforcerd session create: invalid value "a=2" for flag --label: key "a" given twice`},
		{[]string{"session", "create", "s1", "--network-only", "--memory", "12X"}, `enforcerd session create: invalid value "12X" for flag --memory: want a positive size such as 512M, 2G or 1048576`},
		{[]string{"session", "create", "s1", "--network-only", "--memory", "0"}, `enforcerd session create: invalid value "0" for flag --memory: want a positive size such as 512M, 2G or 1048576`},
		{[]string{"session", "create", "s1", "--network-only", "--pids", "many"}, `enforcerd session create: invalid value "many" for flag --pids: want a positive number`},
		{[]string{"session", "create", "s1", "--network-only", "--pids", "0"}, `enforcerd session create: invalid value "0" for flag --pids: want a positive number`},
		{[]string{"session", "create", "s1", "--network-only", "--egress", "open"}, `enforcerd session create: invalid value "open" for flag --egress: want none, allowlist, public`},
		{[]string{"session", "create", "s1", "--network-only", "--json=maybe"}, `enforcerd session create: invalid value "maybe" for flag --json: want true or false`},
		{[]string{"session", "exec"}, "enforcerd session exec: missing session NAME"},
		{[]string{"session", "exec", "s1"}, `enforcerd session exec: missing command after NAME "s1" (enforcerd session exec NAME -- CMD [ARG]...)`},
		{[]string{"session", "exec", "s1", "--"}, `enforcerd session exec: missing command after NAME "s1" (enforcerd session exec NAME -- CMD [ARG]...)`},
		{[]string{"session", "exec", "s1", "--timeout", "soon", "--", "ls"}, `enforcerd session exec: invalid value "soon" for flag --timeout: want a positive duration such as 30s`},
		{[]string{"session", "exec", "s1", "--timeout", "-1s", "--", "ls"}, `enforcerd session exec: invalid value "-1s" for flag --timeout: want a positive duration such as 30s`},
		{[]string{"session", "exec", "s1", "--env", "X", "--", "ls"}, `enforcerd session exec: invalid value "X" for flag --env: want KEY=VALUE with a non-empty KEY`},
		{[]string{"session", "ls", "x"}, `enforcerd session ls: unexpected argument "x" (filter with --label KEY=VALUE)`},
		{[]string{"session", "ls", "--label", "a"}, `enforcerd session ls: invalid value "a" for flag --label: want KEY=VALUE with a non-empty KEY`},
		{[]string{"session", "ls", "--label", "a=1", "--label", "b=2"}, `enforcerd session ls: invalid value "b=2" for flag --label: given twice; only one KEY=VALUE filter is accepted`},
		{[]string{"session", "inspect"}, "enforcerd session inspect: missing session NAME"},
		{[]string{"session", "inspect", "a", "b"}, `enforcerd session inspect: unexpected argument "b" after NAME "a"`},
		{[]string{"session", "inspect", "a", "--bogus"}, "enforcerd session inspect: flag provided but not defined: --bogus"},
		{[]string{"session", "rm"}, "enforcerd session rm: missing session NAME or --label KEY=VALUE"},
		{[]string{"session", "rm", "a", "--label", "k=v"}, `enforcerd session rm: NAME "a" and --label exclude each other`},
		{[]string{"session", "rm", "--label", "k"}, `enforcerd session rm: invalid value "k" for flag --label: want KEY=VALUE with a non-empty KEY`},
		{[]string{"session", "events"}, "enforcerd session events: missing session NAME"},
		{[]string{"session", "events", "a", "--follow=x"}, `enforcerd session events: invalid value "x" for flag --follow: want true or false`},
		// A mistyped command gets the nearest one suggested.
		{[]string{"sesion"}, `enforcerd: unknown command "sesion"; did you mean "session"?`},
		{[]string{"--socket", "/x", "serv"}, `enforcerd: unknown command "serv"; did you mean "serve"?`},
		{[]string{"session", "craete", "s1"}, `enforcerd session: unknown subcommand "craete"; did you mean "create"?`},
		{[]string{"help", "sesion"}, `enforcerd help: unknown command "sesion"; did you mean "session"?`},
		{[]string{"help", "session", "bogus"}, `enforcerd help: unknown subcommand of enforcerd session "bogus"; did you mean "logs"?`},
		// Long options take two dashes; a single dash is a shorthand.
		{[]string{"session", "ls", "-json"}, "enforcerd session ls: flag provided but not defined: -j (long options take two dashes, as in --json)"},
		{[]string{"session", "exec", "s1", "-x", "--", "ls"}, "enforcerd session exec: flag provided but not defined: -x"},
		{[]string{"session", "exec", "s1", "--bogus", "--", "ls"}, "enforcerd session exec: flag provided but not defined: --bogus"},
		{[]string{"version", "--json=no"}, `enforcerd version: invalid value "no" for flag --json: want true or false`},
		{[]string{"completion"}, "enforcerd completion: missing shell (bash, zsh or fish)"},
		{[]string{"completion", "tcsh"}, `enforcerd completion: unknown shell "tcsh" (bash, zsh or fish)`},
		{[]string{"completion", "bash", "zsh"}, `enforcerd completion: unexpected argument "zsh" after the shell "bash"`},
		{[]string{"man"}, "enforcerd man: want exactly one DIR, got 0 arguments"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			c := newTestCLI(t)
			c.env["ENFORCERD_SOCKET"] = filepath.Join(t.TempDir(), "nobody.sock")
			code := c.run(tc.args...)
			if code != exitUsage {
				t.Errorf("exit %d, want 2 (stderr %q)", code, c.errOut.String())
			}
			if got := c.errOut.String(); got != tc.want+"\n" {
				t.Errorf("stderr\n got %q\nwant %q", got, tc.want+"\n")
			}
			if c.out.Len() != 0 {
				t.Errorf("stdout not empty: %q", c.out.String())
			}
			if c.served != nil || c.reaped != nil {
				t.Errorf("daemon entry point called")
			}
		})
	}
}

// TestCLIHelp: --help, -h and help COMMAND print usage on stdout, exit 0.
func TestCLIHelp(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "usage: enforcerd [--socket PATH] COMMAND"},
		{[]string{"-h"}, "usage: enforcerd [--socket PATH] COMMAND"},
		{[]string{"help"}, "usage: enforcerd [--socket PATH] COMMAND"},
		{[]string{"help", "serve"}, "usage: enforcerd serve [options]"},
		{[]string{"help", "session", "exec"}, "usage: enforcerd session exec NAME"},
		{[]string{"version", "--help"}, "usage: enforcerd version"},
		{[]string{"serve", "--help"}, "--public-override CIDR"},
		{[]string{"serve", "-h"}, "--dns-min-ttl DURATION"},
		{[]string{"reap", "--help"}, "usage: enforcerd reap"},
		{[]string{"session", "--help"}, "usage: enforcerd session SUBCOMMAND"},
		{[]string{"session", "help"}, "usage: enforcerd session SUBCOMMAND"},
		{[]string{"session", "create", "--help"}, "--allow ENTRY"},
		{[]string{"session", "exec", "s1", "--help"}, "usage: enforcerd session exec NAME"},
		{[]string{"--socket", "/x", "session", "ls", "-h"}, "--label KEY=VALUE"},
		{[]string{"session", "rm", "--help"}, "--json"},
		{[]string{"help", "completion"}, "usage: enforcerd completion bash|zsh|fish"},
		{[]string{"session", "create", "s1", "--allow", "x", "-h"}, "usage: enforcerd session create NAME"},
		{[]string{"session", "exec", "--help"}, "--timeout DURATION"},
		{[]string{"session", "ls", "--help"}, "usage: enforcerd session ls"},
		{[]string{"session", "inspect", "--help"}, "usage: enforcerd session inspect NAME"},
		{[]string{"session", "rm", "--help"}, "usage: enforcerd session rm NAME..."},
		{[]string{"session", "events", "--help"}, "--follow"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			c := newTestCLI(t)
			if code := c.run(tc.args...); code != 0 {
				t.Fatalf("exit %d, stderr %q", code, c.errOut.String())
			}
			if !strings.Contains(c.out.String(), tc.want) {
				t.Errorf("stdout lacks %q:\n%s", tc.want, c.out.String())
			}
			if c.errOut.Len() != 0 {
				t.Errorf("stderr not empty: %q", c.errOut.String())
			}
		})
	}
}

// TestCLIVersion: the version, the commit and the Go version, as one line
// or as JSON; no daemon is asked.
func TestCLIVersion(t *testing.T) {
	c := newTestCLI(t)
	want := "enforcerd " + version + " (commit " + orUnknown(commit) + ", " + runtime.Version() + ")\n"
	if code := c.run("version"); code != 0 || c.out.String() != want {
		t.Fatalf("exit %d, stdout %q, want %q", code, c.out.String(), want)
	}
	if code := c.run("version", "--json"); code != 0 {
		t.Fatalf("version --json: exit %d: %s", code, c.errOut.String())
	}
	var got buildInfo
	if err := json.Unmarshal(c.out.Bytes(), &got); err != nil {
		t.Fatalf("version --json: %v: %q", err, c.out.String())
	}
	if wantBI := (buildInfo{Version: version, Commit: commit, Go: runtime.Version(), API: "v1"}); got != wantBI {
		t.Fatalf("version --json: %+v, want %+v", got, wantBI)
	}
}

// TestCLICompletion: each shell's script comes from the command tree, and
// the completion of a command line (what the scripts ask) offers the
// subcommands and a flag's fixed values.
func TestCLICompletion(t *testing.T) {
	for shell, marker := range map[string]string{
		"bash": "__start_enforcerd", "zsh": "#compdef enforcerd", "fish": "complete -c enforcerd",
	} {
		c := newTestCLI(t)
		if code := c.run("completion", shell); code != 0 {
			t.Fatalf("completion %s: exit %d: %s", shell, code, c.errOut.String())
		}
		if !strings.Contains(c.out.String(), marker) {
			t.Errorf("completion %s lacks %q", shell, marker)
		}
	}
	c := newTestCLI(t)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"session", ""}, []string{"create", "events", "exec", "exec-status", "inspect", "logs", "ls", "rm", "update", "why"}},
		{[]string{"se"}, []string{"serve", "session"}},
		{[]string{"session", "create", "s1", "--egress", ""}, []string{"none", "allowlist", "public"}},
		{[]string{"serve", "--log-format", ""}, []string{"text", "json"}},
		{[]string{"completion", ""}, []string{"bash", "zsh", "fish"}},
	} {
		if code := c.run(append([]string{cobra.ShellCompNoDescRequestCmd}, tc.args...)...); code != 0 {
			t.Fatalf("complete %q: exit %d: %s", tc.args, code, c.errOut.String())
		}
		lines := strings.Split(strings.TrimSpace(c.out.String()), "\n")
		got := lines[:len(lines)-1] // the last line is the directive
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("complete %q: %q, want %q", tc.args, got, tc.want)
		}
	}
}

// TestCLIManPages: the hidden man command writes one page per visible
// command, from the same definitions as --help.
func TestCLIManPages(t *testing.T) {
	c := newTestCLI(t)
	dir := filepath.Join(t.TempDir(), "man1")
	if code := c.run("man", dir); code != 0 {
		t.Fatalf("man: exit %d: %s", code, c.errOut.String())
	}
	var want []string
	for _, cmd := range allCommands(c.rootCommand()) {
		if cmd.Hidden {
			continue
		}
		want = append(want, strings.ReplaceAll(cmd.CommandPath(), " ", "-")+".1")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	sort.Strings(want)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("man pages %q, want %q", got, want)
	}
	page, err := os.ReadFile(filepath.Join(dir, "enforcerd-session-create.1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`.TH "ENFORCERD-SESSION-CREATE" "1" "Jan 2025"`, `\fB--network-only\fP`, `--images-dir`} {
		if !strings.Contains(string(page), s) {
			t.Errorf("enforcerd-session-create.1 lacks %q:\n%s", s, page)
		}
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
	_, errOut := c.expect(t, exitUsage, "session", "create", "s1", "--network-only", "--", "--json")
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
	}
	for in, want := range ok {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "M", "0", "-1", "1.5G", "12X", "99999999999T"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q): no error", in)
		}
	}
}

// TestCLIServeRuntimeError: a failing daemon exits 1 with one line.
func TestCLIServeRuntimeError(t *testing.T) {
	c := newTestCLI(t)
	c.cli.serve = func(ServeConfig) error { return errors.New("listen /x: permission denied\nmore") }
	if code := c.run("serve"); code != exitRefused {
		t.Fatalf("exit %d", code)
	}
	if got := c.errOut.String(); got != "enforcerd serve: listen /x: permission denied more\n" {
		t.Fatalf("stderr %q", got)
	}
}

func TestCLIReap(t *testing.T) {
	c := newTestCLI(t)
	if code := c.run("reap", "--name-prefix", "t1", "--state-dir", "/tmp/st", "--pool", "10.30.0.0/24"); code != 0 {
		t.Fatalf("exit %d: %s", code, c.errOut.String())
	}
	if want := []string{"t1", "/tmp/st", "10.30.0.0/24"}; !reflect.DeepEqual(c.reaped, want) {
		t.Fatalf("reaped %v, want %v", c.reaped, want)
	}
	if code := c.run("reap"); code != 0 {
		t.Fatalf("exit %d: %s", code, c.errOut.String())
	}
	if want := []string{"enf", "/var/lib/enforcerd", "10.20.0.0/16"}; !reflect.DeepEqual(c.reaped, want) {
		t.Fatalf("reaped %v, want %v", c.reaped, want)
	}
}

// TestCLINetworkOnlyRefusesSandboxFlags: a flag that configures the sandbox
// has no effect without one; --network-only refuses it in one line naming
// it, before asking the daemon. A false boolean asks for nothing.
func TestCLINetworkOnlyRefusesSandboxFlags(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		flag  string
	}{
		{[]string{"--memory", "1G"}, "--memory"},
		{[]string{"--pids", "10"}, "--pids"},
		{[]string{"--cpus", "0.5"}, "--cpus"},
		{[]string{"--net-raw"}, "--net-raw"},
		{[]string{"--writable"}, "--writable"},
		{[]string{"--writable", "--memory", "1G"}, "--memory"}, // the first in the daemon's order
	} {
		args := append([]string{"session", "create", "s1", "--network-only"}, tc.flags...)
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			c := newTestCLI(t)
			c.env["ENFORCERD_SOCKET"] = filepath.Join(t.TempDir(), "nobody.sock")
			if code := c.run(args...); code != exitUsage {
				t.Errorf("exit %d, want 2 (stderr %q)", code, c.errOut.String())
			}
			want := "enforcerd session create: " + tc.flag + " has no effect with --network-only: there is no sandbox; leave it out\n"
			if got := c.errOut.String(); got != want {
				t.Errorf("stderr\n got %q\nwant %q", got, want)
			}
		})
	}
	// False booleans pass the CLI (the daemon is then unreachable: exit 1).
	c := newTestCLI(t)
	c.env["ENFORCERD_SOCKET"] = filepath.Join(t.TempDir(), "nobody.sock")
	if code := c.run("session", "create", "s1", "--network-only", "--net-raw=false", "--writable=false"); code == exitUsage {
		t.Errorf("--net-raw=false --writable=false refused: %q", c.errOut.String())
	}
}
