package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/enforcerd/enforcerd/doctor"
	"github.com/enforcerd/enforcerd/internal/cli"
)

const doctorLong = `Check this host for what the daemon needs, before and after installing:
root, the kernel's features (network namespaces, veth, nf_tables with the
set types of the daemon's table, a writable /proc/sys/net, overlay,
seccomp, cgroup v1 or v2 with writable cgroup directories), /run/netns
mount propagation, another firewall dropping forwarded traffic (an
nftables forward chain that drops, iptables-nft's FORWARD policy, a legacy
iptables filter table), the pool overlapping an address or a route of the
host, links named with the prefix that are not the daemon's, the upstream
resolvers answering (REFUSED or SERVFAIL fails), the installed
enforcerd.socket against the configuration (API socket path, group and
mode; the pool's DNS address), and a daemon already running on the socket
(its health; another version than this binary's warns). It takes serve's
options (and --config), so it checks the configuration serve would run
with.

The kernel features are proven in a throwaway network namespace: nothing of
the host changes. With --datapath it also creates two throwaway sessions
under a throwaway prefix and pool, sends one packet the policy allows and
one it denies between them (both stay on this host), checks from the
kernel's counters that the first was accepted and the second dropped, and
removes everything again.

It exits 1 when a check failed (a warning alone exits 0). serve runs the
checks marked fatal at start and refuses to start when one fails.`

func (c *enforcerdCLI) doctorCommand(glob *cli.GlobalOpts) *cobra.Command {
	var (
		flags        *serveFlags
		asJSON       bool
		datapath     bool
		datapathPool string
		unitsDirs    []string
	)
	cmd := &cobra.Command{
		Use:   "doctor [--datapath] [--json] [serve's options]",
		Short: "check the host before and after installing",
		Long:  doctorLong,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			const name = "enforcerd doctor"
			cfg, err := c.configOfOptions(name, "doctor takes options only", cmd, flags, glob, args)
			if err != nil {
				return err
			}
			for _, d := range unitsDirs {
				if !filepath.IsAbs(d) {
					return cli.UsageErr(name, "--units-dir %q: want an absolute directory", d)
				}
			}
			opts := doctor.Options{Datapath: datapath, Socket: cfg.Socket, SocketGroup: cfg.SocketGroup,
				ConfigFile: cfg.ConfigFile, UnitDirs: unitsDirs, Version: version, Commit: commit}
			if datapathPool != "" {
				if opts.DatapathPool, err = parsePool("--datapath-pool", datapathPool); err != nil {
					return cli.UsageErr(name, "%v", err)
				}
			}
			return runDoctor(c.Stdout, cfg, opts, asJSON)
		},
	}
	flags = defineServeFlags(cmd.Flags())
	cmd.Flags().BoolVar(&datapath, "datapath", false, "also prove enforcement with two throwaway sessions (one packet accepted, one dropped, nothing sent beyond the host)")
	cmd.Flags().StringVar(&datapathPool, "datapath-pool", "", "throwaway pool `CIDR` of --datapath (default "+doctor.DefaultDatapathPool.String()+")")
	cmd.Flags().StringArrayVar(&unitsDirs, "units-dir", nil, "look for "+doctor.SocketUnitName+" and its drop-ins only in `DIR`, repeatable, highest precedence first (default: systemd's "+strings.Join(doctor.DefaultUnitDirs, ", ")+")")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the checks as JSON")
	return cmd
}

// doctorJSON is what doctor --json prints.
type doctorJSON struct {
	Failed bool           `json:"failed"`
	Checks []doctor.Check `json:"checks"`
}

// runDoctor runs the checks for cfg and writes them to w; a failed check
// is an exit-1 error naming the failed checks.
func runDoctor(w io.Writer, cfg ServeConfig, opts doctor.Options, asJSON bool) error {
	report := doctor.Run(cfg.doctorConfig(), opts)
	if err := writeDoctorReport(w, report, asJSON); err != nil {
		return err
	}
	return doctorResult(report)
}

// writeDoctorReport writes the checks as a table (CHECK STATUS DETAIL) or
// as JSON.
func writeDoctorReport(w io.Writer, report doctor.Report, asJSON bool) error {
	if asJSON {
		checks := []doctor.Check(report)
		if checks == nil {
			checks = []doctor.Check{}
		}
		return cli.WriteJSON(w, doctorJSON{Failed: report.Failed(), Checks: checks})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tDETAIL")
	for _, c := range report {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", c.Name, c.Status, c.Detail)
	}
	return tw.Flush()
}

// doctorResult is nil, or the exit-1 error naming the failed checks.
func doctorResult(report doctor.Report) error {
	var failed []string
	for _, c := range report {
		if c.Status == doctor.StatusFail {
			failed = append(failed, c.Name)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	what := "check"
	if len(failed) > 1 {
		what = "checks"
	}
	return cli.RefusedErr("enforcerd doctor", fmt.Errorf("%d %s failed: %s", len(failed), what, strings.Join(failed, ", ")))
}

// preflight runs the checks serve refuses to start on; the error names
// the first that failed.
func preflight(cfg ServeConfig) error {
	c, failed := doctor.Run(cfg.doctorConfig(), doctor.Options{FatalOnly: true}).FatalFailure()
	if !failed {
		return nil
	}
	return fmt.Errorf("preflight check %s failed: %s (enforcerd doctor shows every check)", c.Name, c.Detail)
}
