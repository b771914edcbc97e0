package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	units "github.com/docker/go-units"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/container/rules"
)

// sessionSubcommands names the subcommands in the errors of "enforcerd session".
const sessionSubcommands = "create, fork, exec, exec-status, logs, ls, inspect, update, rm, events, why or report"

func (c *CLI) sessionCommand(glob *GlobalOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session SUBCOMMAND [ARGS]",
		Short: "create, run in, list, inspect and remove sessions",
		Long:  "Manage sessions through the daemon's API socket.",
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := c.Prog + " session"
			switch {
			case len(args) == 0:
				return UsageErr(name, "missing subcommand (%s)", sessionSubcommands)
			case args[0] == "help":
				if err := cmd.Help(); err != nil {
					return err
				}
				return errHelpShown
			}
			return unknownCommand(cmd, name, "subcommand", args[0], sessionSubcommands)
		},
		SuggestionsMinimumDistance: 2,
	}
	cmd.AddCommand(
		c.sessionCreate(glob),
		c.sessionFork(glob),
		c.sessionExec(glob),
		c.sessionExecStatus(glob),
		c.sessionLogs(glob),
		c.sessionList(glob),
		c.sessionInspect(glob),
		c.sessionUpdate(glob),
		c.sessionRemove(glob),
		c.sessionEvents(glob),
		c.sessionWhy(glob),
		c.sessionReport(glob),
	)
	return cmd
}

// SocketPath resolves the client's socket: --socket, ENFORCERD_SOCKET, the
// default.
func (c *CLI) SocketPath(glob *GlobalOpts) string {
	switch {
	case glob.Socket != "":
		return glob.Socket
	case c.Getenv("ENFORCERD_SOCKET") != "":
		return c.Getenv("ENFORCERD_SOCKET")
	}
	return api.DefaultSocket
}

// completeSessions completes a session NAME from the daemon's list; it
// offers nothing when the daemon cannot be asked within a second.
func (c *CLI) completeSessions(glob *GlobalOpts, max int) cobra.CompletionFunc {
	return func(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if max > 0 && len(args) >= max {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		list, err := api.NewClient(c.SocketPath(glob)).List(ctx, "", "")
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		names := make([]cobra.Completion, 0, len(list))
		for _, s := range list {
			names = append(names, s.Name)
		}
		return names, cobra.ShellCompDirectiveNoFileComp
	}
}

// oneName checks that exactly one NAME was given.
func oneName(cmd string, pos []string) (string, error) {
	if len(pos) == 0 {
		return "", UsageErr(cmd, "missing session NAME")
	}
	if len(pos) > 1 {
		return "", UsageErr(cmd, "unexpected argument %q after NAME %q", pos[1], pos[0])
	}
	return pos[0], nil
}

// ---- create ---------------------------------------------------------------

const createLong = `Create a session: its own network namespace, address and egress policy, and
(with --image or --rootfs) a sandbox running in it. NAME is 1 to 32 of [a-z0-9-],
starting with a letter or digit. The policy can be changed later with "session update", unless --locked.
--for DURATION makes the --allow entries a grant with an end: after DURATION
they are revoked (established flows under them cut unless --keep-established),
even under --locked; inspect shows the deadline.

The sandbox's root user is root over its image: --image names an image of
the daemon's store ("enforcerd image import"); the daemon accepts a --rootfs
only inside its store or a directory the operator gave serve with --images-dir
(root-owned, writable by root only), never / itself. A sandbox gets 512 MiB
of memory, 1024 processes and one CPU unless told otherwise.

--vm makes a VM guest's session (no sandbox; every policy option applies):
in its netns a bridge joins eth0 to the tap --tap names (default tap0), which
forwards only the guest's MAC (--mac, default derived from NAME), and the
daemon's DHCP responder leases the guest its address, gateway and DNS. Run
the VMM in the netns and attach it to the tap; "session inspect" shows the
netns path, tap, MAC, address and the kernel's ip= argument (docs/vm-guests.md).`

// enumFlag is a string flag restricted to a fixed set of values.
type enumFlag struct {
	value   string
	allowed []string
}

func (e *enumFlag) Type() string   { return "MODE" }
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

// uidFlag is a uid: 0 to 4294967294.
type uidFlag int64

func (u *uidFlag) Type() string   { return "UID" }
func (u *uidFlag) String() string { return strconv.FormatInt(int64(*u), 10) }
func (u *uidFlag) Set(v string) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > 1<<32-2 {
		return errors.New("want a uid from 0 to 4294967294")
	}
	*u = uidFlag(n)
	return nil
}

