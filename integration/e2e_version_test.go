package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// e2eVersion is `enforcerd version --json`.
type e2eVersion struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
	API     string `json:"api"`
	Socket  string `json:"socket"`
	Daemon  *struct {
		Version string `json:"version"`
		Commit  string `json:"commit"`
		API     string `json:"api"`
	} `json:"daemon"`
	DaemonError string `json:"daemon_error"`
	Skew        bool   `json:"skew"`
}

// TestE2EVersion: `enforcerd version` shows the client and the running
// daemon (asked through its socket): the same build, no skew. A client
// whose commit differs (a copy of the binary with its commit string
// changed, as after an upgrade without a restart) reports version skew,
// naming both. With no daemon on the socket it still prints the client,
// says the daemon is not reachable, and exits 0.
func TestE2EVersion(t *testing.T) {
	e := newE2E(t)
	run := func(bin string, args ...string) (e2eVersion, string) {
		t.Helper()
		var v e2eVersion
		cmd := exec.Command(bin, append([]string{"version", "--json"}, args...)...)
		cmd.Env = append(os.Environ(), "ENFORCERD_SOCKET="+e.d.Socket)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s version --json %v: %v", bin, args, err)
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("version --json: %v: %s", err, out)
		}
		text, err := exec.Command(bin, append([]string{"version", "--socket", v.Socket}, args...)...).Output()
		if err != nil {
			t.Fatalf("%s version: %v", bin, err)
		}
		return v, string(text)
	}

	same, text := run(e.bin)
	if same.Daemon == nil || same.Daemon.Version != same.Version || same.Daemon.Commit != same.Commit || same.Daemon.API != "v1" || same.Skew || same.DaemonError != "" {
		t.Errorf("version against the test daemon: %+v (daemon %+v), want the same build and no skew", same, same.Daemon)
	}
	if lines := strings.Split(strings.TrimSpace(text), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "client: enforcerd "+same.Version) ||
		!strings.HasPrefix(lines[1], "daemon: enforcerd "+same.Version) || !strings.HasSuffix(lines[1], " at "+e.d.Socket) {
		t.Errorf("version:\n%s\nwant a client and a daemon line of %s", text, same.Version)
	}

	// A client of another commit: version skew.
	stamp := same.Commit
	if stamp == "" {
		stamp = same.Version // a build without a commit: change its version instead
	}
	bin, err := os.ReadFile(e.bin)
	if err != nil {
		t.Fatal(err)
	}
	other := strings.Repeat("0", len(stamp))
	if bytes.Count(bin, []byte(stamp)) == 0 || stamp == other {
		t.Fatalf("the binary does not hold its own stamp %q", stamp)
	}
	skewed := filepath.Join(t.TempDir(), "enforcerd-skewed")
	if err := os.WriteFile(skewed, bytes.ReplaceAll(bin, []byte(stamp), []byte(other)), 0o755); err != nil {
		t.Fatal(err)
	}
	skew, text := run(skewed)
	if !skew.Skew || skew.Daemon == nil || (skew.Commit != other && skew.Version != other) {
		t.Errorf("version of a skewed client: %+v (daemon %+v), want skew", skew, skew.Daemon)
	}
	if !strings.Contains(text, "version skew: the daemon runs "+same.Version) || !strings.Contains(text, other) {
		t.Errorf("version of a skewed client:\n%s\nwant a version skew line naming both", text)
	}

	// No daemon on the socket: the client still, and why not the daemon.
	none := filepath.Join(t.TempDir(), "none.sock")
	gone, text := run(e.bin, "--socket", none)
	if gone.Daemon != nil || gone.Socket != none || !strings.Contains(gone.DaemonError, "not reachable") || gone.Version != same.Version || gone.Skew {
		t.Errorf("version without a daemon: %+v", gone)
	}
	if lines := strings.Split(strings.TrimSpace(text), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "daemon: not reachable: cannot reach enforcerd at "+none) {
		t.Errorf("version without a daemon:\n%s", text)
	}
}
