package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// Exit statuses of the command line (the contract in issue 5).
const (
	exitOK        = 0
	exitRefused   = 1   // the daemon refused, or could not be reached
	exitUsage     = 2   // the command line itself is malformed
	exitInterrupt = 130 // session exec: interrupted by the user
)

// exitError is an error with the exit status the process ends with. Its
// message is printed as one line on stderr; an empty message prints nothing.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// errHelpShown ends a command after its usage was printed on request.
var errHelpShown = errors.New("help shown")

// usageErr is a malformed command line: exit status 2.
func usageErr(cmd, format string, a ...any) error {
	return &exitError{code: exitUsage, msg: cmd + ": " + doubleDash(fmt.Sprintf(format, a...))}
}

// refusedErr is a refusal (or failure) reported by or about the daemon: exit 1.
func refusedErr(cmd string, err error) error {
	return &exitError{code: exitRefused, msg: cmd + ": " + err.Error()}
}

// cli is the command-line program. Its fields are the test seams: the
// streams, the environment, the clock and the two daemon entry points
// (runServe and runReap in production).
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	now            func() time.Time
	resolvConf     string // nameservers for the default --upstream
	serve          func(ServeConfig) error
	reap           func(prefix, stateDir string, pool netip.Prefix, force bool) error
}

// newCLI returns the production command line.
func newCLI() *cli {
	return &cli{
		stdin:      os.Stdin,
		stdout:     os.Stdout,
		stderr:     os.Stderr,
		getenv:     os.Getenv,
		now:        time.Now,
		resolvConf: "/etc/resolv.conf",
		serve:      runServe,
		reap:       runReap,
	}
}

// run executes one command line (without the program name) and returns the
// exit status. Errors are printed as exactly one line on stderr.
func (c *cli) run(args []string) int {
	err := c.dispatch(args)
	switch {
	case err == nil, errors.Is(err, errHelpShown):
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(c.stderr, api.OneLine(ee.msg))
		}
		return ee.code
	}
	fmt.Fprintln(c.stderr, "enforcerd: "+api.OneLine(err.Error()))
	return exitRefused
}

// globalOpts are the options accepted before the command name.
type globalOpts struct {
	socket string // "" = not given
}

const topUsage = `usage: enforcerd [--socket PATH] COMMAND [ARGS]

enforcerd runs sandbox sessions whose network egress is enforced from the host.

commands:
  serve                 run the daemon
  session create        create a session
  session exec          run a command in a session's sandbox
  session ls            list sessions
  session inspect       show one session as JSON
  session rm            remove sessions by name or label
  session events        print a session's events (NDJSON)
  reap                  offline: remove every object of a name prefix
  version               print the version
  help [COMMAND]        show help

global options:
  --socket PATH         the daemon's socket (env ENFORCERD_SOCKET; default ` + api.DefaultSocket + `)

Run 'enforcerd COMMAND --help' for a command's options.
`

func (c *cli) dispatch(args []string) error {
	g := newFlagSet("enforcerd")
	var glob globalOpts
	g.StringVar(&glob.socket, "socket", "", "")
	if err := g.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(c.stdout, topUsage)
			return errHelpShown
		}
		return usageErr("enforcerd", "%v", err)
	}
	rest := g.Args()
	if len(rest) == 0 {
		return usageErr("enforcerd", "missing command (run 'enforcerd help')")
	}
	cmd, rest := rest[0], rest[1:]
	switch cmd {
	case "serve":
		return c.cmdServe(glob, rest)
	case "session":
		return c.cmdSession(glob, rest)
	case "reap":
		return c.cmdReap(rest)
	case "version":
		return c.cmdVersion(rest)
	case "help":
		return c.cmdHelp(rest)
	case "init":
		// main dispatches "enforcerd init" before any parsing; reaching
		// here means it was not the first argument.
		return usageErr("enforcerd", "init is internal to the sandbox runtime and must be the first argument")
	}
	return usageErr("enforcerd", "unknown command %q (run 'enforcerd help')", cmd)
}

func (c *cli) cmdHelp(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(c.stdout, topUsage)
		return errHelpShown
	}
	return c.dispatch(append(append([]string{}, args...), "--help"))
}