// durationFlag is a positive Go duration; its error says what is accepted.
type durationFlag time.Duration

func (d *durationFlag) Type() string { return "DURATION" }

func (d *durationFlag) String() string {
	if d == nil || *d == 0 {
		return ""
	}
	return time.Duration(*d).String()
}

func (d *durationFlag) Set(v string) error {
	t, err := time.ParseDuration(v)
	if err != nil || t <= 0 {
		return errors.New("want a positive duration such as 30s")
	}
	*d = durationFlag(t)
	return nil
}

// cpusFlag is a number of CPUs such as 0.5 or 2: container's rule and
// text (CPUsWant). The upper bound is the daemon's machine's CPU count, so
// the daemon judges it; the text names this machine's, where the CLI runs.
type cpusFlag float64

func (c *cpusFlag) Type() string { return "N" }

func (c *cpusFlag) String() string {
	if c == nil || *c == 0 {
		return ""
	}
	return strconv.FormatFloat(float64(*c), 'g', -1, 64)
}

func (c *cpusFlag) Set(v string) error {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !rules.CPUsInRange(f, math.MaxInt32) {
		return errors.New(rules.CPUsWant(runtime.NumCPU()))
	}
	*c = cpusFlag(f)
	return nil
}

// atLeastFlag is a whole number of at least min (--generation, --pids); a
// value below it, or no number, is refused with want's text.
type atLeastFlag struct {
	n    int64
	min  int64
	want func() string
}

func (a *atLeastFlag) Type() string { return "N" }

func (a *atLeastFlag) String() string {
	if a == nil || a.n == 0 {
		return ""
	}
	return strconv.FormatInt(a.n, 10)
}

func (a *atLeastFlag) Set(v string) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < a.min {
		return errors.New(a.want())
	}
	a.n = n
	return nil
}

// sizeFlag is --memory: a byte size such as 512M or 2G (binary
// multiples), at least rules.MinMemoryBytes, with container's text
// (MemoryWant).
type sizeFlag struct{ bytes int64 }

func (s *sizeFlag) Type() string { return "SIZE" }

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
	if n < rules.MinMemoryBytes {
		return errors.New(rules.MemoryWant())
	}
	s.bytes = n
	return nil
}

// parseSize parses a whole byte count with an optional k, m, g, t
// or p suffix in binary multiples, as docker's --memory does ("512M",
// "512MiB", "512mb" and "524288k" are the same size). Fractions are refused:
// a size is a whole number of its unit.
func parseSize(v string) (int64, error) {
	bad := errors.New("want a size such as 512M, 2G or 1048576")
	if strings.Contains(v, ".") {
		return 0, bad
	}
	n, err := units.RAMInBytes(strings.TrimSpace(v))
	// Beyond 2^62 bytes the float inside RAMInBytes has overflowed.
	if err != nil || n < 0 || n > 1<<62 {
		return 0, bad
	}
	return n, nil
}

