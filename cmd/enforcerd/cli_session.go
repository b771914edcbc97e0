package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

const sessionUsage = `usage: enforcerd session SUBCOMMAND [ARGS]

subcommands:
  create NAME (--rootfs DIR | --network-only) [options]
  exec NAME [--timeout DURATION] [--env KEY=VALUE]... [--workdir DIR] -- CMD [ARG]...
  ls [--json] [--label KEY=VALUE]
  inspect NAME
  rm NAME... | --label KEY=VALUE
  events NAME [--follow]

Run 'enforcerd session SUBCOMMAND --help' for its options.
`

func (c *cli) cmdSession(glob globalOpts, args []string) error {
	if len(args) == 0 {
		return usageErr("enforcerd session", "missing subcommand (create, exec, ls, inspect, rm or events)")
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "create":
		return c.sessionCreate(glob, rest)
	case "exec":
		return c.sessionExec(glob, rest)
	case "ls":
		return c.sessionList(glob, rest)
	case "inspect":
		return c.sessionInspect(glob, rest)
	case "rm":
		return c.sessionRemove(glob, rest)
	case "events":
		return c.sessionEvents(glob, rest)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(c.stdout, sessionUsage)
		return errHelpShown
	}
	if strings.HasPrefix(sub, "-") {
		return usageErr("enforcerd session", "flag %s before the subcommand (flags go after it)", sub)
	}
	return usageErr("enforcerd session", "unknown subcommand %q (create, exec, ls, inspect, rm or events)", sub)
}

// sessionFlags starts a session subcommand's flag set with --socket.
func sessionFlags(name string) (*flag.FlagSet, *string) {
	fs := newFlagSet(name)
	sock := fs.String("socket", "", "the daemon's socket `PATH` (env ENFORCERD_SOCKET; default "+api.DefaultSocket+")")
	return fs, sock
}

// socketPath resolves the client's socket: the subcommand's --socket, the
// global --socket, ENFORCERD_SOCKET, the default.
func (c *cli) socketPath(glob globalOpts, local string) string {
	switch {
	case local != "":
		return local
	case glob.socket != "":
		return glob.socket
	case c.getenv("ENFORCERD_SOCKET") != "":
		return c.getenv("ENFORCERD_SOCKET")
	}
	return api.DefaultSocket
}

// oneName checks that exactly one NAME was given.
func oneName(cmd string, pos []string) (string, error) {
	if len(pos) == 0 {
		return "", usageErr(cmd, "missing session NAME")
	}
	if len(pos) > 1 {
		return "", usageErr(cmd, "unexpected argument %q after NAME %q", pos[1], pos[0])
	}
	return pos[0], nil
}

// ---- create ---------------------------------------------------------------

const createUsage = `usage: enforcerd session create NAME (--rootfs DIR | --network-only) [options]

Create a session: its own network namespace, address and egress policy, and
(with --rootfs) a sandbox running in it. NAME is 1 to 32 of [a-z0-9-],
starting with a letter or digit. The policy is fixed at create.

The sandbox's root user is root over its image: the daemon accepts a
--rootfs only inside a directory the operator gave serve with --images-dir
(root-owned, writable by root only), never / itself. A sandbox gets 512 MiB
of memory, 1024 processes and one CPU unless told otherwise.
`

// enumFlag is a string flag restricted to a fixed set of values.
type enumFlag struct {
	value   string
	allowed []string
}

func (e *enumFlag) String() string { return e.value }
func (e *enumFlag) Set(v string) error {
	for _, a := range e.allowed {
		if v == a {
			e.value = v
			return nil
		}
	}
	return fmt.Errorf("want %s", strings.Join(e.allowed, ", "))
}

// sizeFlag is a byte size such as 512M or 2G (binary multiples).
// durationFlag is a positive Go duration; its error says what is accepted.
type durationFlag time.Duration

func (d *durationFlag) String() string { return time.Duration(*d).String() }

func (d *durationFlag) Set(v string) error {
	t, err := time.ParseDuration(v)
	if err != nil || t <= 0 {
		return errors.New("want a positive duration such as 30s")
	}
	*d = durationFlag(t)
	return nil
}

// cpusFlag is a positive, finite number of CPUs such as 0.5 or 2 (the
// daemon checks it against its machine's CPU count).
type cpusFlag float64

func (c *cpusFlag) String() string {
	if c == nil || *c == 0 {
		return ""
	}
	return strconv.FormatFloat(float64(*c), 'g', -1, 64)
}

func (c *cpusFlag) Set(v string) error {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
		return errors.New("want a positive number of CPUs such as 0.5 or 2")
	}
	*c = cpusFlag(f)
	return nil
}

type sizeFlag struct{ bytes int64 }