func (c *cli) cmdVersion(args []string) error {
	fs := newFlagSet("version")
	pos, _, err := c.parse(fs, "enforcerd version", "usage: enforcerd version\n\nPrint the version of this binary.\n", args, 0)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr("enforcerd version", "unexpected argument %q", pos[0])
	}
	fmt.Fprintln(c.stdout, "enforcerd", version)
	return nil
}

// signalContext is the context of a client command: cancelled by SIGINT or
// SIGTERM so that a streaming request ends and the daemon sees it.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// ---- flag parsing -------------------------------------------------------

// newFlagSet returns a flag set that reports errors to its caller only.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parse parses args against fs, allowing flags and positional arguments to
// interleave ("session create s1 --allow x"). "--" ends the flags. When
// stopAfter > 0, the first non-flag argument after stopAfter positionals
// starts the rest verbatim (the command of "session exec NAME CMD...").
// It returns the positionals and the rest (everything after "--" or the
// stop). On --help it prints usage on stdout and returns errHelpShown; any
// other error is a usage error (exit 2) naming the command.
// flagInError matches a flag name as the flag package prints it ("-timeout").
var flagInError = regexp.MustCompile(`(flag |: )-([a-z])`)

// doubleDash spells flags in the flag package's errors the way the command
// line contract does: --timeout, not -timeout.
func doubleDash(msg string) string { return flagInError.ReplaceAllString(msg, "${1}--${2}") }

func (c *cli) parse(fs *flag.FlagSet, cmd, usage string, args []string, stopAfter int) (pos, rest []string, err error) {
	var flagArgs []string
	rest = nil
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append([]string{}, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			if stopAfter > 0 && len(pos) == stopAfter {
				rest = append([]string{}, args[i:]...)
				break
			}
			pos = append(pos, a)
			continue
		}
		flagArgs = append(flagArgs, a)
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil || isBoolFlag(f) {
			continue // unknown flags are reported by fs.Parse
		}
		if i+1 < len(args) {
			i++
			flagArgs = append(flagArgs, args[i])
		}
	}
	if err := fs.Parse(flagArgs); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(c.stdout, usage)
			printFlags(c.stdout, fs)
			return nil, nil, errHelpShown
		}
		return nil, nil, usageErr(cmd, "%v", err)
	}
	pos = append(pos, fs.Args()...) // only odd tokens such as "---x" land here
	return pos, rest, nil
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// printFlags prints a flag set's options in the --long style of the contract.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	var lines []string
	fs.VisitAll(func(f *flag.Flag) {
		arg, help := flag.UnquoteUsage(f)
		if isBoolFlag(f) {
			arg = ""
		}
		left := "  --" + f.Name
		if arg != "" {
			left += " " + arg
		}
		if _, ok := f.Value.(*listFlag); ok {
			left += "..."
		}
		if kv, ok := f.Value.(*kvFlag); ok && !kv.single {
			left += "..."
		}
		if len(left) <= 22 {
			left += strings.Repeat(" ", 24-len(left))
		} else {
			left += "\n" + strings.Repeat(" ", 24)
		}
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" && f.DefValue != "0" && f.DefValue != "0s" {
			help += " (default " + f.DefValue + ")"
		}
		lines = append(lines, left+help)
	})
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\noptions:")
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}

// listFlag is a repeatable string flag; check, when set, validates each value.
type listFlag struct {
	values []string
	check  func(string) error
}

func (l *listFlag) String() string {
	if l == nil || len(l.values) == 0 {
		return "[]"
	}
	return strings.Join(l.values, ",")
}

func (l *listFlag) Set(v string) error {
	if l.check != nil {
		if err := l.check(v); err != nil {
			return err
		}
	}
	l.values = append(l.values, v)
	return nil
}

// kvFlag is a repeatable KEY=VALUE flag (--label, --env). With single set it
// accepts at most one occurrence (a filter).
type kvFlag struct {
	keys   []string
	values map[string]string
	single bool
}

func (k *kvFlag) String() string {
	if k == nil || len(k.keys) == 0 {
		return ""
	}
	parts := make([]string, len(k.keys))
	for i, key := range k.keys {
		parts[i] = key + "=" + k.values[key]
	}
	return strings.Join(parts, ",")
}

func (k *kvFlag) Set(v string) error {
	key, val, err := splitKV(v)
	if err != nil {
		return err
	}
	if k.single && len(k.keys) > 0 {
		return fmt.Errorf("given twice; only one KEY=VALUE filter is accepted")
	}
	if _, dup := k.values[key]; dup {
		return fmt.Errorf("key %q given twice", key)
	}
	if k.values == nil {
		k.values = map[string]string{}
	}
	k.keys = append(k.keys, key)
	k.values[key] = val
	return nil
}

// pairs returns KEY=VALUE strings in the order given.
func (k *kvFlag) pairs() []string {
	out := make([]string, len(k.keys))
	for i, key := range k.keys {
		out[i] = key + "=" + k.values[key]
	}
	return out
}

// first returns the only pair of a single-valued filter.
func (k *kvFlag) first() (key, value string, ok bool) {
	if len(k.keys) == 0 {
		return "", "", false
	}
	return k.keys[0], k.values[k.keys[0]], true
}

// splitKV splits KEY=VALUE; the key must be non-empty and free of spaces.
func splitKV(v string) (string, string, error) {
	key, val, ok := strings.Cut(v, "=")
	if !ok || key == "" || strings.ContainsAny(key, " \t\n") {
		return "", "", fmt.Errorf("want KEY=VALUE with a non-empty KEY")
	}
	return key, val, nil
}

// sortedKV renders a map as "k=v,k=v" in key order.
func sortedKV(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for i, k := range keys {
		keys[i] = k + "=" + m[k]
	}
	return strings.Join(keys, ",")
}

// ---- serve and reap -------------------------------------------------------

const serveUsage = `usage: enforcerd serve [options]

Run the daemon: re-adopt surviving sessions, reap partial ones, serve the API
on the unix socket and tell systemd it is ready. Every option can also be set
in a TOML file given with --config (keys are the option names, e.g.
state-dir = "/var/lib/enforcerd", upstream = ["192.0.2.53"]); flags win.

API access is powerful: whoever may use the socket (root, and the members of
--socket-group) can run any program as root in a sandbox, from any image under
--images-dir, and choose its network policy, public egress included. Grant
the group only to those you would let run containers as root. Without
--images-dir no sandbox can be created (--network-only sessions still can).
`

func (c *cli) cmdServe(glob globalOpts, args []string) error {
	const cmd = "enforcerd serve"
	fs := newFlagSet("serve")
	flags := defineServeFlags(fs)
	pos, _, err := c.parse(fs, cmd, serveUsage, args, 0)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr(cmd, "unexpected argument %q (serve takes options only)", pos[0])
	}
	src, err := collectServeOptions(fs, flags, glob)
	if err != nil {
		return usageErr(cmd, "%v", err)
	}
	cfg, err := buildServeConfig(src, c.getenv, c.resolvConf)
	if err != nil {
		return usageErr(cmd, "%v", err)
	}
	if err := c.serve(cfg); err != nil {
		return &exitError{code: exitRefused, msg: cmd + ": " + err.Error()}
	}
	return nil
}

const reapUsage = `usage: enforcerd reap [--name-prefix P] [--state-dir DIR] [--pool CIDR] [--config FILE] [--force]

Offline, with the daemon stopped: remove every kernel object of the name
prefix (network namespaces, interfaces, the nftables table, sandboxes) and
the state records. It refuses while a daemon serves the prefix or the state
dir (--force removes them anyway, from under it).
`

func (c *cli) cmdReap(args []string) error {
	const cmd = "enforcerd reap"
	fs := newFlagSet("reap")
	flags := defineReapFlags(fs)
	pos, _, err := c.parse(fs, cmd, reapUsage, args, 0)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr(cmd, "unexpected argument %q (reap takes options only)", pos[0])
	}
	src, err := collectServeOptions(fs, flags, globalOpts{})
	if err != nil {
		return usageErr(cmd, "%v", err)
	}
	prefix, stateDir, pool, err := buildReapConfig(src)
	if err != nil {
		return usageErr(cmd, "%v", err)
	}
	if err := c.reap(prefix, stateDir, pool, *flags.force); err != nil {
		return &exitError{code: exitRefused, msg: cmd + ": " + err.Error()}
	}
	return nil
}
