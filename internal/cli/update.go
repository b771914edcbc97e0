package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/enforcerd/enforcerd/api"
)

func (c *CLI) sessionUpdate(glob *GlobalOpts) *cobra.Command {
	var (
		u         api.PolicyUpdate
		replace   bool
		asJSON    bool
		egress    = enumFlag{allowed: []string{"allowlist", "public"}}
		gen       = atLeastFlag{min: 1, want: func() string { return "want a positive number" }}
		revokeLP  []string
		onDeny    = enumFlag{allowed: []string{"reject", "reset", "drop"}}
		nameCheck = enumFlag{allowed: []string{"tls", "off"}}
		quic      = enumFlag{allowed: []string{"refuse", "check"}}
	)
	cmd := &cobra.Command{
		Use:   "update NAME [--allow ENTRY]... [--revoke ENTRY]... [--egress MODE] [--lab-peer NAME]... [--revoke-lab-peer NAME]... [--deny ENTRY]... [--revoke-deny ENTRY]... [--on-deny reject|reset|drop] [--name-check tls|off] [--quic refuse|check] [--inbound-from-host PORT]... [--revoke-inbound-from-host PORT]... [--for DURATION] [--replace] [options]",
		Short: "change a running session's policy",
		Long: `Change a running session's policy. The entries of --allow, --scope and
--lab-peer and --deny are added, those of --revoke, --revoke-lab-peer and
--revoke-deny removed; with
--replace the given entries become the whole policy. The entries take
create's grammar. The kernel's rules and the DNS proxy change together, or,
on any failure, not at all. What is revoked is dropped at once, the
addresses its names attested are removed, and established flows to it are
cut unless --keep-established. --for DURATION makes the --allow entries of
this call a grant with an end: after DURATION they are revoked the same
way (the deadline is in the session's record and holds across a restart;
inspect shows it). --generation N refuses the update if the
policy changed since generation N (inspect shows it). A session created
with --locked refuses every update.`,
		Args: cobra.ArbitraryArgs,
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&u.Allow, "allow", nil, "allow egress to `ENTRY` (as create), repeatable")
	fs.StringArrayVar(&u.Scope, "scope", nil, "allow the host of the scope `URL` (as create), repeatable")
	fs.StringArrayVar(&u.Revoke, "revoke", nil, "remove the allow or scope `ENTRY`, repeatable")
	fs.StringArrayVar(&u.LabPeers, "lab-peer", nil, "may connect to the lab target `NAME`, repeatable")
	fs.StringArrayVar(&revokeLP, "revoke-lab-peer", nil, "remove the lab peer `NAME`, repeatable")
	fs.StringArrayVar(&u.Deny, "deny", nil, "deny `ENTRY` (as create), repeatable")
	fs.StringArrayVar(&u.RevokeDeny, "revoke-deny", nil, "remove the deny `ENTRY`, repeatable")
	fs.Var(&onDeny, "on-deny", "what the policy's drops get: `reject`, reset or drop, as create (default: unchanged; with --replace, reject)")
	fs.Var(&nameCheck, "name-check", "check the name a TCP flow to a name-admitted address asks for: `tls` or off, as create (default: unchanged, with --replace too)")
	fs.Var(&quic, "quic", "what UDP/443 to a name-admitted address gets under the name check: `refuse` or check, as create (default: unchanged, with --replace too)")
	fs.StringArrayVar(&u.InboundFromHost, "inbound-from-host", nil, "let the host open connections to `PORT` or PORT/tcp or PORT/udp in the session (as create), repeatable")
	fs.StringArrayVar(&u.RevokeInboundFromHost, "revoke-inbound-from-host", nil, "remove the inbound from host `PORT`, repeatable")
	fs.Var(&egress, "egress", "egress `MODE`: allowlist or public (default: unchanged; with --replace, derived as at create)")
	fs.BoolVar(&replace, "replace", false, "the given entries become the whole policy")
	fs.BoolVar(&u.KeepEstablished, "keep-established", false, "leave established flows to revoked destinations alone (with --for, at the grant's end too)")
	limits := newLimitFlags()
	limits.register(fs)
	fs.StringVar(&u.AllowFor, "for", "", "make this call's --allow entries a grant that ends after `DURATION` (90s, 10m, 2h): then they are revoked as --revoke revokes them")
	fs.Var(&gen, "generation", "refuse the update unless the policy is at generation `N`")
	fs.BoolVar(&asJSON, "json", false, "print the session as JSON")
	_ = cmd.RegisterFlagCompletionFunc("egress", cobra.FixedCompletions(egress.allowed, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("on-deny", cobra.FixedCompletions(onDeny.allowed, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("name-check", cobra.FixedCompletions(nameCheck.allowed, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("quic", cobra.FixedCompletions(quic.allowed, cobra.ShellCompDirectiveNoFileComp))
	cmd.ValidArgsFunction = c.completeSessions(glob, 1)

	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		name := c.Prog + " session update"
		sessionName, err := oneName(name, args)
		if err != nil {
			return err
		}
		u.RevokeLabPeers = revokeLP
		u.Egress = egress.value
		u.OnDeny = onDeny.value
		u.NameCheck = nameCheck.value
		u.QUIC = quic.value
		u.Generation = uint64(gen.n)
		if u.Connections, u.Budget, u.EgressBudget, err = limits.values(); err != nil {
			return UsageErr(name, "%v", err)
		}
		if replace {
			for _, r := range []struct {
				flag   string
				values []string
			}{{"revoke", u.Revoke}, {"revoke-lab-peer", revokeLP}, {"revoke-deny", u.RevokeDeny}, {"revoke-inbound-from-host", u.RevokeInboundFromHost}} {
				if len(r.values) > 0 {
					return UsageErr(name, "--%s %q has no meaning with --replace: want the whole new policy", r.flag, r.values[0])
				}
			}
		}
		ctx, cancel := signalContext()
		defer cancel()
		cl := api.NewClient(c.SocketPath(glob))
		var info api.SessionInfo
		if replace {
			info, err = cl.ReplacePolicy(ctx, sessionName, u)
		} else {
			info, err = cl.UpdatePolicy(ctx, sessionName, u)
		}
		if err != nil {
			return RefusedErr(name, err)
		}
		if asJSON {
			return WriteJSON(c.Stdout, info)
		}
		fmt.Fprintln(c.Stdout, updateSummary(info))
		return nil
	}
	return cmd
}

// updateSummary is update's one line: the policy as it now is, every part
// an update can change (lab peers only on a session that has them).
func updateSummary(info api.SessionInfo) string {
	p := info.Policy
	s := fmt.Sprintf("updated %s: policy generation %d, egress %s, allow %s, deny %s, on-deny %s, name-check %s, quic %s",
		info.Name, p.Generation, info.Egress, orDash(strings.Join(p.Allow, ",")),
		orDash(strings.Join(p.Deny, ",")), orDash(p.OnDeny), orDash(p.NameCheck), orDash(p.QUIC))
	if len(p.LabPeers) > 0 {
		s += ", lab-peers " + strings.Join(p.LabPeers, ",")
	}
	if len(p.InboundFromHost) > 0 {
		s += ", inbound-from-host " + strings.Join(p.InboundFromHost, ",")
	}
	return s
}