func (s *sizeFlag) String() string {
	if s == nil || s.bytes == 0 {
		return ""
	}
	return strconv.FormatInt(s.bytes, 10)
}

func (s *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	s.bytes = n
	return nil
}

// parseSize parses a positive byte count with an optional K, M, G or T
// suffix (binary multiples; "KiB", "KB", "k" are all 1024).
func parseSize(v string) (int64, error) {
	bad := errors.New("want a positive size such as 512M, 2G or 1048576")
	s := strings.ToLower(strings.TrimSpace(v))
	s = strings.TrimSuffix(s, "b")
	s = strings.TrimSuffix(s, "i")
	mult := int64(1)
	if s != "" {
		switch s[len(s)-1] {
		case 'k':
			mult = 1 << 10
		case 'm':
			mult = 1 << 20
		case 'g':
			mult = 1 << 30
		case 't':
			mult = 1 << 40
		}
		if mult != 1 {
			s = s[:len(s)-1]
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, bad
	}
	return n * mult, nil
}

func (c *cli) sessionCreate(glob globalOpts, args []string) error {
	const cmd = "enforcerd session create"
	fs, sock := sessionFlags("session create")
	var (
		req            api.CreateRequest
		allow, scope   listFlag
		labPeers       listFlag
		labels         kvFlag
		memory         sizeFlag
		cpus           cpusFlag
		asJSON         bool
		egress         = enumFlag{allowed: []string{"none", "allowlist", "public"}}
		pidsSet, rootf bool
	)
	fs.StringVar(&req.Rootfs, "rootfs", "", "run a sandbox from the root filesystem `DIR` (shared, never changed; must be inside the daemon's --images-dir)")
	fs.BoolVar(&req.NetworkOnly, "network-only", false, "no sandbox: bring your own runtime and join the netns")
	fs.BoolVar(&req.Writable, "writable", false, "give the sandbox a writable overlay instead of a read-only root with a tmpfs /tmp")
	fs.Var(&allow, "allow", "allow egress to `ENTRY` (name, *.wildcard, CIDR, optionally :PORT), repeatable")
	fs.Var(&scope, "scope", "allow the host of the scope `URL`, repeatable; a scope without a port allows every port (a browser would use only the scheme's default), and an IPv4-mapped IPv6 address is judged by its IPv4 address")
	fs.BoolVar(&req.Pin, "pin", false, "resolve every allowed host once now and pin its IPv4 addresses")
	fs.Var(&egress, "egress", "egress `MODE`: none, allowlist or public (default: allowlist when something is allowed, else none)")
	fs.BoolVar(&req.Lab, "lab", false, "make the session a lab target (an address, no egress unless given more)")
	fs.Var(&labPeers, "lab-peer", "may connect to the lab target `NAME`, repeatable")
	fs.BoolVar(&req.NetRaw, "net-raw", false, "grant CAP_NET_RAW in the sandbox (scanners, ping)")
	fs.Var(&memory, "memory", "memory limit `SIZE` of the sandbox, e.g. 512M")
	fs.Int64Var(&req.Pids, "pids", 0, "process limit `N` of the sandbox")
	fs.Var(&cpus, "cpus", "CPU limit `N` of the sandbox, like docker's: 1.5 is one and a half CPUs (default 1)")
	fs.Var(&labels, "label", "attach the label `KEY=VALUE`, repeatable")
	fs.BoolVar(&asJSON, "json", false, "print the session as JSON")
	pos, _, err := c.parse(fs, cmd, createUsage, args, 0)
	if err != nil {
		return err
	}
	name, err := oneName(cmd, pos)
	if err != nil {
		return err
	}
	fs.Visit(func(f *flag.Flag) {
		pidsSet = pidsSet || f.Name == "pids"
		rootf = rootf || f.Name == "rootfs"
	})
	// The first flag given that configures the sandbox, in the daemon's
	// order (a false --net-raw or --writable asks for nothing).
	var sandboxOnly string
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"memory", memory.bytes != 0}, {"pids", pidsSet}, {"cpus", cpus != 0},
		{"net-raw", req.NetRaw}, {"writable", req.Writable},
	} {
		if f.set && sandboxOnly == "" {
			sandboxOnly = f.name
		}
	}
	if pidsSet && req.Pids <= 0 {
		return usageErr(cmd, "invalid value \"%d\" for flag -pids: want a positive number", req.Pids)
	}
	switch {
	case rootf && req.NetworkOnly:
		return usageErr(cmd, "--rootfs %q and --network-only exclude each other", req.Rootfs)
	case !rootf && !req.NetworkOnly:
		return usageErr(cmd, "missing --rootfs DIR or --network-only")
	case rootf && req.Rootfs == "":
		return usageErr(cmd, "invalid value \"\" for flag -rootfs: want a directory")
	case req.NetworkOnly && sandboxOnly != "":
		return usageErr(cmd, "--%s has no effect with --network-only: there is no sandbox; leave it out", sandboxOnly)
	}
	if req.Rootfs != "" {
		abs, err := filepath.Abs(req.Rootfs)
		if err != nil {
			return usageErr(cmd, "--rootfs %q: %v", req.Rootfs, err)
		}
		req.Rootfs = abs // the daemon has its own working directory
	}
	req.Name = name
	req.Allow = allow.values
	req.Scope = scope.values
	req.LabPeers = labPeers.values
	req.Egress = egress.value
	req.MemoryBytes = memory.bytes
	req.CPUs = float64(cpus)
	req.Labels = labels.values

	ctx, cancel := signalContext()
	defer cancel()
	info, err := api.NewClient(c.socketPath(glob, *sock)).Create(ctx, req)
	if err != nil {
		return refusedErr(cmd, err)
	}
	if asJSON {
		return writeJSON(c.stdout, info)
	}
	fmt.Fprintf(c.stdout, "created %s: netns %s, guest %s, gateway %s, egress %s, sandbox %s\n",
		info.Name, info.Netns, orDash(info.GuestIP), orDash(info.GatewayIP), info.Egress, yesNo(info.Sandbox))
	return nil
}

// ---- exec -----------------------------------------------------------------

const execUsage = `usage: enforcerd session exec NAME [options] -- CMD [ARG]...

Run a command in the session's sandbox, streaming its output. The exit status
is the command's, 124 when it timed out, 125 when enforcerd itself failed
(including an unknown session or one without a sandbox), 127 when the command
is not found and 126 when it cannot be run (not executable, a directory, or
the sandbox's pids limit reached).
`

// maxExecStdin bounds --stdin: the request body is limited to 1 MiB.
const maxExecStdin = 512 << 10

func (c *cli) sessionExec(glob globalOpts, args []string) error {
	const cmd = "enforcerd session exec"
	fs, sock := sessionFlags("session exec")
	var (
		req       api.ExecRequest
		env       kvFlag
		timeout   durationFlag
		withStdin bool
	)
	fs.Var(&timeout, "timeout", "kill the command's process group after `DURATION` (exit 124)")
	fs.Var(&env, "env", "set the environment variable `KEY=VALUE`, repeatable")
	fs.StringVar(&req.Dir, "workdir", "", "run in the directory `DIR` of the sandbox")
	fs.StringVar(&req.User, "user", "", "run as `USER` (name or uid[:gid]) of the sandbox")
	fs.BoolVar(&withStdin, "stdin", false, "send this program's standard input (at most 512 KiB) to the command")
	pos, rest, err := c.parse(fs, cmd, execUsage, args, 1)
	if err != nil {
		return err
	}
	name, err := oneName(cmd, pos)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return usageErr(cmd, "missing command after NAME %q (enforcerd session exec NAME -- CMD [ARG]...)", name)
	}
	if timeout > 0 {
		req.Timeout = time.Duration(timeout).String()
	}
	req.Args = rest
	req.Env = env.pairs()
	if withStdin {
		data, err := io.ReadAll(io.LimitReader(c.stdin, maxExecStdin+1))
		if err != nil {
			return &exitError{code: api.ExitEnforcerd, msg: cmd + ": read stdin: " + err.Error()}
		}
		if len(data) > maxExecStdin {
			return usageErr(cmd, "--stdin: input larger than %d bytes", maxExecStdin)
		}
		req.Stdin = data
	}

	ctx, cancel := signalContext()
	defer cancel()
	code, err := api.NewClient(c.socketPath(glob, *sock)).Exec(ctx, name, req, c.stdout, c.stderr)
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: exitInterrupt, msg: cmd + ": interrupted"}
		}
		var fe *api.ExecError
		if errors.As(err, &fe) && fe.Exit != 0 {
			return &exitError{code: fe.Exit, msg: cmd + ": " + fe.Message}
		}
		return &exitError{code: api.ExitEnforcerd, msg: cmd + ": " + err.Error()}
	}
	if code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// ---- ls -------------------------------------------------------------------

const listUsage = `usage: enforcerd session ls [--json] [--label KEY=VALUE]

List the sessions, optionally only those with a label.
`

