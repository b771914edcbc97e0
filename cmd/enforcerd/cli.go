package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/enforcerd/enforcerd/api"
)

// Exit statuses of the command line. Session exec adds the command's own
// status and those of api.ExitTimeout through api.ExitNotFound.
const (
	exitOK        = 0
	exitRefused   = 1   // the daemon refused, or could not be reached
	exitUsage     = 2   // the command line itself is malformed
	exitInterrupt = 130 // session exec: interrupted by the user
)

// exitError is an error with the exit status the process ends with. Its
// message is printed as one line on stderr; an empty message prints nothing.
// err, when set, is the cause (a daemon's *api.Error carries its code).
type exitError struct {
	code int
	msg  string
	err  error
	// jsonLog prints msg as a JSON log record (serve's start error when
	// the daemon logs JSON).
	jsonLog bool
}

func (e *exitError) Error() string { return e.msg }
func (e *exitError) Unwrap() error { return e.err }

// errHelpShown ends a command after its usage was printed on request.
var errHelpShown = errors.New("help shown")

// usageErr is a malformed command line: exit status 2.
func usageErr(cmd, format string, a ...any) error {
	return &exitError{code: exitUsage, msg: cmd + ": " + fmt.Sprintf(format, a...)}
}

// refusedErr is a refusal (or failure) reported by or about the daemon: exit 1.
func refusedErr(cmd string, err error) error {
	return &exitError{code: exitRefused, msg: cmd + ": " + err.Error(), err: err}
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
	root := c.rootCommand()
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	switch {
	case err == nil, errors.Is(err, errHelpShown):
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			c.printError(api.OneLine(ee.msg), ee.jsonLog)
			c.writeErrorJSON(cmd, ee)
		}
		return ee.code
	}
	c.printError("enforcerd: "+api.OneLine(err.Error()), false)
	return exitRefused
}

// printError writes the one error line on stderr, at err priority when
// stderr is the journal stream (under systemd the last line of a failed
// start is its reason: journalctl -p err must show it).
func (c *cli) printError(line string, asJSON bool) {
	f, _ := c.stderr.(*os.File)
	io.WriteString(c.stderr, errorLine(line, asJSON, onJournalStream(c.getenv, f), c.now))
}

// writeErrorJSON writes, for a command run with --json whose refusal came
// from the daemon, {"error": LINE, "code": CODE} on stdout: the line
// printed on stderr and the API's code (api.Codes), for a program to
// branch on.
func (c *cli) writeErrorJSON(cmd *cobra.Command, ee *exitError) {
	var ae *api.Error
	if cmd == nil || !errors.As(ee, &ae) || ae.Code == "" {
		return
	}
	if f := cmd.Flags().Lookup("json"); f == nil || f.Value.String() != "true" {
		return
	}
	b, _ := json.Marshal(api.ErrorBody{Error: api.OneLine(ee.msg), Code: ae.Code})
	fmt.Fprintln(c.stdout, string(b))
}

// globalOpts are the options every command accepts, before or after its name.
type globalOpts struct {
	socket string // "" = not given
}

// helpTemplate is every command's --help: the usage line, the description,
// the subcommands and the options.
const helpTemplate = `usage: {{.UseLine}}
{{with .Long}}
{{. | trimTrailingWhitespaces}}
{{end}}{{if .HasAvailableSubCommands}}
commands:{{range .Commands}}{{if .IsAvailableCommand}}
  {{rpad .Name .NamePadding}}  {{.Short}}{{end}}{{end}}
{{end}}{{if .HasAvailableLocalFlags}}
options:
{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}
{{end}}{{if .HasAvailableInheritedFlags}}
global options:
{{.InheritedFlags.FlagUsages | trimTrailingWhitespaces}}
{{end}}{{if .HasAvailableSubCommands}}
Run '{{.CommandPath}} COMMAND --help' for a command's options.
{{end}}`

