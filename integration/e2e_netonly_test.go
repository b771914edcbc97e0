package integration

// Network-only sessions ready to use: a session with a
// NIC gets iproute2's /etc/netns/<netns>/resolv.conf naming the anycast
// DNS address, so `ip netns exec` resolves through the proxy; the file goes
// at delete and at reap, and reap takes only this prefix's directories.
// This test uses the real /etc/netns (the daemon's default), with names
// carrying the test world's unique prefix, and removes what it made.

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/integration/world"
)

const e2eEtcNetns = "/etc/netns"

func TestE2ENetworkOnlyResolvConf(t *testing.T) {
	world.RequireTool(t, "ip")
	// Registered before the world: runs after its cleanup (the daemon's
	// reap), so it sees what the product left, then removes what the test
	// itself made.
	_, statErr := os.Stat(e2eEtcNetns)
	baseExisted := statErr == nil
	var prefix string
	var decoys []string
	t.Cleanup(func() {
		if prefix != "" {
			if left, _ := filepath.Glob(filepath.Join(e2eEtcNetns, prefix+"-*")); len(left) > 0 {
				t.Errorf("left under %s after reap: %v", e2eEtcNetns, left)
			}
		}
		for _, d := range decoys {
			if err := os.RemoveAll(d); err != nil {
				t.Errorf("remove %s: %v", d, err)
			}
		}
		if !baseExisted {
			_ = os.Remove(e2eEtcNetns) // only if empty: another run may use it
		}
	})
	e := newE2E(t)
	prefix = e.d.Prefix
	dns := e2eAnycastDNS.Addr().String()
	conf := func(session string) string { return filepath.Join(e2eEtcNetns, prefix+"-"+session, "resolv.conf") }
	ipNetnsExec := func(netns string, args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", netns}, args...)...).CombinedOutput()
		return string(out), err
	}

	info := e.createNetOnly("bare", "--allow", "api.e2e.test")
	var created e2eHeld
	if err := json.Unmarshal([]byte(e.cli("session", "inspect", "bare")), &created); err != nil || created.DNS != dns {
		t.Errorf("inspect bare: dns %q %v, want %s", created.DNS, err, dns)
	}
	if b, err := os.ReadFile(conf("bare")); err != nil || string(b) != "nameserver "+dns+"\n" {
		t.Fatalf("%s = %q %v, want exactly the nameserver line", conf("bare"), b, err)
	}
	// ip netns exec bind-mounts it over /etc/resolv.conf ...
	if out, err := ipNetnsExec(info.Netns, "cat", "/etc/resolv.conf"); err != nil || out != "nameserver "+dns+"\n" {
		t.Errorf("ip netns exec %s cat /etc/resolv.conf: %q %v", info.Netns, out, err)
	}
	// ... and a resolver reading it (busybox nslookup: no server argument)
	// goes through the proxy: an allowed name answers, another is refused.
	if bb, err := exec.LookPath("busybox"); err == nil {
		out, err := ipNetnsExec(info.Netns, "timeout", "5", bb, "nslookup", "-type=a", "api.e2e.test")
		if err != nil || !strings.Contains(out, dns) || !strings.Contains(out, "198.18.1.10") {
			t.Errorf("ip netns exec %s busybox nslookup api.e2e.test: %v\n%s", info.Netns, err, out)
		}
		if out, err := ipNetnsExec(info.Netns, "timeout", "5", bb, "nslookup", "-type=a", "docs.e2e.test"); err == nil || strings.Contains(out, "198.18.1.11") {
			t.Errorf("ip netns exec %s busybox nslookup docs.e2e.test (not allowed): %v\n%s", info.Netns, err, out)
		}
	} else { // no resolver on the host: look up through the address the file names
		if rcode, addrs := e2eLookup(t, e.nsPath("bare"), "api.e2e.test"); rcode != 0 || strings.Join(addrs, " ") != "198.18.1.10" {
			t.Errorf("lookup from %s: rcode %d %v", info.Netns, rcode, addrs)
		}
	}

	// A session without a NIC has no resolver: no file. A sandbox with a
	// NIC gets one too (for ip netns exec beside the sandbox).
	e.createNetOnly("sealed")
	if _, err := os.Stat(filepath.Dir(conf("sealed"))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s: %v, want no directory for a session without a NIC", filepath.Dir(conf("sealed")), err)
	}
	e.create("box", "--allow", "api.e2e.test")
	if _, err := os.Stat(conf("box")); err != nil {
		t.Errorf("sandbox session: %v", err)
	}

	// Delete removes the file and its directory.
	e.cli("session", "rm", "bare")
	if _, err := os.Stat(filepath.Dir(conf("bare"))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after rm: %s: %v, want it gone", filepath.Dir(conf("bare")), err)
	}

	// Reap (daemon stopped) removes this prefix's files only: not a prefix
	// that extends this one, and not an operator's own file beside ours.
	orphan := e.createNetOnly("orphan", "--egress", "public")
	hosts := filepath.Join(e2eEtcNetns, orphan.Netns, "hosts")
	ext := filepath.Join(e2eEtcNetns, prefix+"2-x")
	decoys = append(decoys, ext, filepath.Dir(hosts))
	if err := os.WriteFile(hosts, []byte("127.0.0.1 mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(ext, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ext, "resolv.conf"), []byte("nameserver 192.0.2.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.d.Kill(); err != nil {
		t.Fatal(err)
	}
	if out, err := e.d.Reap(); err != nil {
		t.Fatalf("reap: %v\n%s", err, out)
	}
	for _, s := range []string{"orphan", "box"} {
		if _, err := os.Stat(conf(s)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("after reap: %s: %v, want it gone", conf(s), err)
		}
	}
	if _, err := os.Stat(filepath.Dir(conf("box"))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after reap: %s left", filepath.Dir(conf("box")))
	}
	if _, err := os.Stat(hosts); err != nil {
		t.Errorf("reap removed the operator's %s: %v", hosts, err)
	}
	if _, err := os.Stat(filepath.Join(ext, "resolv.conf")); err != nil {
		t.Errorf("reap removed another prefix's file: %v", err)
	}
	// The operator's file was ours to plant: remove it now, so the leak
	// check above sees only what the product left.
	if err := os.RemoveAll(filepath.Dir(hosts)); err != nil {
		t.Fatal(err)
	}
}
