package main

import (
	"github.com/spf13/cobra"

	"github.com/enforcerd/enforcerd/internal/cli"
)

// ---- serve and reap: the daemon's commands (DaemonCommands, cli.go) ----------

const serveLong = `Run the daemon: re-adopt surviving sessions, reap partial ones, serve the API
on the unix socket and tell systemd it is ready. Every option can also be set
in a TOML file given with --config (keys are the option names, e.g.
state-dir = "/var/lib/enforcerd", upstream = ["192.0.2.53"]); flags win.

API access is powerful: whoever may use the socket (root, and the members of
--socket-group) can run any program as root in a sandbox, from any image of
the image store (<state-dir>/images, which it may import into) or under
--images-dir, and choose its network policy, public egress included. Grant
the group only to those you would let run containers as root.`

// configOfOptions is the configuration serve's options give (serve and
// doctor take the same ones, and the global --socket): a command line with
// arguments, or a bad option, is a usage error of the command name.
func (c *enforcerdCLI) configOfOptions(name, noArgs string, cmd *cobra.Command, flags *serveFlags, glob *cli.GlobalOpts, args []string) (ServeConfig, error) {
	if err := cli.NoArgs(name, noArgs, args); err != nil {
		return ServeConfig{}, err
	}
	flags.single[optSocket] = &glob.Socket // the global option, wherever it was given
	src, err := collectServeOptions(cmd.Flags(), flags)
	if err != nil {
		return ServeConfig{}, cli.UsageErr(name, "%v", err)
	}
	cfg, err := buildServeConfig(src, c.Getenv, c.resolvConf)
	if err != nil {
		return ServeConfig{}, cli.UsageErr(name, "%v", err)
	}
	return cfg, nil
}

func (c *enforcerdCLI) serveCommand(glob *cli.GlobalOpts) *cobra.Command {
	var flags *serveFlags
	cmd := &cobra.Command{
		Use:   "serve [options]",
		Short: "run the daemon",
		Long:  serveLong,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			const name = "enforcerd serve"
			cfg, err := c.configOfOptions(name, "serve takes options only", cmd, flags, glob, args)
			if err != nil {
				return err
			}
			if err := c.serve(cfg); err != nil {
				return cli.LoggedRefusal(name, err, cfg.LogFormat == "json")
			}
			return nil
		},
	}
	flags = defineServeFlags(cmd.Flags())
	for opt, values := range map[string][]string{optLogFormat: {"text", "json"}} {
		_ = cmd.RegisterFlagCompletionFunc(opt, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
	}
	return cmd
}

const reapLong = `Offline, with the daemon stopped: remove every kernel object of the name
prefix (network namespaces, interfaces, the nftables table, sandboxes), the
exec records (their holders stopped), the state records and the prefix's
entry in /run/enforcerd (the directory too once no daemon is registered).
It refuses while a daemon serves the prefix or the state dir (--force
removes them anyway, from under it).`

func (c *enforcerdCLI) reapCommand() *cobra.Command {
	var flags *serveFlags
	cmd := &cobra.Command{
		Use:   "reap [--name-prefix P] [--state-dir DIR] [--pool CIDR] [--config FILE] [--force]",
		Short: "offline: remove every object of a name prefix",
		Long:  reapLong,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			const name = "enforcerd reap"
			if err := cli.NoArgs(name, "reap takes options only", args); err != nil {
				return err
			}
			src, err := collectServeOptions(cmd.Flags(), flags)
			if err != nil {
				return cli.UsageErr(name, "%v", err)
			}
			prefix, stateDir, pool, err := buildReapConfig(src)
			if err != nil {
				return cli.UsageErr(name, "%v", err)
			}
			if err := c.reap(prefix, stateDir, pool, flags.force); err != nil {
				return cli.RefusedErr(name, err)
			}
			return nil
		},
	}
	flags = defineReapFlags(cmd.Flags())
	return cmd
}
