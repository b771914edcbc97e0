package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/enforcerd/enforcerd/api"
	"github.com/spf13/cobra"
)

// execResult is the exit of session exec and --attach: the command's
// status, or that of the error frame with its line, or 125.
func execResult(name string, ctx context.Context, code int, err error) error {
	if err != nil {
		if ctx.Err() != nil {
			return &exitError{code: ExitInterrupt, msg: name + ": interrupted"}
		}
		var fe *api.ExecError
		if errors.As(err, &fe) && fe.Exit != 0 {
			return &exitError{code: fe.Exit, msg: name + ": " + fe.Message}
		}
		return &exitError{code: api.ExitEnforcerd, msg: name + ": " + err.Error()}
	}
	if code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// attachExec follows an exec's output from its start (session exec
// --attach ID); interrupting it leaves the command running.
func (c *CLI) attachExec(glob *GlobalOpts, name, session, id string) error {
	ctx, cancel := signalContext()
	defer cancel()
	code, err := api.NewClient(c.SocketPath(glob)).Attach(ctx, session, id, 0, c.Stdout, c.Stderr, api.ExecOptions{})
	if err != nil && ctx.Err() != nil {
		return &exitError{code: ExitInterrupt, msg: fmt.Sprintf("%s: interrupted; exec %s runs on (enforcerd session exec %s --attach %s)", name, id, session, id)}
	}
	return execResult(name, ctx, code, err)
}

const execStatusLong = `Print an exec of the session as JSON: its ID, args, state (running or
exited), exit status and error line once exited, start and end times, and
how much output it recorded. Without ID: every exec of the session, oldest
first, as a JSON array. Execs are kept until their session is removed. The
output is always JSON; --json is accepted as on the other commands.`

func (c *CLI) sessionExecStatus(glob *GlobalOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:               "exec-status NAME [ID] [--json]",
		Short:             "show a session's execs as JSON",
		Long:              execStatusLong,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: c.completeSessions(glob, 1),
	}
	cmd.Flags().Bool("json", false, "print JSON (the only format of exec-status; accepted for symmetry)")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " session exec-status"
		switch {
		case len(args) == 0:
			return UsageErr(name, "missing session NAME")
		case len(args) > 2:
			return UsageErr(name, "unexpected argument %q after exec ID %q", args[2], args[1])
		}
		ctx, cancel := signalContext()
		defer cancel()
		client := api.NewClient(c.SocketPath(glob))
		if len(args) == 1 {
			execs, err := client.Execs(ctx, args[0])
			if err != nil {
				return RefusedErr(name, err)
			}
			if execs == nil {
				execs = []api.ExecInfo{}
			}
			return WriteJSON(c.Stdout, execs)
		}
		info, err := client.InspectExec(ctx, args[0], args[1])
		if err != nil {
			return RefusedErr(name, err)
		}
		return WriteJSON(c.Stdout, info)
	}
	return cmd
}

const logsLong = `Print the output an exec of the session has recorded (its stdout to
stdout, its stderr to stderr) and exit 0. With --follow, keep printing
until it ends and exit with its status, as "session exec --attach ID"
does. An exec records at most 64 MiB of output; beyond that its output is
discarded, after one line on stderr saying so.`

func (c *CLI) sessionLogs(glob *GlobalOpts) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:               "logs NAME ID",
		Short:             "print an exec's recorded output",
		Long:              logsLong,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: c.completeSessions(glob, 1),
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the exec ends; exit with its status")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " session logs"
		switch {
		case len(args) == 0:
			return UsageErr(name, "missing session NAME")
		case len(args) == 1:
			return UsageErr(name, "missing exec ID after NAME %q (session exec-status %s lists them)", args[0], args[0])
		case len(args) > 2:
			return UsageErr(name, "unexpected argument %q after exec ID %q", args[2], args[1])
		}
		if follow {
			return c.attachExec(glob, name, args[0], args[1])
		}
		ctx, cancel := signalContext()
		defer cancel()
		if _, _, err := api.NewClient(c.SocketPath(glob)).Logs(ctx, args[0], args[1], c.Stdout, c.Stderr); err != nil {
			return RefusedErr(name, err)
		}
		return nil
	}
	return cmd
}