// rootCommand builds the command tree of one run. The tree holds the
// parsed flag values, so every run builds a new one.
func (c *cli) rootCommand() *cobra.Command {
	glob := &globalOpts{}
	root := &cobra.Command{
		Use:   "enforcerd [--socket PATH] COMMAND [ARGS]",
		Short: "sandbox sessions with host-enforced network egress",
		Long:  "enforcerd runs sandbox sessions whose network egress is enforced from the host.",
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			const name = "enforcerd"
			switch {
			case len(args) == 0:
				return usageErr(name, "missing command (run 'enforcerd help')")
			case args[0] == "init":
				// main dispatches "enforcerd init" before any parsing;
				// reaching here means it was not the first argument.
				return usageErr(name, "init is internal to the sandbox runtime and must be the first argument")
			}
			return unknownCommand(cmd, name, "command", args[0], "run 'enforcerd help'")
		},
		SilenceErrors:              true,
		SilenceUsage:               true,
		SuggestionsMinimumDistance: 2,
		CompletionOptions:          cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetIn(c.stdin)
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	root.SetHelpTemplate(helpTemplate)
	root.SetFlagErrorFunc(flagError)
	root.PersistentFlags().StringVar(&glob.socket, "socket", "",
		"the daemon's socket `PATH` (env ENFORCERD_SOCKET; default "+api.DefaultSocket+")")

	root.AddCommand(
		c.serveCommand(glob),
		c.sessionCommand(glob),
		c.imageCommand(glob),
		c.eventsCommand(glob),
		c.reapCommand(),
		c.doctorCommand(glob),
		c.bugreportCommand(glob),
		c.versionCommand(glob),
		c.completionCommand(root),
		c.manCommand(root),
	)
	root.SetHelpCommand(c.helpCommand(root))
	for _, cmd := range allCommands(root) {
		cmd.DisableFlagsInUseLine = true
		cmd.Flags().SortFlags = false
	}
	return root
}

// allCommands returns cmd and all its descendants.
func allCommands(cmd *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{cmd}
	for _, sub := range cmd.Commands() {
		out = append(out, allCommands(sub)...)
	}
	return out
}

// unknownCommand is the usage error of a mistyped (sub)command; it suggests
// the nearest of cmd's subcommands, else points at hint.
func unknownCommand(cmd *cobra.Command, name, what, typed, hint string) error {
	if s := cmd.SuggestionsFor(typed); len(s) > 0 {
		return usageErr(name, "unknown %s %q; did you mean %q?", what, typed, s[0])
	}
	return usageErr(name, "unknown %s %q (%s)", what, typed, hint)
}

// flagError turns pflag's parse errors into the contract's one-line usage
// errors: "unknown flag: --x (did you mean --y?)", "flag needs an
// argument: --x", `invalid value "v" for flag --x: what is accepted`. It
// is the root's, and cobra hands every command's flag errors to it.
func flagError(cmd *cobra.Command, err error) error {
	name := cmd.CommandPath()
	var (
		notExist *pflag.NotExistError
		invalid  *pflag.InvalidValueError
	)
	switch {
	case errors.As(err, &notExist) && notExist.GetSpecifiedShortnames() != "":
		typed := notExist.GetSpecifiedShortnames()
		if len(typed) == 1 {
			return usageErr(name, "unknown flag: -%s", typed)
		}
		if s := suggestFlag(cmd.Flags(), typed); s != "" {
			return usageErr(name, "unknown flag: -%s (long options take two dashes: did you mean --%s?)", typed, s)
		}
		return usageErr(name, "unknown flag: -%s (long options take two dashes, as in --json)", typed)
	case errors.As(err, &notExist):
		typed := notExist.GetSpecifiedName()
		if cmd.HasSubCommands() && cmd.HasParent() {
			return usageErr(name, "flag --%s before the subcommand (flags go after it)", typed)
		}
		if s := suggestFlag(cmd.Flags(), typed); s != "" {
			return usageErr(name, "unknown flag: --%s (did you mean --%s?)", typed, s)
		}
		return usageErr(name, "unknown flag: --%s", typed)
	case errors.As(err, &invalid):
		cause := errors.Unwrap(invalid)
		var num *strconv.NumError
		switch {
		case invalid.GetFlag().Value.Type() == "bool":
			cause = errors.New("want true or false")
		case errors.As(cause, &num):
			cause = errors.New("want a number")
		}
		return usageErr(name, "invalid value %q for flag --%s: %v", invalid.GetValue(), invalid.GetFlag().Name, cause)
	}
	return usageErr(name, "%v", err)
}

