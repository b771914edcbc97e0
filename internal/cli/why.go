package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/enforcerd/enforcerd/api"
)

const whyLong = `Say what the session's policy does with a destination right now, and why:
for a name, whether the proxy would answer it and what each of its addresses
meets; for an address, which set or guard decides. DEST is a name or an IPv4
address with an optional :PORT and /tcp or /udp (tcp when only a port is
given), or on a dual-stack session an IPv6 address, bracketed with a port
([2001:db8::10]:443/tcp). With --sni OTHER, the answer is for a TCP flow to DEST that asks
for the name OTHER (TLS server_name or HTTP Host): reason name-mismatch when
the name check would refuse it. The answer comes from the daemon's own data and the kernel's sets; a
name the policy allows is resolved through the daemon's upstreams, one the
policy refuses is sent nowhere.`

func (c *CLI) sessionWhy(glob *GlobalOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:               "why NAME DEST[:PORT][/PROTO]",
		Short:             "explain what the policy does with a destination",
		Long:              whyLong,
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: c.completeSessions(glob, 1),
	}
	asJSON := cmd.Flags().Bool("json", false, "print the answer as JSON")
	sni := cmd.Flags().String("sni", "", "a TCP flow to DEST that asks for the name `OTHER` (TLS server_name or HTTP Host): what the name check makes of it (DEST needs a port)")
	cmd.RunE = func(_ *cobra.Command, args []string) error {
		name := c.Prog + " session why"
		switch {
		case len(args) == 0:
			return UsageErr(name, "missing session NAME and DEST, e.g. enforcerd session why agent api.example.com:443")
		case len(args) == 1:
			return UsageErr(name, "missing DEST after NAME %q, e.g. enforcerd session why %s api.example.com:443", args[0], args[0])
		case len(args) > 2:
			return UsageErr(name, "unexpected argument %q after DEST %q", args[2], args[1])
		}
		ctx, cancel := signalContext()
		defer cancel()
		ans, err := api.NewClient(c.SocketPath(glob)).WhySNI(ctx, args[0], args[1], *sni)
		if err != nil {
			return RefusedErr(name, err)
		}
		if *asJSON {
			return WriteJSON(c.Stdout, ans)
		}
		fmt.Fprint(c.Stdout, whyText(ans))
		return nil
	}
	return cmd
}

// whyText is the answer as a person reads it: the verdict and reason, then
// one line per address of a name.
func whyText(a api.WhyAnswer) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s (%s): %s\n", a.Dest, a.Verdict, a.Reason, a.Detail)
	for _, ad := range a.Addrs {
		fmt.Fprintf(&b, "  %s: %s (%s): %s\n", ad.IP, ad.Verdict, ad.Reason, ad.Detail)
	}
	return b.String()
}
