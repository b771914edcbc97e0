package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/doctor"
	"github.com/enforcerd/enforcerd/internal/bugreport"
	"github.com/enforcerd/enforcerd/internal/cli"
)

const bugreportLong = `Write one archive (tar.gz) to attach to a bug report, and print its path:
this binary's and the daemon's versions, the effective configuration (serve's
options, --config and defaults, as serve would run with them), doctor's
checks (JSON), the daemon's health, a summary of its sessions (names, modes,
entry counts, labels, counters: no policy entries, scopes or credentials),
the daemon's last warning and error lines (the journal of --unit, or
--daemon-log FILE), the kernel's version and the versions of enforcerd's
Debian packages. Nothing is read from inside a sandbox, and the userinfo of
any URL is removed from every file.

A section that cannot be gathered (the daemon is not running, no journal, no
dpkg) is left out with a note in summary.json saying why; the archive is
still written. It takes serve's options (and --config), like doctor.`

// bugreportTimeout bounds each question to the daemon and each tool run.
const bugreportTimeout = 10 * time.Second

func (c *enforcerdCLI) bugreportCommand(glob *cli.GlobalOpts) *cobra.Command {
	var (
		flags     *serveFlags
		output    string
		asJSON    bool
		unit      string
		daemonLog string
		lines     int
	)
	cmd := &cobra.Command{
		Use:   "bugreport [--output FILE] [--json] [--unit NAME] [--daemon-log FILE] [serve's options]",
		Short: "write an archive to attach to a bug report",
		Long:  bugreportLong,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			const name = "enforcerd bugreport"
			if err := cli.NoArgs(name, "bugreport takes options only", args); err != nil {
				return err
			}
			if lines < 1 {
				return cli.UsageErr(name, "--lines %d: want a positive number of log lines", lines)
			}
			now := c.Now().UTC()
			if output == "" {
				output = "enforcerd-bugreport-" + now.Format("20060102T150405Z") + ".tar.gz"
			}
			out, err := filepath.Abs(output)
			if err != nil {
				return cli.UsageErr(name, "--output %q: %v", output, err)
			}
			flags.single[optSocket] = &glob.Socket
			rep := c.gatherBugreport(cmd, flags, now, unit, daemonLog, lines)
			if err := writeArchiveFile(out, rep, now); err != nil {
				return cli.RefusedErr(name, err)
			}
			sum := rep.Summary()
			if asJSON {
				return cli.WriteJSON(c.Stdout, struct {
					Archive string `json:"archive"`
					bugreport.Summary
				}{out, sum})
			}
			fmt.Fprintln(c.Stdout, out)
			for _, s := range sum.Sections {
				line := fmt.Sprintf("  %-10s %s", s.Name, s.Status)
				if s.Note != "" {
					line += ": " + s.Note
				}
				fmt.Fprintln(c.Stdout, line)
			}
			return nil
		},
	}
	flags = defineServeFlags(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "", "write the archive to `FILE` (default ./enforcerd-bugreport-TIME.tar.gz)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the archive's path and its sections as JSON")
	cmd.Flags().StringVar(&unit, "unit", "enforcerd.service", "the systemd `UNIT` whose journal holds the daemon's log")
	cmd.Flags().StringVar(&daemonLog, "daemon-log", "", "read the daemon's log from `FILE` instead of the journal")
	cmd.Flags().IntVar(&lines, "lines", 200, "how many of the last warning and error `N` lines to keep")
	return cmd
}