// suggestFlag is the visible long flag of fs nearest to typed: at most two
// edits away (case ignored), or one that typed begins or that begins with
// typed (three letters at least); "" when none is. Ties go to the
// alphabetically first name, so the hint never changes between runs.
func suggestFlag(fs *pflag.FlagSet, typed string) string {
	typed = strings.ToLower(typed)
	best, bestDist := "", 3
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Deprecated != "" {
			return
		}
		d := editDistance(typed, strings.ToLower(f.Name))
		if d > 2 && len(typed) >= 3 && (strings.HasPrefix(f.Name, typed) || strings.HasPrefix(typed, f.Name)) {
			d = 2
		}
		if d < bestDist || d == bestDist && best != "" && f.Name < best {
			best, bestDist = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance of a and b (bytes: flag names
// are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// noArgs is the check of a command that takes options only.
func noArgs(name, hint string, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if hint != "" {
		return usageErr(name, "unexpected argument %q (%s)", args[0], hint)
	}
	return usageErr(name, "unexpected argument %q", args[0])
}

// ---- help, version, completion, man -------------------------------------

// helpCommand is "enforcerd help [COMMAND]...". An unknown topic is a
// usage error, as a mistyped command is.
func (c *cli) helpCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]...",
		Short: "show help",
		Args:  cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err != nil {
				return usageErr("enforcerd help", "%v", err)
			}
			if len(rest) > 0 {
				if target == root {
					return unknownCommand(target, "enforcerd help", "command", rest[0], "run 'enforcerd help'")
				}
				return unknownCommand(target, "enforcerd help", "subcommand of "+target.CommandPath(), rest[0],
					"run '"+target.CommandPath()+" --help'")
			}
			if err := target.Help(); err != nil {
				return err
			}
			return errHelpShown
		},
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// completionShells are the shells `enforcerd completion` writes scripts for.
var completionShells = []string{"bash", "zsh", "fish"}

func (c *cli) completionCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "print a shell completion script",
		Long: `Print the completion script of a shell on stdout. Load it for this shell
with, for bash, source <(enforcerd completion bash); install it with
scripts/install.sh, which puts the scripts in the shells' standard
directories.`,
		Args:      cobra.ArbitraryArgs,
		ValidArgs: completionShells,
		RunE: func(_ *cobra.Command, args []string) error {
			const name = "enforcerd completion"
			if len(args) == 0 {
				return usageErr(name, "missing shell (bash, zsh or fish)")
			}
			if len(args) > 1 {
				return usageErr(name, "unexpected argument %q after the shell %q", args[1], args[0])
			}
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(c.stdout, true)
			case "zsh":
				return root.GenZshCompletion(c.stdout)
			case "fish":
				return root.GenFishCompletion(c.stdout, true)
			}
			return usageErr(name, "unknown shell %q (bash, zsh or fish)", args[0])
		},
	}
}

// manCommand writes the man pages of every command into a directory; it is
// hidden (scripts/install.sh runs it), and built from the same definitions
// as --help.
func (c *cli) manCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:    "man DIR",
		Short:  "write the man pages into DIR",
		Hidden: true,
		Args:   cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			const name = "enforcerd man"
			if len(args) != 1 {
				return usageErr(name, "want exactly one DIR, got %d arguments", len(args))
			}
			if err := writeManPages(root, args[0], c.now()); err != nil {
				return refusedErr(name, err)
			}
			return nil
		},
	}
}

