// Command enforcerd is the daemon and its command-line client.
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/container"
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
		commit = vcsRevision()
	}
	os.Exit(newCLI().run(os.Args[1:]))
}

// vcsRevision is the commit go build recorded (12 hex digits, "-dirty" for a
// modified tree), or "" when it recorded none (-buildvcs=false, no git).
func vcsRevision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" && dirty {
		rev += "-dirty"
	}
	return rev
}