func (c *CLI) sessionCreate(glob *GlobalOpts) *cobra.Command {
	var (
		req          api.CreateRequest
		allow, scope []string
		labPeers     []string
		deny         []string
		onDeny       = enumFlag{allowed: []string{"reject", "reset", "drop"}}
		nameCheck    = enumFlag{allowed: []string{"tls", "off"}}
		quic         = enumFlag{allowed: []string{"refuse", "check"}}
		labels       kvFlag
		memory       sizeFlag
		cpus         cpusFlag
		pids         = atLeastFlag{min: rules.MinPidsMax, want: rules.PidsWant}
		asJSON       bool
		egress       = enumFlag{allowed: []string{"none", "allowlist", "public"}}
		tapOwner     uidFlag
	)
	cmd := &cobra.Command{
		Use:   "create NAME (--image IMAGE | --rootfs DIR | --network-only | --vm) [options]",
		Short: "create a session",
		Long:  createLong,
		Args:  cobra.ArbitraryArgs,
	}
	fs := cmd.Flags()
	fs.StringVar(&req.Rootfs, "rootfs", "", "run a sandbox from the root filesystem `DIR` (shared, never changed; must be inside the daemon's image store or an --images-dir)")
	fs.StringVar(&req.Image, "image", "", "run a sandbox from the daemon's image `IMAGE` (see \"enforcerd image ls\")")
	fs.BoolVar(&req.NetworkOnly, "network-only", false, "no sandbox: bring your own runtime and join the netns")
	fs.BoolVar(&req.VM, "vm", false, "a VM guest's session: a tap bridged to the session's veth, DHCP for the guest's MAC alone (no sandbox)")
	fs.StringVar(&req.Tap, "tap", "", "with --vm: the tap's `NAME` (default tap0)")
	fs.Var(&tapOwner, "tap-owner", "with --vm: the `UID` that may attach to the tap without CAP_NET_ADMIN (an unprivileged VMM; default: root only)")
	fs.StringVar(&req.MAC, "mac", "", "with --vm: the guest's `MAC` (default: derived from NAME, locally administered)")
	fs.BoolVar(&req.Writable, "writable", false, "give the sandbox a writable overlay instead of a read-only root with a tmpfs /tmp")
	fs.StringArrayVar(&allow, "allow", nil, "allow egress to `ENTRY` (name, *.wildcard, CIDR, optionally :PORT), repeatable")
	fs.StringArrayVar(&scope, "scope", nil, "allow the host of the scope `URL`, repeatable; a scope without a port allows every port but 53 and 853 (DNS and DoT go to the session's proxy; --allow HOST:53 opens them), and an IPv4-mapped IPv6 address is judged by its IPv4 address")
	fs.StringArrayVar(&deny, "deny", nil, "deny `ENTRY` (name, *.wildcard, address or CIDR, an address or CIDR optionally :PORT), winning over every allow in every mode, repeatable")
	fs.Var(&onDeny, "on-deny", "what the policy's drops get: `reject` (the default: ICMP administratively prohibited, a connect fails at once with \"No route to host\", a scanner says filtered), reset (a TCP reset for TCP: \"Connection refused\", a scanner says closed) or drop (silence: a client waits for its own timeout)")
	fs.Var(&nameCheck, "name-check", "check the name a TCP flow to a name-admitted address asks for: `tls` (the default: a TLS server_name or HTTP Host the policy does not allow on that port is refused before any byte leaves the host) or off (L3 only: any name on an allowed address)")
	fs.Var(&quic, "quic", "under --name-check tls, what UDP/443 to a name-admitted address gets: `refuse` (the default: refused as --on-deny says, so clients fall back to TCP) or check (its datagrams are held until the ClientHello in the QUIC Initial packets is read, and its server_name is checked as a TLS flow's)")
	fs.BoolVar(&req.Pin, "pin", false, "resolve every allowed host once now and pin its IPv4 addresses")
	fs.BoolVar(&req.Locked, "locked", false, "the policy never changes: every update is refused")
	fs.StringVar(&req.AllowFor, "for", "", "make this call's --allow entries a grant that ends after `DURATION` (90s, 10m, 2h): then they are revoked as an update's --revoke revokes them")
	fs.BoolVar(&req.KeepEstablished, "keep-established", false, "with --for: the grant's end leaves established flows alone (default: cut)")
	limits := newLimitFlags()
	limits.register(fs)
	fs.StringArrayVar(&req.InboundFromHost, "inbound-from-host", nil, "let the host (the daemon's netns: the node, e.g. a kubelet's probes) open connections to `PORT` (TCP and UDP) or PORT/tcp or PORT/udp in the session, repeatable (default: none, every connection from the host is dropped)")
	fs.Var(&egress, "egress", "egress `MODE`: none, allowlist or public (default: allowlist when something is allowed, else none)")
	fs.BoolVar(&req.Lab, "lab", false, "make the session a lab target (an address, no egress unless given more)")
	fs.StringArrayVar(&labPeers, "lab-peer", nil, "may connect to the lab target `NAME`, repeatable")
	fs.BoolVar(&req.NetRaw, "net-raw", false, "grant CAP_NET_RAW in the sandbox (scanners, ping)")
	fs.Var(&memory, "memory", "memory limit `SIZE` of the sandbox, e.g. 512M")
	fs.Var(&pids, "pids", "process limit `N` of the sandbox")
	fs.Var(&cpus, "cpus", "CPU limit `N` of the sandbox, like docker's: 1.5 is one and a half CPUs (default 1)")
	fs.Var(&labels, "label", "attach the label `KEY=VALUE`, repeatable")
	fs.BoolVar(&asJSON, "json", false, "print the session as JSON")
	_ = cmd.RegisterFlagCompletionFunc("egress", cobra.FixedCompletions(egress.allowed, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("on-deny", cobra.FixedCompletions(onDeny.allowed, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("name-check", cobra.FixedCompletions(nameCheck.allowed, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("quic", cobra.FixedCompletions(quic.allowed, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.MarkFlagDirname("rootfs")
	cmd.ValidArgsFunction = cobra.NoFileCompletions

	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		name := c.Prog + " session create"
		sessionName, err := oneName(name, args)
		if err != nil {
			return err
		}
		rootf := fs.Changed("rootfs")
		if fs.Changed("tap-owner") {
			uid := int(tapOwner)
			req.TapOwner = &uid
		}
		if req.VM {
			// The daemon implies network_only and refuses what a VM
			// session cannot have; the usage checks below see it as one.
			switch {
			case rootf || fs.Changed("image"):
				return UsageErr(name, "--vm and --rootfs or --image exclude each other: the VM is the guest")
			case req.NetworkOnly:
				return UsageErr(name, "--vm implies --network-only; leave one out")
			}
			req.NetworkOnly = true
		}
		if fs.Changed("image") {
			switch {
			case req.Image == "":
				return UsageErr(name, "invalid value \"\" for flag --image: want an image name (enforcerd image ls)")
			case rootf || req.NetworkOnly:
				return UsageErr(name, "--image %q, --rootfs and --network-only exclude each other", req.Image)
			}
		}
		// The first flag given that configures the sandbox, in the daemon's
		// order (a false --net-raw or --writable asks for nothing).
		var sandboxOnly string
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"memory", memory.bytes != 0}, {"pids", fs.Changed("pids")}, {"cpus", cpus != 0},
			{"net-raw", req.NetRaw}, {"writable", req.Writable},
		} {
			if f.set && sandboxOnly == "" {
				sandboxOnly = f.name
			}
		}
		switch {
		case rootf && req.NetworkOnly:
			return UsageErr(name, "--rootfs %q and --network-only exclude each other", req.Rootfs)
		case !rootf && !req.NetworkOnly && !fs.Changed("image"):
			return UsageErr(name, "missing --image IMAGE, --rootfs DIR, --network-only or --vm")
		case rootf && req.Rootfs == "":
			return UsageErr(name, "invalid value \"\" for flag --rootfs: want a directory")
		case req.NetworkOnly && sandboxOnly != "":
			return UsageErr(name, "--%s has no effect with --network-only: there is no sandbox; leave it out", sandboxOnly)
		}
		if req.Rootfs != "" {
			abs, err := filepath.Abs(req.Rootfs)
			if err != nil {
				return UsageErr(name, "--rootfs %q: %v", req.Rootfs, err)
			}
			req.Rootfs = abs // the daemon has its own working directory
		}
		req.Name = sessionName
		req.Allow = allow
		if req.Connections, req.Budget, req.EgressBudget, err = limits.values(); err != nil {
			return UsageErr(name, "%v", err)
		}
		req.Scope = scope
		req.LabPeers = labPeers
		req.Deny = deny
		req.OnDeny = onDeny.value
		req.NameCheck = nameCheck.value
		req.QUIC = quic.value
		req.Egress = egress.value
		req.MemoryBytes = memory.bytes
		req.Pids = pids.n
		req.CPUs = float64(cpus)
		req.Labels = labels.values

		ctx, cancel := signalContext()
		defer cancel()
		info, err := api.NewClient(c.SocketPath(glob)).Create(ctx, req)
		if err != nil {
			return RefusedErr(name, err)
		}
		if asJSON {
			return WriteJSON(c.Stdout, info)
		}
		fmt.Fprintf(c.Stdout, "created %s: netns %s, guest %s, gateway %s, egress %s, sandbox %s\n",
			info.Name, info.Netns, orDash(info.GuestIP), orDash(info.GatewayIP), info.Egress, yesNo(info.Sandbox))
		if vm := info.VM; vm != nil {
			fmt.Fprintf(c.Stdout, "vm: netns path %s, tap %s, mac %s, address %s, gateway %s, dns %s, boot argument %s\n",
				vm.NetnsPath, vm.Tap, vm.MAC, vm.Address, vm.Gateway, vm.DNS, vm.KernelIPArg)
		}
		return nil
	}
	return cmd
}

// ---- fork -----------------------------------------------------------------

const forkLong = `Create NEW as a fork of SRC: SRC's policy as it is now (egress, allow, scope,
deny, on-deny, lab peers, pin, lock, inbound ports), its labels and its kind
(sandbox image, network-only or VM, with its tap), with a slot, netns, address,
tap and MAC of its own and none of SRC's attested addresses or flows. For a VM
session, --mac gives the fork a MAC (SRC's, to resume a snapshot of SRC's guest:
asking DHCP for SRC's address, it is NAK'd and leases NEW's; until then its
packets from the old address are dropped as spoofed). Without --mac the MAC is
derived from NEW.`

func (c *CLI) sessionFork(glob *GlobalOpts) *cobra.Command {
	var (
		req      api.CreateRequest
		tapOwner uidFlag
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:               "fork SRC NEW [--mac MAC] [--tap NAME] [--tap-owner UID]",
		Short:             "create a session with another's policy",
		Long:              forkLong,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: c.completeSessions(glob, 1),
	}
	fs := cmd.Flags()
	fs.StringVar(&req.MAC, "mac", "", "the VM guest's `MAC` (default: derived from NEW)")
	fs.StringVar(&req.Tap, "tap", "", "the tap's `NAME` (default: SRC's)")
	fs.Var(&tapOwner, "tap-owner", "the `UID` that may attach to the tap (default: SRC's)")
	fs.BoolVar(&asJSON, "json", false, "print the new session as JSON")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " session fork"
		switch {
		case len(args) < 2:
			return UsageErr(name, "want SRC and NEW, got %d arguments", len(args))
		case len(args) > 2:
			return UsageErr(name, "unexpected argument %q after SRC %q and NEW %q", args[2], args[0], args[1])
		}
		req.ForkOf, req.Name = args[0], args[1]
		if fs.Changed("tap-owner") {
			uid := int(tapOwner)
			req.TapOwner = &uid
		}
		ctx, cancel := signalContext()
		defer cancel()
		info, err := api.NewClient(c.SocketPath(glob)).Create(ctx, req)
		if err != nil {
			return RefusedErr(name, err)
		}
		if asJSON {
			return WriteJSON(c.Stdout, info)
		}
		fmt.Fprintf(c.Stdout, "forked %s from %s: netns %s, guest %s, gateway %s, egress %s, sandbox %s\n",
			info.Name, req.ForkOf, info.Netns, orDash(info.GuestIP), orDash(info.GatewayIP), info.Egress, yesNo(info.Sandbox))
		if vm := info.VM; vm != nil {
			fmt.Fprintf(c.Stdout, "vm: netns path %s, tap %s, mac %s, address %s, gateway %s, dns %s, boot argument %s\n",
				vm.NetnsPath, vm.Tap, vm.MAC, vm.Address, vm.Gateway, vm.DNS, vm.KernelIPArg)
		}
		return nil
	}
	return cmd
}

// ---- exec -----------------------------------------------------------------

const execLong = `Run a command in the session's sandbox, streaming its output. Options go
before the command: the command starts after "--", or at the first argument
after NAME that is not an option. The exit status is the command's, 124 when
it timed out, 125 when enforcerd itself failed (including an unknown session
or one without a sandbox), 127 when the command is not found and 126 when it
cannot be run (not executable, a directory, or the sandbox's pids limit
reached).

The command runs in a holder process of its own: it keeps running when the
daemon restarts or is killed, and this program reconnects (for up to 60 s)
and resumes the output where it stopped, so the output and the exit status
are those of an uninterrupted run. Interrupting this program (Ctrl-C) kills
the command. --detach prints the exec's ID and returns at once; --attach ID
follows an exec's output from its start and exits with its status
(interrupting it leaves the command running); see also "session logs" and
"session exec-status". --stdin is sent when the command starts only.
--detach --json prints the exec as "session exec-status" does.`

// maxExecStdin bounds --stdin: the request body is limited to 1 MiB.
const maxExecStdin = 512 << 10

func (c *CLI) sessionExec(glob *GlobalOpts) *cobra.Command {
	var (
		req       api.ExecRequest
		env       kvFlag
		timeout   durationFlag
		withStdin bool
		detach    bool
		asJSON    bool
		attach    string
	)
	cmd := &cobra.Command{
		Use:               "exec NAME [options] -- CMD [ARG]... | exec NAME --attach ID",
		Short:             "run a command in a session's sandbox",
		Long:              execLong,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: c.completeSessions(glob, 1),
	}
	fs := cmd.Flags()
	fs.Var(&timeout, "timeout", "kill the command's process group after `DURATION` (exit 124)")
	fs.Var(&env, "env", "set the environment variable `KEY=VALUE`, repeatable")
	fs.StringVar(&req.Dir, "workdir", "", "run in the directory `DIR` of the sandbox")
	fs.StringVar(&req.User, "user", "", "run as `UID[:GID]` (numbers; the gid defaults to the uid; default 0:0): names are not looked up")
	fs.BoolVar(&withStdin, "stdin", false, "send this program's standard input (at most 512 KiB) to the command")
	fs.BoolVar(&detach, "detach", false, "start the command, print its exec ID and return")
	fs.StringVar(&attach, "attach", "", "follow the output of the exec `ID` and exit with its status")
	fs.BoolVar(&asJSON, "json", false, "with --detach: print the exec (ID, args, state, start) as JSON")
	// Parsing stops at NAME; RunE parses the options after it up to the
	// command, so that the command's own options stay its own.
	fs.SetInterspersed(false)

	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		name := c.Prog + " session exec"
		if len(args) == 0 {
			return UsageErr(name, "missing session NAME")
		}
		sessionName := args[0]
		if err := fs.Parse(args[1:]); err != nil {
			return cmd.FlagErrorFunc()(cmd, err)
		}
		if help, _ := fs.GetBool("help"); help {
			if err := cmd.Help(); err != nil {
				return err
			}
			return errHelpShown
		}
		command := fs.Args()
		if asJSON && !detach {
			return UsageErr(name, "--json prints the exec that --detach started; without --detach the output is the command's own")
		}
		if attach != "" {
			if len(command) > 0 || detach {
				return UsageErr(name, "--attach %s: want no command and no --detach (it follows an exec already started)", attach)
			}
			return c.attachExec(glob, name, sessionName, attach)
		}
		if len(command) == 0 {
			return UsageErr(name, "missing command after NAME %q (enforcerd session exec NAME -- CMD [ARG]...)", sessionName)
		}
		if timeout > 0 {
			req.Timeout = time.Duration(timeout).String()
		}
		req.Args = command
		req.Env = env.pairs()
		if withStdin {
			data, err := io.ReadAll(io.LimitReader(c.Stdin, maxExecStdin+1))
			if err != nil {
				return &exitError{code: api.ExitEnforcerd, msg: name + ": read stdin: " + err.Error()}
			}
			if len(data) > maxExecStdin {
				return UsageErr(name, "--stdin: input larger than %d bytes", maxExecStdin)
			}
			req.Stdin = data
		}

		ctx, cancel := signalContext()
		defer cancel()
		client := api.NewClient(c.SocketPath(glob))
		if detach {
			info, err := client.ExecDetach(ctx, sessionName, req)
			if err != nil {
				return &exitError{code: api.ExitEnforcerd, msg: name + ": " + err.Error()}
			}
			if asJSON {
				return WriteJSON(c.Stdout, info)
			}
			fmt.Fprintln(c.Stdout, info.ID)
			return nil
		}
		var id string
		code, err := client.ExecWith(ctx, sessionName, req, c.Stdout, c.Stderr, api.ExecOptions{Started: func(s string) { id = s }})
		if err != nil && ctx.Err() != nil && id != "" {
			// Interrupted: the command would run on without this program.
			kctx, kcancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, _ = client.KillExec(kctx, sessionName, id)
			kcancel()
		}
		return execResult(name, ctx, code, err)
	}
	return cmd
}

// ---- ls -------------------------------------------------------------------

func (c *CLI) sessionList(glob *GlobalOpts) *cobra.Command {
	var (
		asJSON bool
		label  = kvFlag{single: true}
	)
	cmd := &cobra.Command{
		Use:               "ls [--json] [--label KEY=VALUE]",
		Short:             "list sessions",
		Long:              "List the sessions, optionally only those with a label.",
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	cmd.Flags().Var(&label, "label", "only sessions with the label `KEY=VALUE`")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " session ls"
		if err := NoArgs(name, "filter with --label KEY=VALUE", args); err != nil {
			return err
		}
		key, value, _ := label.first()
		ctx, cancel := signalContext()
		defer cancel()
		list, err := api.NewClient(c.SocketPath(glob)).List(ctx, key, value)
		if err != nil {
			return RefusedErr(name, err)
		}
		if list == nil {
			list = []api.SessionInfo{}
		}
		if asJSON {
			return WriteJSON(c.Stdout, list)
		}
		tw := tabwriter.NewWriter(c.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tEGRESS\tGUEST IP\tSANDBOX\tATTESTED\tDROPPED\tLABELS\tAGE")
		for _, s := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", s.Name, s.Egress, orDash(s.GuestIP),
				yesNo(s.Sandbox), len(s.Attested), s.Counters.DroppedPackets, orDash(labelsCell(s.Labels)),
				age(c.Now(), s.Created))
		}
		return tw.Flush()
	}
	return cmd
}

// labelsCellWidth bounds the LABELS column of session ls, in characters.
const labelsCellWidth = 40

// attachmentLabels are the labels the daemon puts on an attached (CNI)
// session: they repeat its container_id, netns_path and ifname, and a
// container ID alone is 64 characters. The table leaves them out; --json
// and inspect show every label.
var attachmentLabels = map[string]bool{api.LabelContainerID: true, api.LabelNetns: true, api.LabelIfName: true}

// labelsCell is a session's labels as the ls table shows them: KEY=VALUE
// in key order without the attachment labels, as many as fit in
// labelsCellWidth characters, then ",+N" for the N left out; a first
// label too long to fit alone is cut with an ellipsis.
func labelsCell(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		if !attachmentLabels[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		pair := k + "=" + labels[k]
		more := ""
		if rest := len(keys) - i - 1; rest > 0 {
			more = fmt.Sprintf(",+%d", rest) // (what must still fit if this is the last shown)
		}
		sep := ""
		if b.Len() > 0 {
			sep = ","
		}
		switch {
		case utf8.RuneCountInString(b.String()+sep+pair+more) <= labelsCellWidth:
			b.WriteString(sep + pair)
		case b.Len() == 0:
			// (not even the first fits: cut it, leaving room for the count)
			room := labelsCellWidth - len(fmt.Sprintf(",+%d", len(keys)-1)) - 1
			if len(keys) == 1 {
				room = labelsCellWidth - 1
			}
			r := []rune(pair)
			b.WriteString(string(r[:min(len(r), room)]) + "…")
			if len(keys) > 1 {
				fmt.Fprintf(&b, ",+%d", len(keys)-1)
			}
			return b.String()
		default:
			fmt.Fprintf(&b, ",+%d", len(keys)-i)
			return b.String()
		}
	}
	return b.String()
}

// ---- inspect --------------------------------------------------------------

func (c *CLI) sessionInspect(glob *GlobalOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect NAME",
		Short: "show one session as JSON",
		Long: `Print one session as JSON: addresses, policy, attested addresses, counters,
labels. The output is always JSON; --json is accepted as on the other commands.`,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: c.completeSessions(glob, 1),
	}
	cmd.Flags().Bool("json", false, "print JSON (the only format of inspect; accepted for symmetry)")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " session inspect"
		sessionName, err := oneName(name, args)
		if err != nil {
			return err
		}
		ctx, cancel := signalContext()
		defer cancel()
		info, err := api.NewClient(c.SocketPath(glob)).Inspect(ctx, sessionName)
		if err != nil {
			return RefusedErr(name, err)
		}
		return WriteJSON(c.Stdout, info)
	}
	return cmd
}

