package cli

import (
	"errors"

	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/enforcerd/enforcerd/api"
)

// sinceFlag is --since TIME: an RFC 3339 time, or a duration meaning that
// long before now (resolved when the command runs, with the cli's clock).
type sinceFlag struct {
	raw string
	at  time.Time
	ago time.Duration
}

func (s *sinceFlag) Type() string { return "TIME" }

func (s *sinceFlag) String() string {
	if s == nil {
		return ""
	}
	return s.raw
}

func (s *sinceFlag) Set(v string) error {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		s.raw, s.at, s.ago = v, t, 0
		return nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		s.raw, s.at, s.ago = v, time.Time{}, d
		return nil
	}
	return errors.New("want an RFC 3339 time such as 2025-01-02T03:04:05Z or a duration before now such as 10m")
}

// time is the flag's instant (zero when not given).
func (s *sinceFlag) time(now time.Time) time.Time {
	if s.ago > 0 {
		return now.Add(-s.ago)
	}
	return s.at
}

var _ pflag.Value = (*sinceFlag)(nil)

// followCut is the one line of a --follow the daemon's going ended.
func followCut(cmd string, err error) error {
	if errors.Is(err, api.ErrStreamCut) {
		return &exitError{code: ExitRefused, msg: cmd + ": the daemon went away while following (it stopped or died); the events it recorded are kept: run again without --follow, or with --since"}
	}
	return RefusedErr(cmd, err)
}

const allEventsLong = `Print every live session's recorded events (DNS decisions, lifecycle and
API calls with their caller) as NDJSON, oldest first; with --follow keep
printing every session's new events until interrupted. --follow exits 1 when
the daemon stops or dies.

A removed session's events are kept for the daemon's --events-retention:
read them with 'enforcerd session events NAME'.`

func (c *CLI) eventsCommand(glob *GlobalOpts) *cobra.Command {
	var (
		follow bool
		since  sinceFlag
		label  = kvFlag{single: true}
	)
	cmd := &cobra.Command{
		Use:               "events [--follow] [--label KEY=VALUE] [--since TIME]",
		Short:             "print every session's events (NDJSON)",
		Long:              allEventsLong,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
	}
	cmd.Flags().BoolVar(&follow, "follow", false, "keep printing new events")
	cmd.Flags().Var(&label, "label", "only the sessions with the label `KEY=VALUE`")
	cmd.Flags().Var(&since, "since", "only events at or after `TIME` (RFC 3339, or a duration before now such as 10m)")
	cmd.Flags().Bool("json", false, "print NDJSON (the only format of events; accepted for symmetry)")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " events"
		if err := NoArgs(name, "filter with --label KEY=VALUE; a session's own events: enforcerd session events NAME", args); err != nil {
			return err
		}
		key, value, _ := label.first()
		ctx, cancel := signalContext()
		defer cancel()
		opts := api.EventsOptions{Follow: follow, Since: since.time(c.Now()), LabelKey: key, LabelValue: value}
		err := api.NewClient(c.SocketPath(glob)).AllEventsTo(ctx, opts, c.Stdout)
		if err != nil && ctx.Err() == nil {
			return followCut(name, err)
		}
		return nil
	}
	return cmd
}

// sessionEventsRun is 'session events NAME' once its options are parsed.
func sessionEventsRun(c *CLI, glob *GlobalOpts, name, sessionName string, follow bool, since *sinceFlag) error {
	ctx, cancel := signalContext()
	defer cancel()
	opts := api.EventsOptions{Follow: follow, Since: since.time(c.Now())}
	err := api.NewClient(c.SocketPath(glob)).EventsTo(ctx, sessionName, opts, c.Stdout)
	if err != nil && ctx.Err() == nil {
		return followCut(name, err)
	}
	return nil
}
