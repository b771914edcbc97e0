package integration

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/enforcerd"
)

// TestE2ESecondInstanceRefused: a second `serve` started
// by mistake beside a live daemon, in the same network namespace, refuses
// before it touches anything, with one line naming the conflict and the
// live daemon's pid: the same state dir (even with a weaker
// --public-override, which used to replace the live daemon's blocked set),
// the same prefix, a prefix extending the live one, an overlapping pool.
// `reap` refuses while the daemon serves. The live daemon's table and
// sessions are unchanged throughout. Control: a daemon with its own prefix
// and pool starts beside it.
func TestE2ESecondInstanceRefused(t *testing.T) {
	e := newE2E(t)
	e.createNetOnly("a", "--allow", "api.e2e.test")
	blocked := func() string {
		t.Helper()
		out, err := exec.Command("ip", "netns", "exec", e.w.HostName, "nft", "list", "set", "inet", e.d.Prefix, "blocked").CombinedOutput()
		if err != nil {
			t.Fatalf("nft list set blocked: %v\n%s", err, out)
		}
		return string(out)
	}
	before := blocked()
	if !strings.Contains(before, "100.64.0.0/10") {
		t.Fatalf("control: the live daemon's blocked set lacks 100.64.0.0/10:\n%s", before)
	}
	pid := fmt.Sprint(e.d.PID())
	second := func(what, want string, d *enforcerd.Daemon) {
		t.Helper()
		if err := d.Start(); err == nil {
			d.Stop()
			d.Reap()
			t.Errorf("%s: a second enforcerd started beside pid %s", what, pid)
			return
		}
		log := d.Log()
		if !strings.Contains(log, want) || !strings.Contains(log, pid) {
			t.Errorf("%s: refusal %q, want it to name %q and pid %s", what, log, want, pid)
		}
		e2eOneLine(t, what, log)
	}
	same := enforcerd.New(e.bin, e.w, t.TempDir(), "--public-override", "100.64.0.0/10")
	same.StateDir, same.Prefix = e.d.StateDir, e.d.Prefix // its own socket: the live one would answer Start's probe
	second("same state dir, weaker override", "state dir "+e.d.StateDir+" is in use", same)

	prefix := enforcerd.New(e.bin, e.w, t.TempDir())
	prefix.Prefix = e.d.Prefix
	second("same prefix", fmt.Sprintf("the name prefix %q", e.d.Prefix), prefix)

	shorter := enforcerd.New(e.bin, e.w, t.TempDir())
	shorter.Prefix = e.d.Prefix[:len(e.d.Prefix)-1]
	second("prefix extended by the live one", "extend each other", shorter)

	pool := enforcerd.New(e.bin, e.w, t.TempDir())
	pool.Prefix = "z" + e.w.ID[:5]
	second("overlapping pool", "overlaps the pool", pool)

	if got := blocked(); got != before {
		t.Errorf("the live daemon's blocked set changed:\n%s\nwant\n%s", got, before)
	}
	if names := e2eNames(e.list()); len(names) != 1 || names[0] != "a" {
		t.Errorf("the live daemon lists %v, want [a]", names)
	}

	// A Go program binding the live daemon's socket is told which conflict
	// it is: errors.Is(err, api.ErrOtherDaemon), code other_daemon.
	if ln, err := api.Listen(api.ListenConfig{Socket: e.d.Socket}); err == nil {
		ln.Close()
		t.Errorf("api.Listen on the live daemon's socket %s succeeded", e.d.Socket)
	} else if !errors.Is(err, api.ErrOtherDaemon) || api.CodeOf(err) != api.CodeOtherDaemon || errors.Is(err, api.ErrNameTaken) {
		t.Errorf("api.Listen on the live daemon's socket: %v (code %s), want api.ErrOtherDaemon", err, api.CodeOf(err))
	}
	if names := e2eNames(e.list()); len(names) != 1 {
		t.Errorf("after the refused listen the daemon lists %v", names)
	}

	// reap refuses while the daemon serves.
	out, err := e.d.Reap()
	if err == nil || !strings.Contains(out, "pid "+pid) || !strings.Contains(out, "--force") {
		t.Errorf("reap beside the live daemon: %v %q, want a refusal naming pid %s", err, out, pid)
	}
	if names := e2eNames(e.list()); len(names) != 1 {
		t.Errorf("after the refused reap the daemon lists %v", names)
	}

	// Control: its own prefix and pool.
	other := enforcerd.New(e.bin, e.w, t.TempDir(), "--pool", "10.30.0.0/16")
	other.Prefix = "y" + e.w.ID[:5]
	if err := other.Start(); err != nil {
		t.Fatalf("control: a daemon with its own prefix and pool: %v", err)
	}
	if err := other.Stop(); err != nil {
		t.Errorf("stop the control daemon: %v", err)
	}
	if out, err := other.Reap(); err != nil {
		t.Errorf("reap the control daemon: %v\n%s", err, out)
	}
}
