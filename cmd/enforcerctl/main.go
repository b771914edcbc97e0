// Command enforcerctl is enforcerd's thin client: the commands that talk to
// the daemon's API socket (session, image, events, version, completion),
// with enforcerd's flags, output, errors and exit statuses, from the same
// code (package internal/cli). It is built without cgo and links no
// netlink, nftables or libcontainer (cmd/enforcerctl/depaware.txt lists
// what it links; internal/depaware's test holds it to that), so one call
// starts in a fraction of enforcerd's time: for scripts and agents that
// create and remove many sessions. The daemon and its offline commands
// (serve, reap, doctor, bugreport) are enforcerd's.
package main

import (
	"os"

	"github.com/enforcerd/enforcerd/internal/cli"
)

// version and commit are stamped at build (make build passes -ldflags -X).
var (
	version = "0.1.0-dev"
	commit  = ""
)

func main() {
	if commit == "" {
		commit = cli.VCSRevision()
	}
	os.Exit(cli.New("enforcerctl", version, commit).Run(os.Args[1:]))
}