// ---- rm -------------------------------------------------------------------

const removeLong = `Remove sessions by name, or every session with a label. Each removed name is
printed (with --json, one object {"deleted": [NAME...]}). An unknown NAME is
reported (exit status 1); the others are still removed.`

func (c *CLI) sessionRemove(glob *GlobalOpts) *cobra.Command {
	var (
		asJSON bool
		label  = kvFlag{single: true}
	)
	cmd := &cobra.Command{
		Use:               "rm NAME... | --label KEY=VALUE",
		Short:             "remove sessions by name or label",
		Long:              removeLong,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: c.completeSessions(glob, 0),
	}
	cmd.Flags().Var(&label, "label", "remove every session with the label `KEY=VALUE`")
	cmd.Flags().BoolVar(&asJSON, "json", false, `print the removed names as JSON: {"deleted": [...]}`)
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " session rm"
		key, value, byLabel := label.first()
		switch {
		case byLabel && len(args) > 0:
			return UsageErr(name, "NAME %q and --label exclude each other", args[0])
		case !byLabel && len(args) == 0:
			return UsageErr(name, "missing session NAME or --label KEY=VALUE")
		}
		ctx, cancel := signalContext()
		defer cancel()
		cl := api.NewClient(c.SocketPath(glob))
		deleted := []string{}
		// removed records a removed name and prints it at once, or (with
		// --json) all of them at the end.
		removed := func(n string) {
			deleted = append(deleted, n)
			if !asJSON {
				fmt.Fprintln(c.Stdout, n)
			}
		}
		var failure error
		if byLabel {
			names, err := cl.RemoveByLabel(ctx, key, value)
			for _, n := range names {
				removed(n)
			}
			if err != nil {
				failure = RefusedErr(name, err)
			}
		} else {
			failed := 0
			for _, n := range args {
				if err := cl.Remove(ctx, n); err != nil {
					failed++
					fmt.Fprintln(c.Stderr, api.OneLine(name+": "+err.Error()))
					var ae *api.Error
					if !errors.As(err, &ae) {
						break // the daemon is unreachable: no point trying the rest
					}
					continue
				}
				removed(n)
			}
			if failed > 0 {
				failure = &exitError{code: ExitRefused} // each failure is already printed
			}
		}
		if asJSON {
			if err := WriteJSON(c.Stdout, api.DeleteResponse{Deleted: deleted}); err != nil {
				return err
			}
		}
		return failure
	}
	return cmd
}