// gatherBugreport collects every section; none of them fails the report.
func (c *enforcerdCLI) gatherBugreport(cmd *cobra.Command, flags *serveFlags, now time.Time, unit, daemonLog string, lines int) *bugreport.Report {
	rep := &bugreport.Report{Created: now}
	ctx, cancel := context.WithTimeout(context.Background(), 3*bugreportTimeout)
	defer cancel()

	// The configuration, loaded as serve loads it; the socket is serve's.
	src, err := collectServeOptions(cmd.Flags(), flags)
	var cfg ServeConfig
	if err == nil {
		cfg, err = buildServeConfig(src, c.Getenv, c.resolvConf)
	}
	cfgOK := err == nil
	socket := cfg.Socket
	if !cfgOK {
		socket = c.SocketPath(&cli.GlobalOpts{Socket: *flags.single[optSocket]})
	}
	glob := &cli.GlobalOpts{Socket: socket}
	rep.AddJSON("version", "version.json", c.AskVersions(glob), nil)
	if cfgOK {
		rep.AddJSON("config", "config.json", configMap(cfg), nil)
	} else {
		rep.AddJSON("config", "config.json", nil, fmt.Errorf("the configuration does not load: %v", err))
	}

	if cfgOK {
		report := doctor.Run(cfg.doctorConfig(), doctor.Options{})
		checks := []doctor.Check(report)
		if checks == nil {
			checks = []doctor.Check{}
		}
		rep.AddJSON("doctor", "doctor.json", doctorJSON{Failed: report.Failed(), Checks: checks}, nil)
	} else {
		rep.AddJSON("doctor", "doctor.json", nil, fmt.Errorf("not run: the configuration does not load"))
	}

	cl := api.NewClient(socket)
	qctx, qcancel := context.WithTimeout(ctx, bugreportTimeout)
	herr := cl.Healthz(qctx)
	qcancel()
	switch {
	case herr == nil:
		rep.AddJSON("health", "health.json", api.Status{Status: "ok"}, nil)
	case errors.Is(herr, api.ErrUnavailable):
		rep.AddJSON("health", "health.json", map[string]string{"status": "unhealthy", "error": api.OneLine(herr.Error())}, nil)
	case isRefusal(herr):
		rep.AddJSON("health", "health.json", nil, fmt.Errorf("the daemon refused: %v", herr))
	default:
		rep.AddJSON("health", "health.json", nil, fmt.Errorf("the daemon did not answer: %v", herr))
	}

	qctx, qcancel = context.WithTimeout(ctx, bugreportTimeout)
	list, lerr := cl.List(qctx, "", "")
	qcancel()
	if lerr != nil {
		rep.AddJSON("sessions", "sessions.json", nil, fmt.Errorf("the daemon did not list its sessions: %v", lerr))
	} else {
		note := ""
		for i, s := range list { // inspect adds the attested sets and counters
			qctx, qcancel := context.WithTimeout(ctx, bugreportTimeout)
			full, err := cl.Inspect(qctx, s.Name)
			qcancel()
			if err != nil {
				note = fmt.Sprintf("inspect %s: %v (listed fields only)", s.Name, api.OneLine(err.Error()))
				continue
			}
			list[i] = full
		}
		data := bugreport.Sessions(list)
		rep.AddJSON("sessions", "sessions.json", data, nil)
		rep.Sections[len(rep.Sections)-1].Note = note
	}

	var logData []byte
	if daemonLog != "" {
		logData, err = bugreport.LogFileErrors(daemonLog, lines)
	} else {
		logData, err = bugreport.JournalErrors(ctx, unit, lines)
	}
	if err != nil {
		rep.Add("daemon-log", "daemon-log.txt", nil, api.OneLine(err.Error()))
	} else {
		rep.Add("daemon-log", "daemon-log.txt", logData, "")
	}

	kernel, err := bugreport.Kernel()
	rep.Add("kernel", "kernel.txt", kernel, noteOf(err))
	pkgs, err := bugreport.PackageVersions(ctx, bugreport.Packages)
	rep.Add("packages", "packages.txt", pkgs, noteOf(err))
	return rep
}

// isRefusal: the daemon answered (an *api.Error), as opposed to not at all.
func isRefusal(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae)
}

func noteOf(err error) string {
	if err == nil {
		return ""
	}
	return api.OneLine(err.Error())
}

// configMap is the effective configuration by option name, from the same
// list as serve's start-up log line (ServeConfig.LogValue).
func configMap(cfg ServeConfig) map[string]any {
	out := map[string]any{}
	for _, a := range cfg.LogValue().Group() {
		out[a.Key] = a.Value.Resolve().String()
	}
	return out
}

// writeArchiveFile writes the archive next to path and renames it into
// place, mode 0600: it names the host's sessions.
func writeArchiveFile(path string, rep *bugreport.Report, now time.Time) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".enforcerd-bugreport-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := rep.WriteArchive(tmp, "enforcerd-bugreport-"+now.Format("20060102T150405Z")); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