func (c *cli) sessionList(glob globalOpts, args []string) error {
	const cmd = "enforcerd session ls"
	fs, sock := sessionFlags("session ls")
	var (
		asJSON bool
		label  = kvFlag{single: true}
	)
	fs.BoolVar(&asJSON, "json", false, "print a JSON array")
	fs.Var(&label, "label", "only sessions with the label `KEY=VALUE`")
	pos, _, err := c.parse(fs, cmd, listUsage, args, 0)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageErr(cmd, "unexpected argument %q (filter with --label KEY=VALUE)", pos[0])
	}
	key, value, _ := label.first()
	ctx, cancel := signalContext()
	defer cancel()
	list, err := api.NewClient(c.socketPath(glob, *sock)).List(ctx, key, value)
	if err != nil {
		return refusedErr(cmd, err)
	}
	if list == nil {
		list = []api.SessionInfo{}
	}
	if asJSON {
		return writeJSON(c.stdout, list)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tEGRESS\tGUEST IP\tSANDBOX\tATTESTED\tDROPPED\tLABELS\tAGE")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", s.Name, s.Egress, orDash(s.GuestIP),
			yesNo(s.Sandbox), len(s.Attested), s.Counters.DroppedPackets, orDash(sortedKV(s.Labels)),
			age(c.now(), s.Created))
	}
	return tw.Flush()
}

// ---- inspect --------------------------------------------------------------

const inspectUsage = `usage: enforcerd session inspect NAME

Print one session as JSON: addresses, policy, attested addresses, counters,
labels.
`

func (c *cli) sessionInspect(glob globalOpts, args []string) error {
	const cmd = "enforcerd session inspect"
	fs, sock := sessionFlags("session inspect")
	pos, _, err := c.parse(fs, cmd, inspectUsage, args, 0)
	if err != nil {
		return err
	}
	name, err := oneName(cmd, pos)
	if err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	info, err := api.NewClient(c.socketPath(glob, *sock)).Inspect(ctx, name)
	if err != nil {
		return refusedErr(cmd, err)
	}
	return writeJSON(c.stdout, info)
}

// ---- rm -------------------------------------------------------------------

const removeUsage = `usage: enforcerd session rm NAME... | --label KEY=VALUE

Remove sessions by name, or every session with a label. Each removed name is
printed. An unknown NAME is reported (exit status 1); the others are still
removed.
`

func (c *cli) sessionRemove(glob globalOpts, args []string) error {
	const cmd = "enforcerd session rm"
	fs, sock := sessionFlags("session rm")
	label := kvFlag{single: true}
	fs.Var(&label, "label", "remove every session with the label `KEY=VALUE`")
	pos, _, err := c.parse(fs, cmd, removeUsage, args, 0)
	if err != nil {
		return err
	}
	key, value, byLabel := label.first()
	switch {
	case byLabel && len(pos) > 0:
		return usageErr(cmd, "NAME %q and --label exclude each other", pos[0])
	case !byLabel && len(pos) == 0:
		return usageErr(cmd, "missing session NAME or --label KEY=VALUE")
	}
	ctx, cancel := signalContext()
	defer cancel()
	cl := api.NewClient(c.socketPath(glob, *sock))
	if byLabel {
		names, err := cl.RemoveByLabel(ctx, key, value)
		for _, n := range names {
			fmt.Fprintln(c.stdout, n)
		}
		if err != nil {
			return refusedErr(cmd, err)
		}
		return nil
	}
	failed := 0
	for _, name := range pos {
		if err := cl.Remove(ctx, name); err != nil {
			failed++
			fmt.Fprintln(c.stderr, api.OneLine(cmd+": "+err.Error()))
			var ae *api.Error
			if !errors.As(err, &ae) {
				break // the daemon is unreachable: no point trying the rest
			}
			continue
		}
		fmt.Fprintln(c.stdout, name)
	}
	if failed > 0 {
		return &exitError{code: exitRefused} // each failure is already printed
	}
	return nil
}

// ---- events ---------------------------------------------------------------

const eventsUsage = `usage: enforcerd session events NAME [--follow]

Print the session's recorded events (DNS decisions and lifecycle) as NDJSON;
with --follow keep printing new ones until the session is removed or the
command is interrupted.
`

func (c *cli) sessionEvents(glob globalOpts, args []string) error {
	const cmd = "enforcerd session events"
	fs, sock := sessionFlags("session events")
	var follow bool
	fs.BoolVar(&follow, "follow", false, "keep printing new events")
	pos, _, err := c.parse(fs, cmd, eventsUsage, args, 0)
	if err != nil {
		return err
	}
	name, err := oneName(cmd, pos)
	if err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	err = api.NewClient(c.socketPath(glob, *sock)).EventsTo(ctx, name, follow, c.stdout)
	if err != nil && ctx.Err() == nil {
		return refusedErr(cmd, err)
	}
	return nil
}

// ---- output helpers -------------------------------------------------------

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// age renders how long ago t was, coarsely (45s, 12m, 3h, 5d).
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
