package main

import (
	"net/netip"

	"github.com/spf13/cobra"

	"github.com/enforcerd/enforcerd/internal/cli"
)

// enforcerdCLI is enforcerd's command line: every client command of
// package internal/cli (the same code as enforcerctl's), and the commands
// that run on the daemon's side of the socket: serve, reap, doctor and
// bugreport. Its fields beyond the shared seams are the daemon's entry
// points (runServe and runReap in production) and the resolv.conf whose
// nameservers are the default --upstream.
type enforcerdCLI struct {
	*cli.CLI
	resolvConf string
	serve      func(ServeConfig) error
	reap       func(prefix, stateDir string, pool netip.Prefix, force bool) error
}

// newCLI returns the production command line.
func newCLI() *enforcerdCLI {
	return withDaemonCommands(&enforcerdCLI{
		CLI:        cli.New("enforcerd", version, commit),
		resolvConf: "/etc/resolv.conf",
		serve:      runServe,
		reap:       runReap,
	})
}

// withDaemonCommands adds the daemon's commands to c's tree.
func withDaemonCommands(c *enforcerdCLI) *enforcerdCLI {
	c.DaemonCommands = func(glob *cli.GlobalOpts) []*cobra.Command {
		return []*cobra.Command{
			c.serveCommand(glob),
			c.reapCommand(),
			c.doctorCommand(glob),
			c.bugreportCommand(glob),
		}
	}
	return c
}

// run executes one command line (without the program name) and returns
// the exit status.
func (c *enforcerdCLI) run(args []string) int { return c.Run(args) }
