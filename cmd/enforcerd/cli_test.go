package main

import (
	"bytes"
	"errors"
	"fmt"
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
	"github.com/spf13/pflag"

	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/internal/cli"
)

// testCLI is a cli with buffers, an environment map and fake daemon entry
// points that record what they were given.
type testCLI struct {
	*enforcerdCLI
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
	tc.enforcerdCLI = withDaemonCommands(&enforcerdCLI{
		CLI: &cli.CLI{
			Stdin:   strings.NewReader(""),
			Stdout:  &tc.out,
			Stderr:  &tc.errOut,
			Getenv:  func(k string) string { return tc.env[k] },
			Now:     func() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) },
			Prog:    "enforcerd",
			Version: version,
			Commit:  commit,
		},
		resolvConf: rc,
		serve: func(cfg ServeConfig) error {
			tc.served = &cfg
			return nil
		},
		reap: func(prefix, stateDir string, pool netip.Prefix, force bool) error {
			tc.reaped = []string{prefix, stateDir, pool.String()}
			return nil
		},
	})
	return tc
}

func (tc *testCLI) run(args ...string) int {
	tc.out.Reset()
	tc.errOut.Reset()
	return tc.enforcerdCLI.run(args)
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
		{[]string{"--bogus"}, "enforcerd: unknown flag: --bogus"},
		{[]string{"init"}, "enforcerd: init is internal to the sandbox runtime and must be the first argument"},
		{[]string{"version", "x"}, `enforcerd version: unexpected argument "x"`},
		{[]string{"serve", "--bogus"}, "enforcerd serve: unknown flag: --bogus"},
		{[]string{"serve", "now"}, `enforcerd serve: unexpected argument "now" (serve takes options only)`},
		{[]string{"serve", "--pool"}, "enforcerd serve: flag needs an argument: --pool"},
		{[]string{"reap", "--name-prefix", "Enf"}, `enforcerd reap: --name-prefix: invalid prefix "Enf": character 'E' not allowed; want 1 to 6 characters of a-z and 0-9, starting with a letter`},
		{[]string{"reap", "x"}, `enforcerd reap: unexpected argument "x" (reap takes options only)`},
		{[]string{"session"}, "enforcerd session: missing subcommand (create, fork, exec, exec-status, logs, ls, inspect, update, rm, events, why or report)"},
		{[]string{"session", "bogus"}, `enforcerd session: unknown subcommand "bogus"; did you mean "logs"?`},
		{[]string{"session", "frobnicate"}, `enforcerd session: unknown subcommand "frobnicate" (create, fork, exec, exec-status, logs, ls, inspect, update, rm, events, why or report)`},
		{[]string{"session", "--json", "ls"}, "enforcerd session: flag --json before the subcommand (flags go after it)"},
		{[]string{"session", "create"}, "enforcerd session create: missing session NAME"},
		{[]string{"session", "create", "--network-only"}, "enforcerd session create: missing session NAME"},
		{[]string{"session", "create", "s1"}, "enforcerd session create: missing --image IMAGE, --rootfs DIR, --network-only or --vm"},
		{[]string{"session", "create", "s1", "s2", "--network-only"}, `enforcerd session create: unexpected argument "s2" after NAME "s1"`},
		{[]string{"session", "create", "s1", "--rootfs", "/r", "--network-only"}, `enforcerd session create: --rootfs "/r" and --network-only exclude each other`},
		{[]string{"session", "create", "s1", "--rootfs="}, `enforcerd session create: invalid value "" for flag --rootfs: want a directory`},
		{[]string{"session", "create", "s1", "--network-only", "--bogus"}, "enforcerd session create: unknown flag: --bogus"},
		{[]string{"session", "create", "s1", "--network-only", "--allow"}, "enforcerd session create: flag needs an argument: --allow"},
		{[]string{"session", "create", "s1", "--network-only", "--label", "novalue"}, `enforcerd session create: invalid value "novalue" for flag --label: want KEY=VALUE with a non-empty KEY`},
		{[]string{"session", "create", "s1", "--network-only", "--label", "=v"}, `enforcerd session create: invalid value "=v" for flag --label: want KEY=VALUE with a non-empty KEY`},
		{[]string{"session", "create", "s1", "--network-only", "--label", "a=1", "--label", "a=2"}, `enforcerd session create: invalid value "a=2" for flag --label: key "a" given twice`},
		{[]string{"session", "create", "s1", "--network-only", "--memory", "12X"}, `enforcerd session create: invalid value "12X" for flag --memory: want a size such as 512M, 2G or 1048576`},
		{[]string{"session", "create", "s1", "--network-only", "--memory", "0"}, `enforcerd session create: invalid value "0" for flag --memory: want at least 4 MiB (4194304 bytes); leave it out for the default 512 MiB`},
		{[]string{"session", "create", "s1", "--network-only", "--pids", "many"}, `enforcerd session create: invalid value "many" for flag --pids: want at least 4; leave it out for the default 1024`},
		{[]string{"session", "create", "s1", "--network-only", "--pids", "0"}, `enforcerd session create: invalid value "0" for flag --pids: want at least 4; leave it out for the default 1024`},
		{[]string{"session", "create", "s1", "--rootfs", "/r", "--cpus", "0"}, `enforcerd session create: invalid value "0" for flag --cpus: ` + cpusWant},
		{[]string{"session", "create", "s1", "--rootfs", "/r", "--cpus", "0.001"}, `enforcerd session create: invalid value "0.001" for flag --cpus: ` + cpusWant},
		{[]string{"session", "create", "s1", "--rootfs", "/r", "--cpus", "-1"}, `enforcerd session create: invalid value "-1" for flag --cpus: ` + cpusWant},
		{[]string{"session", "create", "s1", "--rootfs", "/r", "--cpus", "half"}, `enforcerd session create: invalid value "half" for flag --cpus: ` + cpusWant},
		{[]string{"session", "create", "s1", "--rootfs", "/r", "--cpus", "NaN"}, `enforcerd session create: invalid value "NaN" for flag --cpus: ` + cpusWant},
		{[]string{"session", "create", "s1", "--network-only", "--egress", "open"}, `enforcerd session create: invalid value "open" for flag --egress: want none, allowlist, public`},
		{[]string{"session", "create", "s1", "--network-only", "--json=maybe"}, `enforcerd session create: invalid value "maybe" for flag --json: want true or false`},
		{[]string{"session", "exec"}, "enforcerd session exec: missing session NAME"},
		{[]string{"session", "exec", "s1"}, `enforcerd session exec: missing command after NAME "s1" (enforcerd session exec NAME -- CMD [ARG]...)`},
		{[]string{"session", "exec", "s1", "--"}, `enforcerd session exec: missing command after NAME "s1" (enforcerd session exec NAME -- CMD [ARG]...)`},
		{[]string{"session", "exec", "s1", "--timeout", "soon", "--", "ls"}, `enforcerd session exec: invalid value "soon" for flag --timeout: want a positive duration such as 30s`},
		{[]string{"session", "exec", "s1", "--timeout", "-1s", "--", "ls"}, `enforcerd session exec: invalid value "-1s" for flag --timeout: want a positive duration such as 30s`},
		{[]string{"session", "exec", "s1", "--env", "X", "--", "ls"}, `enforcerd session exec: invalid value "X" for flag --env: want KEY=VALUE with a non-empty KEY`},
		{[]string{"session", "exec", "s1", "--json", "--", "ls"}, "enforcerd session exec: --json prints the exec that --detach started; without --detach the output is the command's own"},
		{[]string{"session", "exec-status"}, "enforcerd session exec-status: missing session NAME"},
		{[]string{"session", "exec-status", "s1", "e1", "e2"}, `enforcerd session exec-status: unexpected argument "e2" after exec ID "e1"`},
		{[]string{"session", "logs"}, "enforcerd session logs: missing session NAME"},
		{[]string{"session", "logs", "s1"}, `enforcerd session logs: missing exec ID after NAME "s1" (session exec-status s1 lists them)`},
		{[]string{"session", "logs", "s1", "e1", "e2"}, `enforcerd session logs: unexpected argument "e2" after exec ID "e1"`},
		{[]string{"session", "why"}, "enforcerd session why: missing session NAME and DEST, e.g. enforcerd session why agent api.example.com:443"},
		{[]string{"session", "why", "s1"}, `enforcerd session why: missing DEST after NAME "s1", e.g. enforcerd session why s1 api.example.com:443`},
		{[]string{"session", "why", "s1", "a.test", "b.test"}, `enforcerd session why: unexpected argument "b.test" after DEST "a.test"`},
		{[]string{"session", "update", "s1", "--replace", "--allow", "a.test", "--revoke-deny", "b.test"}, `enforcerd session update: --revoke-deny "b.test" has no meaning with --replace: want the whole new policy`},
		{[]string{"session", "ls", "x"}, `enforcerd session ls: unexpected argument "x" (filter with --label KEY=VALUE)`},
		{[]string{"session", "ls", "--label", "a"}, `enforcerd session ls: invalid value "a" for flag --label: want KEY=VALUE with a non-empty KEY`},
		{[]string{"session", "ls", "--label", "a=1", "--label", "b=2"}, `enforcerd session ls: invalid value "b=2" for flag --label: given twice; only one KEY=VALUE filter is accepted`},
		{[]string{"session", "inspect"}, "enforcerd session inspect: missing session NAME"},
		{[]string{"session", "inspect", "a", "b"}, `enforcerd session inspect: unexpected argument "b" after NAME "a"`},
		{[]string{"session", "inspect", "a", "--bogus"}, "enforcerd session inspect: unknown flag: --bogus"},
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
		// A mistyped flag gets the nearest one suggested.
		{[]string{"session", "update", "s1", "--alow", "a.test"}, "enforcerd session update: unknown flag: --alow (did you mean --allow?)"},
		{[]string{"session", "create", "s1", "--network-only", "--alow=a.test"}, "enforcerd session create: unknown flag: --alow (did you mean --allow?)"},
		{[]string{"session", "ls", "--lable", "a=1"}, "enforcerd session ls: unknown flag: --lable (did you mean --label?)"},
		{[]string{"--sockt", "/x", "session", "ls"}, "enforcerd session ls: unknown flag: --sockt (did you mean --socket?)"},
		{[]string{"session", "ls", "--sock", "/x"}, "enforcerd session ls: unknown flag: --sock (did you mean --socket?)"},
		// Long options take two dashes; a single dash is a shorthand.
		{[]string{"session", "ls", "-json"}, "enforcerd session ls: unknown flag: -json (long options take two dashes: did you mean --json?)"},
		{[]string{"session", "ls", "-qqqq"}, "enforcerd session ls: unknown flag: -qqqq (long options take two dashes, as in --json)"},
		{[]string{"session", "exec", "s1", "-x", "--", "ls"}, "enforcerd session exec: unknown flag: -x"},
		{[]string{"session", "exec", "s1", "--bogus", "--", "ls"}, "enforcerd session exec: unknown flag: --bogus"},
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
			if code != cli.ExitUsage {
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

// cpusWant is what --cpus accepts, in container's words (the daemon says
// the same for the API's cpus field).
var cpusWant = fmt.Sprintf("want 0.01 to %d (the CPUs of this machine); leave it out for the default 1", runtime.NumCPU())

// TestCLILimitsSayWhatTheDaemonSays: a limit the command line refuses is
// refused with the daemon's own text for that limit (container's one
// rule), after the CLI's own prefix: no layer says 0 is the default while
// another says it must be positive.
func TestCLILimitsSayWhatTheDaemonSays(t *testing.T) {
	for _, c := range []struct {
		flag, value string
		daemon      error // the daemon's refusal of the same value
	}{
		{"--cpus", "0.001", container.CheckResources(0, 0, 0.001)},
		{"--pids", "2", container.CheckResources(0, 2, 0)},
		{"--memory", "1M", container.CheckResources(1<<20, 0, 0)},
	} {
		tc := newTestCLI(t)
		tc.env["ENFORCERD_SOCKET"] = filepath.Join(t.TempDir(), "nobody.sock")
		code := tc.run("session", "create", "s1", "--rootfs", "/r", c.flag, c.value)
		_, want, _ := strings.Cut(c.daemon.Error(), ": ")
		got := tc.errOut.String()
		if code != cli.ExitUsage || !strings.HasSuffix(got, "for flag "+c.flag+": "+want+"\n") {
			t.Errorf("%s %s: exit %d, stderr %q; want 2 and the daemon's text %q", c.flag, c.value, code, got, want)
		}
	}
}

// TestCLIFlagSuggestions: on every command, every visible flag mistyped
// (its second letter dropped) is a usage error, exit 2, whose one line
// names what was typed and suggests the flag.
func TestCLIFlagSuggestions(t *testing.T) {
	root := newTestCLI(t).RootCommand()
	n := 0
	for _, cmd := range cli.AllCommands(root) {
		if cmd.HasSubCommands() && cmd.HasParent() {
			continue // (flags go after the subcommand; see TestCLIUsageErrors)
		}
		path := strings.Fields(cmd.CommandPath())[1:]
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden || len(f.Name) < 3 {
				return
			}
			typo := f.Name[:1] + f.Name[2:]
			if cmd.Flags().Lookup(typo) != nil {
				return
			}
			c := newTestCLI(t)
			c.env["ENFORCERD_SOCKET"] = filepath.Join(t.TempDir(), "nobody.sock")
			args := append(append([]string{}, path...), "--"+typo+"=x")
			want := fmt.Sprintf("%s: unknown flag: --%s (did you mean --%s?)\n", cmd.CommandPath(), typo, f.Name)
			if code := c.run(args...); code != cli.ExitUsage || c.errOut.String() != want {
				t.Errorf("enforcerd %s: exit %d, stderr %q; want 2 and %q", strings.Join(args, " "), code, c.errOut.String(), want)
			}
			n++
		})
	}
	if n < 50 {
		t.Errorf("only %d flags tried", n)
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
		{[]string{"session", ""}, []string{"create", "events", "exec", "exec-status", "fork", "inspect", "logs", "ls", "report", "rm", "update", "why"}},
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
	for _, cmd := range cli.AllCommands(c.RootCommand()) {
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

// TestCLIServeRuntimeError: a failing daemon exits 1 with one line.
func TestCLIServeRuntimeError(t *testing.T) {
	c := newTestCLI(t)
	c.serve = func(ServeConfig) error { return errors.New("listen /x: permission denied\nmore") }
	if code := c.run("serve"); code != cli.ExitRefused {
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
			if code := c.run(args...); code != cli.ExitUsage {
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
	if code := c.run("session", "create", "s1", "--network-only", "--net-raw=false", "--writable=false"); code == cli.ExitUsage {
		t.Errorf("--net-raw=false --writable=false refused: %q", c.errOut.String())
	}
}

// noJSON are the commands without --json, each for a reason: what they
// print is not the program's own data, or they print nothing.
var noJSON = map[string]string{
	"enforcerd":              "a group: its commands have it",
	"enforcerd session":      "a group: its commands have it",
	"enforcerd image":        "a group: its commands have it",
	"enforcerd serve":        "the daemon: it prints nothing but its log (--log-format json)",
	"enforcerd reap":         "prints nothing; its outcome is the exit status",
	"enforcerd completion":   "prints a shell script",
	"enforcerd man":          "writes files (hidden)",
	"enforcerd session logs": "prints the exec's own output, byte for byte",
}

// TestCLIEveryCommandHelpAndJSON: every command answers --help with its
// usage line on stdout (exit 0), and every command that prints data has
// --json, but those named in noJSON with their reason.
func TestCLIEveryCommandHelpAndJSON(t *testing.T) {
	root := newTestCLI(t).RootCommand()
	for _, cmd := range cli.AllCommands(root) {
		path := cmd.CommandPath()
		if _, ok := noJSON[path]; !ok && cmd.Flags().Lookup("json") == nil {
			t.Errorf("%s has no --json", path)
		}
		if cmd.Hidden {
			continue
		}
		c := newTestCLI(t)
		args := append(strings.Fields(path)[1:], "--help")
		if code := c.run(args...); code != 0 || !strings.HasPrefix(c.out.String(), "usage: "+path) || c.errOut.Len() != 0 {
			t.Errorf("%s --help: exit %d, stdout %q, stderr %q", path, code, c.out.String(), c.errOut.String())
		}
	}
}