// ---- events ---------------------------------------------------------------

const eventsLong = `Print the session's recorded events (lifecycle: every API call with its caller,
kept for the session's life; dns and flow: a sample of what the guest did,
at most 50 lines a second after a burst of 500) as NDJSON, oldest first,
ending with one "summary" "counts" line: every DNS decision and dropped flow
counted since the session's creation, exactly, and how many lines the sample
left out ("unlogged"). With --follow keep printing new ones until the session
is removed or the command is interrupted. --follow exits 1 when the daemon
stops or dies. A removed session's events stay readable for the daemon's
--events-retention.`

func (c *CLI) sessionEvents(glob *GlobalOpts) *cobra.Command {
	var (
		follow bool
		since  sinceFlag
	)
	cmd := &cobra.Command{
		Use:               "events NAME [--follow] [--since TIME]",
		Short:             "print a session's events (NDJSON)",
		Long:              eventsLong,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: c.completeSessions(glob, 1),
	}
	cmd.Flags().BoolVar(&follow, "follow", false, "keep printing new events")
	cmd.Flags().Var(&since, "since", "only events at or after `TIME` (RFC 3339, or a duration before now such as 10m)")
	cmd.Flags().Bool("json", false, "print NDJSON (the only format of events; accepted for symmetry)")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " session events"
		sessionName, err := oneName(name, args)
		if err != nil {
			return err
		}
		return sessionEventsRun(c, glob, name, sessionName, follow, &since)
	}
	return cmd
}

// The flag types are pflag values.
var (
	_ pflag.Value = (*kvFlag)(nil)
	_ pflag.Value = (*enumFlag)(nil)
	_ pflag.Value = (*durationFlag)(nil)
	_ pflag.Value = (*cpusFlag)(nil)
	_ pflag.Value = (*atLeastFlag)(nil)
	_ pflag.Value = (*sizeFlag)(nil)
)

// ---- output helpers -------------------------------------------------------

func WriteJSON(w io.Writer, v any) error {
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
