package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	ExitOK        = 0
	ExitRefused   = 1   // the daemon refused, or could not be reached
	ExitUsage     = 2   // the command line itself is malformed
	ExitInterrupt = 130 // session exec: interrupted by the user
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

// UsageErr is a malformed command line: exit status 2.
func UsageErr(cmd, format string, a ...any) error {
	return &exitError{code: ExitUsage, msg: cmd + ": " + fmt.Sprintf(format, a...)}
}

// RefusedErr is a refusal (or failure) reported by or about the daemon: exit 1.
func RefusedErr(cmd string, err error) error {
	return &exitError{code: ExitRefused, msg: cmd + ": " + err.Error(), err: err}
}

// LoggedRefusal is RefusedErr printed, when asJSON, as a JSON log record
// at level ERROR (serve's start error when the daemon logs JSON).
func LoggedRefusal(cmd string, err error, asJSON bool) error {
	return &exitError{code: ExitRefused, msg: cmd + ": " + err.Error(), err: err, jsonLog: asJSON}
}

// CLI is the command line of one binary: enforcerd (every command) or
// enforcerctl (the client commands only). Its fields are the test seams:
// the streams, the environment and the clock; and what differs between the
// two binaries: the name, the version, and the daemon's own commands.
type CLI struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	Now            func() time.Time
	// Prog is the program's name: the root command's, and the first word
	// of every error line ("enforcerctl session create: ...").
	Prog string
	// Version and Commit are this binary's (stamped at build).
	Version, Commit string
	// DaemonCommands returns the commands that run on the daemon's side of
	// the socket (serve, reap, doctor, bugreport): enforcerd's; nil in the
	// thin client.
	DaemonCommands func(glob *GlobalOpts) []*cobra.Command
}

// New returns the production command line of the program prog, on the
// process's streams, environment and clock.
func New(prog, version, commit string) *CLI {
	return &CLI{
		Stdin:   os.Stdin,
		Stdout:  os.Stdout,
		Stderr:  os.Stderr,
		Getenv:  os.Getenv,
		Now:     time.Now,
		Prog:    prog,
		Version: version,
		Commit:  commit,
	}
}

// Run executes one command line (without the program name) and returns the
// exit status. Errors are printed as exactly one line on stderr.
func (c *CLI) Run(args []string) int {
	root := c.RootCommand()
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	switch {
	case err == nil, errors.Is(err, errHelpShown):
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			c.printError(api.OneLine(ee.msg), ee.jsonLog)
			c.writeErrorJSON(cmd, ee)
		}
		return ee.code
	}
	c.printError(c.Prog+": "+api.OneLine(err.Error()), false)
	return ExitRefused
}

// printError writes the one error line on stderr, at err priority when
// stderr is the journal stream (under systemd the last line of a failed
// start is its reason: journalctl -p err must show it).
func (c *CLI) printError(line string, asJSON bool) {
	f, _ := c.Stderr.(*os.File)
	io.WriteString(c.Stderr, errorLine(line, asJSON, OnJournalStream(c.Getenv, f), c.Now))
}

// writeErrorJSON writes, for a command run with --json whose refusal came
// from the daemon, {"error": LINE, "code": CODE} on stdout: the line
// printed on stderr and the API's code (api.Codes), for a program to
// branch on.
func (c *CLI) writeErrorJSON(cmd *cobra.Command, ee *exitError) {
	var ae *api.Error
	if cmd == nil || !errors.As(ee, &ae) || ae.Code == "" {
		return
	}
	if f := cmd.Flags().Lookup("json"); f == nil || f.Value.String() != "true" {
		return
	}
	b, _ := json.Marshal(api.ErrorBody{Error: api.OneLine(ee.msg), Code: ae.Code})
	fmt.Fprintln(c.Stdout, string(b))
}