// signalContext is the context of a client command: cancelled by SIGINT or
// SIGTERM so that a streaming request ends and the daemon sees it.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// ---- flag values ------------------------------------------------------------

// kvFlag is a repeatable KEY=VALUE flag (--label, --env). With single set it
// accepts at most one occurrence (a filter).
type kvFlag struct {
	keys   []string
	values map[string]string
	single bool
}

func (k *kvFlag) Type() string { return "KEY=VALUE" }

func (k *kvFlag) String() string {
	if k == nil || len(k.keys) == 0 {
		return ""
	}
	return strings.Join(k.pairs(), ",")
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

// ---- serve and reap -------------------------------------------------------

const serveLong = `Run the daemon: re-adopt surviving sessions, reap partial ones, serve the API
on the unix socket and tell systemd it is ready. Every option can also be set
in a TOML file given with --config (keys are the option names, e.g.
state-dir = "/var/lib/enforcerd", upstream = ["192.0.2.53"]); flags win.

API access is powerful: whoever may use the socket (root, and the members of
--socket-group) can run any program as root in a sandbox, from any image of
the image store (<state-dir>/images, which it may import into) or under
--images-dir, and choose its network policy, public egress included. Grant
the group only to those you would let run containers as root.`

func (c *cli) serveCommand(glob *globalOpts) *cobra.Command {
	var flags *serveFlags
	cmd := &cobra.Command{
		Use:   "serve [options]",
		Short: "run the daemon",
		Long:  serveLong,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			const name = "enforcerd serve"
			if err := noArgs(name, "serve takes options only", args); err != nil {
				return err
			}
			flags.single[optSocket] = &glob.socket // the global option, wherever it was given
			src, err := collectServeOptions(cmd.Flags(), flags)
			if err != nil {
				return usageErr(name, "%v", err)
			}
			cfg, err := buildServeConfig(src, c.getenv, c.resolvConf)
			if err != nil {
				return usageErr(name, "%v", err)
			}
			if err := c.serve(cfg); err != nil {
				return &exitError{code: exitRefused, msg: name + ": " + err.Error(), jsonLog: cfg.LogFormat == "json"}
			}
			return nil
		},
	}
	flags = defineServeFlags(cmd.Flags())
	for opt, values := range map[string][]string{optLogFormat: {"text", "json"}} {
		_ = cmd.RegisterFlagCompletionFunc(opt, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
	}
	return cmd
}

const reapLong = `Offline, with the daemon stopped: remove every kernel object of the name
prefix (network namespaces, interfaces, the nftables table, sandboxes), the
exec records (their holders stopped), the state records and the prefix's
entry in /run/enforcerd (the directory too once no daemon is registered).
It refuses while a daemon serves the prefix or the state dir (--force
removes them anyway, from under it).`

func (c *cli) reapCommand() *cobra.Command {
	var flags *serveFlags
	cmd := &cobra.Command{
		Use:   "reap [--name-prefix P] [--state-dir DIR] [--pool CIDR] [--config FILE] [--force]",
		Short: "offline: remove every object of a name prefix",
		Long:  reapLong,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			const name = "enforcerd reap"
			if err := noArgs(name, "reap takes options only", args); err != nil {
				return err
			}
			src, err := collectServeOptions(cmd.Flags(), flags)
			if err != nil {
				return usageErr(name, "%v", err)
			}
			prefix, stateDir, pool, err := buildReapConfig(src)
			if err != nil {
				return usageErr(name, "%v", err)
			}
			if err := c.reap(prefix, stateDir, pool, flags.force); err != nil {
				return refusedErr(name, err)
			}
			return nil
		},
	}
	flags = defineReapFlags(cmd.Flags())
	return cmd
}
