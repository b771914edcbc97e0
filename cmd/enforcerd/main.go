// Command enforcerd is the daemon and its command-line client: serve, reap,
// doctor and bugreport here, the client commands from internal/cli (which
// cmd/enforcerctl, the thin client, runs alone).
package main

import (
	"fmt"
	"os"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/internal/cli"
)

// version and commit are stamped at build (make build passes -ldflags -X);
// a plain go build reports the module's VCS information when it has any.
var (
	version = "0.1.0-dev"
	commit  = ""
)

func main() {
	// libcontainer re-executes this binary as "enforcerd init" inside a new
	// sandbox (nsenter's C constructor has already run): hand it over
	// before any flag parsing or other set-up. Init never returns.
	if len(os.Args) > 1 && os.Args[1] == "init" {
		container.Init()
		fmt.Fprintln(os.Stderr, "enforcerd init: the sandbox init returned")
		os.Exit(api.ExitEnforcerd)
	}
	// The daemon re-executes this binary as "enforcerd exec-holder SESSION
	// ID" to run one exec in a process of its own that outlives the daemon.
	if len(os.Args) == 4 && os.Args[1] == container.HolderArg {
		os.Exit(container.RunHolderCommand(os.Args[2:]))
	}
	if commit == "" {
		commit = cli.VCSRevision()
	}
	os.Exit(newCLI().run(os.Args[1:]))
}
