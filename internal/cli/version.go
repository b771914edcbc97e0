package cli

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/enforcerd/enforcerd/api"
)

// buildInfo is one side of what `enforcerd version` prints: this binary's
// or the daemon's.
type buildInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	Go      string `json:"go"`
	API     string `json:"api"` // the API version it speaks
}

// VersionReport is `enforcerd version --json`: this binary (the client)
// at the top level, as before the daemon was asked, then the daemon's
// answer, or why there is none, and whether the two differ.
type VersionReport struct {
	buildInfo
	Socket      string     `json:"socket"`
	Daemon      *buildInfo `json:"daemon,omitempty"`       // absent when the daemon did not answer
	DaemonError string     `json:"daemon_error,omitempty"` // why it did not
	Skew        bool       `json:"skew"`                   // the daemon runs another version, commit or API
}

// versionAskTimeout bounds the question to the daemon: version answers
// at once even when the socket hangs.
const versionAskTimeout = 2 * time.Second

const versionLong = `Print the version of this binary (the client), the git commit it was built
from and its Go version, then the daemon's, asked through the API socket.
When the daemon cannot be reached the second line says so, and why; when
the two differ (version skew, as after an upgrade that did not restart the
daemon) a third line says which runs what. The exit status is 0 in every
case: the client's version is always known.`

func (c *CLI) versionCommand(glob *GlobalOpts) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version [--json]",
		Short: "print the version of this binary and of the daemon",
		Long:  versionLong,
		Args:  cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			if err := NoArgs(c.Prog+" version", "", args); err != nil {
				return err
			}
			rep := c.AskVersions(glob)
			if asJSON {
				return WriteJSON(c.Stdout, rep)
			}
			fmt.Fprintf(c.Stdout, "client: %s\n", rep.buildInfo)
			switch {
			case rep.Daemon != nil:
				fmt.Fprintf(c.Stdout, "daemon: %s at %s\n", *rep.Daemon, rep.Socket)
			default:
				fmt.Fprintf(c.Stdout, "daemon: %s\n", rep.DaemonError)
			}
			if rep.Skew {
				fmt.Fprintf(c.Stdout, "version skew: the daemon runs %s, this binary is %s: restart the daemon to run this binary, or use the client of its version\n",
					rep.Daemon.short(), rep.buildInfo.short())
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print both versions, the daemon's error and the skew as JSON")
	return cmd
}

// AskVersions is this binary's version and the daemon's, asked through
// the socket (version, and enforcerd bugreport's version.json).
func (c *CLI) AskVersions(glob *GlobalOpts) VersionReport {
	rep := VersionReport{
		buildInfo: buildInfo{Version: c.Version, Commit: c.Commit, Go: runtime.Version(), API: strings.TrimPrefix(api.Prefix, "/")},
		Socket:    c.SocketPath(glob),
	}
	ctx, cancel := context.WithTimeout(context.Background(), versionAskTimeout)
	defer cancel()
	v, err := api.NewClient(rep.Socket).Version(ctx)
	var ae *api.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		rep.DaemonError = fmt.Sprintf("not answering at %s within %s", rep.Socket, versionAskTimeout)
	case errors.As(err, &ae):
		rep.DaemonError = fmt.Sprintf("refused at %s: %s", rep.Socket, ae.Message)
	case err != nil:
		rep.DaemonError = "not reachable: " + api.OneLine(err.Error())
	default:
		rep.Daemon = &buildInfo{Version: v.Version, Commit: v.Commit, Go: v.Go, API: v.API}
		rep.Skew = versionSkew(rep.buildInfo, *rep.Daemon)
	}
	return rep
}

// versionSkew: the two sides run different versions, commits (when both
// are known) or APIs.
func versionSkew(client, daemon buildInfo) bool {
	return client.Version != daemon.Version || client.API != daemon.API ||
		(client.Commit != "" && daemon.Commit != "" && client.Commit != daemon.Commit)
}

// String is the one-line form: "enforcerd 0.1.0 (commit abc, go1.24, api v1)".
func (b buildInfo) String() string {
	return fmt.Sprintf("enforcerd %s (commit %s, %s, api %s)", b.Version, orUnknown(b.Commit), orUnknown(b.Go), b.API)
}

// short is "0.1.0 (commit abc, api v1)".
func (b buildInfo) short() string {
	return fmt.Sprintf("%s (commit %s, api %s)", b.Version, orUnknown(b.Commit), b.API)
}
