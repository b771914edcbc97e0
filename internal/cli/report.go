package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/enforcerd/enforcerd/api"
)

const reportLong = `Verify the session's ledger of admissions and print every destination it
reached: under which entry and policy generation the table admitted it, the
connections, the bytes each way, the first and last time. Each record of the
ledger is chained to the one before it by a SHA-256; the command exits 1 when
the chain is broken (a record changed, removed or out of place), naming where.
A removed session has its report while its files are retained
(--events-retention).`

func (c *CLI) sessionReport(glob *GlobalOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:               "report NAME",
		Short:             "verify the ledger of admissions and list the destinations reached",
		Long:              reportLong,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: c.completeSessions(glob, 1),
	}
	asJSON := cmd.Flags().Bool("json", false, "print the report as JSON")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " session report"
		switch {
		case len(args) == 0:
			return UsageErr(name, "missing session NAME, e.g. enforcerd session report agent")
		case len(args) > 1:
			return UsageErr(name, "unexpected argument %q after NAME %q", args[1], args[0])
		}
		ctx, cancel := signalContext()
		defer cancel()
		rep, err := api.NewClient(c.SocketPath(glob)).Report(ctx, args[0])
		if err != nil {
			return RefusedErr(name, err)
		}
		if *asJSON {
			if err := WriteJSON(c.Stdout, rep); err != nil {
				return err
			}
		} else {
			fmt.Fprint(c.Stdout, reportText(rep))
		}
		if !rep.Verified {
			return &exitError{code: ExitRefused, msg: fmt.Sprintf("%s: session %q: the ledger's chain is broken: %s", name, rep.Session, rep.Broken)}
		}
		return nil
	}
	return cmd
}

// reportText is the report as a person reads it: the chain's state, then
// one line per destination.
func reportText(r api.LedgerReport) string {
	var b strings.Builder
	state := "verified"
	if !r.Verified {
		state = "BROKEN: " + r.Broken
	}
	fmt.Fprintf(&b, "session %s: %d records, chain %s\n", r.Session, r.Records, state)
	if r.Head != "" {
		fmt.Fprintf(&b, "head %s\n", r.Head)
	}
	if r.Aggregated > 0 {
		fmt.Fprintf(&b, "%d flows past the line budget are in aggregate records\n", r.Aggregated)
	}
	if len(r.Destinations) == 0 {
		b.WriteString("no destination reached\n")
		return b.String()
	}
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEST\tVIA\tENTRY\tGEN\tCONNS\tBYTES OUT\tBYTES IN\tFIRST\tLAST")
	for _, d := range r.Destinations {
		dest := d.Dest
		if d.Port != 0 {
			dest = fmt.Sprintf("%s:%d", d.Dest, d.Port)
		}
		entry := d.Entry
		if entry == "" {
			entry = "-"
		}
		fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", dest, d.Proto, d.Via, entry, d.Generation,
			d.Connections, d.BytesOut, d.BytesIn, d.First.Format(time.RFC3339), d.Last.Format(time.RFC3339))
	}
	tw.Flush()
	return b.String()
}