// GlobalOpts are the options every command accepts, before or after its name.
type GlobalOpts struct {
	Socket string // "" = not given
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

// RootCommand builds the command tree of one run. The tree holds the
// parsed flag values, so every run builds a new one.
func (c *CLI) RootCommand() *cobra.Command {
	glob := &GlobalOpts{}
	root := &cobra.Command{
		Use:   c.Prog + " [--socket PATH] COMMAND [ARGS]",
		Short: "sandbox sessions with host-enforced network egress",
		Long:  c.long(),
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := c.Prog
			switch {
			case len(args) == 0:
				return UsageErr(name, "missing command (run '%s help')", c.Prog)
			case args[0] == "init" && c.DaemonCommands != nil:
				// main dispatches "enforcerd init" before any parsing;
				// reaching here means it was not the first argument.
				return UsageErr(name, "init is internal to the sandbox runtime and must be the first argument")
			}
			return unknownCommand(cmd, name, "command", args[0], "run '"+c.Prog+" help'")
		},
		SilenceErrors:              true,
		SilenceUsage:               true,
		SuggestionsMinimumDistance: 2,
		CompletionOptions:          cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetIn(c.Stdin)
	root.SetOut(c.Stdout)
	root.SetErr(c.Stderr)
	root.SetHelpTemplate(helpTemplate)
	root.SetFlagErrorFunc(flagError)
	root.PersistentFlags().StringVar(&glob.Socket, "socket", "",
		"the daemon's socket `PATH` (env ENFORCERD_SOCKET; default "+api.DefaultSocket+")")

	root.AddCommand(
		c.sessionCommand(glob),
		c.imageCommand(glob),
		c.eventsCommand(glob),
		c.versionCommand(glob),
		c.completionCommand(root),
		c.manCommand(root),
	)
	if c.DaemonCommands != nil {
		root.AddCommand(c.DaemonCommands(glob)...)
	}
	root.SetHelpCommand(c.helpCommand(root))
	for _, cmd := range AllCommands(root) {
		cmd.DisableFlagsInUseLine = true
		cmd.Flags().SortFlags = false
	}
	return root
}

// long is the root's description: the daemon's binary, or the thin client.
func (c *CLI) long() string {
	if c.DaemonCommands != nil {
		return c.Prog + " runs sandbox sessions whose network egress is enforced from the host."
	}
	return c.Prog + ` is the client of enforcerd, the daemon that runs sandbox sessions whose
network egress is enforced from the host: the commands that talk to the
daemon's API socket, with enforcerd's flags, output and exit statuses, in a
small binary that starts fast (it links no netlink, nftables or
libcontainer). Run the daemon itself, and doctor, reap and bugreport, with
enforcerd.`
}

// AllCommands returns cmd and all its descendants.
func AllCommands(cmd *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{cmd}
	for _, sub := range cmd.Commands() {
		out = append(out, AllCommands(sub)...)
	}
	return out
}

// unknownCommand is the usage error of a mistyped (sub)command; it suggests
// the nearest of cmd's subcommands, else points at hint.
func unknownCommand(cmd *cobra.Command, name, what, typed, hint string) error {
	if s := cmd.SuggestionsFor(typed); len(s) > 0 {
		return UsageErr(name, "unknown %s %q; did you mean %q?", what, typed, s[0])
	}
	return UsageErr(name, "unknown %s %q (%s)", what, typed, hint)
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
			return UsageErr(name, "unknown flag: -%s", typed)
		}
		if s := suggestFlag(cmd.Flags(), typed); s != "" {
			return UsageErr(name, "unknown flag: -%s (long options take two dashes: did you mean --%s?)", typed, s)
		}
		return UsageErr(name, "unknown flag: -%s (long options take two dashes, as in --json)", typed)
	case errors.As(err, &notExist):
		typed := notExist.GetSpecifiedName()
		if cmd.HasSubCommands() && cmd.HasParent() {
			return UsageErr(name, "flag --%s before the subcommand (flags go after it)", typed)
		}
		if s := suggestFlag(cmd.Flags(), typed); s != "" {
			return UsageErr(name, "unknown flag: --%s (did you mean --%s?)", typed, s)
		}
		return UsageErr(name, "unknown flag: --%s", typed)
	case errors.As(err, &invalid):
		cause := errors.Unwrap(invalid)
		var num *strconv.NumError
		switch {
		case invalid.GetFlag().Value.Type() == "bool":
			cause = errors.New("want true or false")
		case errors.As(cause, &num):
			cause = errors.New("want a number")
		}
		return UsageErr(name, "invalid value %q for flag --%s: %v", invalid.GetValue(), invalid.GetFlag().Name, cause)
	}
	return UsageErr(name, "%v", err)
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

// NoArgs is the check of a command that takes options only.
func NoArgs(name, hint string, args []string) error {
	if len(args) == 0 {
		return nil
	}
	if hint != "" {
		return UsageErr(name, "unexpected argument %q (%s)", args[0], hint)
	}
	return UsageErr(name, "unexpected argument %q", args[0])
}

// ---- help, version, completion, man -------------------------------------

// helpCommand is "enforcerd help [COMMAND]...". An unknown topic is a
// usage error, as a mistyped command is.
func (c *CLI) helpCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]...",
		Short: "show help",
		Args:  cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err != nil {
				return UsageErr(c.Prog+" help", "%v", err)
			}
			if len(rest) > 0 {
				if target == root {
					return unknownCommand(target, c.Prog+" help", "command", rest[0], "run '"+c.Prog+" help'")
				}
				return unknownCommand(target, c.Prog+" help", "subcommand of "+target.CommandPath(), rest[0],
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

func (c *CLI) completionCommand(root *cobra.Command) *cobra.Command {
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
			name := c.Prog + " completion"
			if len(args) == 0 {
				return UsageErr(name, "missing shell (bash, zsh or fish)")
			}
			if len(args) > 1 {
				return UsageErr(name, "unexpected argument %q after the shell %q", args[1], args[0])
			}
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(c.Stdout, true)
			case "zsh":
				return root.GenZshCompletion(c.Stdout)
			case "fish":
				return root.GenFishCompletion(c.Stdout, true)
			}
			return UsageErr(name, "unknown shell %q (bash, zsh or fish)", args[0])
		},
	}
}

// manCommand writes the man pages of every command into a directory; it is
// hidden (scripts/install.sh runs it), and built from the same definitions
// as --help.
func (c *CLI) manCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:    "man DIR",
		Short:  "write the man pages into DIR",
		Hidden: true,
		Args:   cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			name := c.Prog + " man"
			if len(args) != 1 {
				return UsageErr(name, "want exactly one DIR, got %d arguments", len(args))
			}
			if err := writeManPages(root, args[0], c.Now(), c.Version); err != nil {
				return RefusedErr(name, err)
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
