package integration

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/integration/enforcerd"
	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/vishvananda/netlink"
)

// TestAttackPrefixCutsHost (through the real binary): a
// link of the daemon's netns that the daemon does not own but whose name
// starts with its prefix (here "<prefix>up", an uplink) would fall under
// the input chain's anti-spoofing rule and cut the host off. `serve` must
// refuse to start, exiting non-zero with one line naming the link.
// Control: once that link is gone, the same daemon starts.
func TestAttackPrefixCutsHost(t *testing.T) {
	world.RequireRoot(t)
	bin := atkDaemonBin(t)
	w := world.New(t)
	d := enforcerd.New(bin, w, t.TempDir())
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("stop enforcerd: %v", err)
		}
		if out, err := d.Reap(); err != nil {
			t.Errorf("reap %s: %v\n%s", d.Prefix, err, out)
		}
	})

	link := d.Prefix + "up"
	peerNS := w.UniqueName("atkp")
	pns := atkNewNamedNetns(t, peerNS)
	hh, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: link}, PeerName: w.UniqueName("xp"), PeerNamespace: netlink.NsFd(int(pns))}
	if err := hh.LinkAdd(veth); err != nil {
		t.Fatalf("add link %s: %v", link, err)
	}
	t.Cleanup(func() { atkDelLink(t, w, link) })
	if l, err := hh.LinkByName(link); err != nil || hh.LinkSetUp(l) != nil {
		t.Fatalf("set %s up: %v", link, err)
	}

	err = d.Start()
	exited, exitErr := d.Exited()
	switch {
	case err == nil && !exited:
		t.Errorf("enforcerd started although link %s, not its own, starts with its prefix %s", link, d.Prefix)
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		if out, err := d.Reap(); err != nil {
			t.Fatalf("reap: %v\n%s", err, out)
		}
	case !exited:
		t.Fatalf("enforcerd did not start and did not exit: %v", err)
	default:
		var ee *exec.ExitError
		if !errors.As(exitErr, &ee) || ee.ExitCode() == 0 {
			t.Errorf("enforcerd refused to start but its exit was %v, want a non-zero status", exitErr)
		}
		if !atkOneLineNames(d.Log(), link) {
			t.Errorf("enforcerd's refusal does not name link %s on one line; log:\n%s", link, d.Log())
		}
	}

	// Control: without the link the daemon starts.
	atkDelLink(t, w, link)
	if atkLinkExists(t, w, link) {
		t.Fatalf("link %s still exists", link)
	}
	d2 := enforcerd.New(bin, w, t.TempDir())
	t.Cleanup(func() {
		if err := d2.Stop(); err != nil {
			t.Errorf("stop enforcerd: %v", err)
		}
		if out, err := d2.Reap(); err != nil {
			t.Errorf("reap %s: %v\n%s", d2.Prefix, err, out)
		}
	})
	if err := d2.Start(); err != nil {
		t.Fatalf("control: enforcerd without a foreign %s link: %v", link, err)
	}
}

// atkOneLineNames reports whether some line of log names link.
func atkOneLineNames(log, link string) bool {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, link) {
			return true
		}
	}
	return false
}

// atkDaemonBin is ENFORCERD_BIN, else the repo's bin/enforcerd; missing,
// it fails the test under CI=true and skips it elsewhere.
func atkDaemonBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("ENFORCERD_BIN")
	if bin == "" {
		bin = filepath.Join("..", "bin", "enforcerd")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		msg := "attack test needs the binary " + abs + " (make build, or ENFORCERD_BIN)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + " (CI=true: failing instead of skipping)")
		}
		t.Skip(msg)
	}
	return abs
}
