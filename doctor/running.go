package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"

	"github.com/enforcerd/enforcerd/api"
)

// checkRunning asks the daemon serving the configured socket, if one
// does, whether it is healthy (GET /v1/healthz: its table and chains are
// in the kernel, the DNS interface holds the anycast address, the DNS
// proxy serves) and which version it runs: a daemon older or newer than
// this binary (an upgrade installed, the service not restarted) is a
// warning. No socket is no daemon, which is fine before installing.
func checkRunning(e *doctorEnv) (string, string) {
	sock := e.opts.Socket
	if sock == "" {
		sock = api.DefaultSocket
	}
	fi, err := os.Stat(sock)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return StatusOK, fmt.Sprintf("no daemon running (no socket at %s)", sock)
	case err != nil:
		return StatusWarn, fmt.Sprintf("stat %s: %v", sock, err)
	case fi.Mode()&fs.ModeSocket == 0:
		return StatusFail, fmt.Sprintf("%s is not a socket: serve cannot listen there", sock)
	}
	timeout := e.opts.UpstreamTimeout
	conn, err := net.DialTimeout("unix", sock, timeout)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return StatusWarn, fmt.Sprintf("no daemon answers on %s (a stale socket: the next serve replaces it)", sock)
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return StatusWarn, fmt.Sprintf("cannot connect to %s: permission denied (run doctor as root or as a member of the socket group)", sock)
	case err != nil:
		return StatusFail, fmt.Sprintf("connect to %s: %v", sock, err)
	}
	conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := api.NewClient(sock)
	if err := c.Healthz(ctx); err != nil {
		var ae *api.Error
		switch {
		case errors.As(err, &ae) && ae.Status == http.StatusForbidden:
			return StatusWarn, fmt.Sprintf("the daemon on %s refuses this user: %s", sock, ae.Message)
		case errors.Is(err, api.ErrUnavailable):
			return StatusFail, fmt.Sprintf("the daemon on %s is unhealthy: %s", sock, oneLine(err))
		case errors.Is(err, context.DeadlineExceeded):
			return StatusFail, fmt.Sprintf("no answer from %s within %s: the daemon does not start or hangs (journalctl -u enforcerd -p err)", sock, timeout)
		}
		return StatusFail, fmt.Sprintf("health of the daemon on %s: %s", sock, oneLine(err))
	}
	v, err := c.Version(ctx)
	if err != nil {
		return StatusWarn, fmt.Sprintf("the daemon on %s is healthy; its version: %s", sock, oneLine(err))
	}
	mine := e.opts.Version
	wantAPI := strings.TrimPrefix(api.Prefix, "/")
	switch {
	case v.API != wantAPI:
		return StatusWarn, fmt.Sprintf("the daemon on %s is healthy but speaks API %s, this binary %s: restart it to run this binary (systemctl restart enforcerd)", sock, v.API, wantAPI)
	case mine != "" && v.Version != mine:
		return StatusWarn, fmt.Sprintf("the daemon on %s is healthy but runs version %s, this binary is %s: restart it to run this binary (systemctl restart enforcerd)", sock, v.Version, mine)
	case e.opts.Commit != "" && v.Commit != "" && v.Commit != e.opts.Commit:
		return StatusWarn, fmt.Sprintf("the daemon on %s is healthy but was built from commit %s, this binary from %s (both version %s): restart it to run this binary (systemctl restart enforcerd)", sock, v.Commit, e.opts.Commit, mine)
	}
	return StatusOK, fmt.Sprintf("the daemon on %s is healthy and runs version %s, as this binary", sock, v.Version)
}

// oneLine is err's text on one line.
func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }
