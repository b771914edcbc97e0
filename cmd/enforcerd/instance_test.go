package main

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

func TestInstanceConflict(t *testing.T) {
	base := instanceRecord{PID: 1, NetNS: "net:[1]", Prefix: "enf", Pool: "10.20.0.0/16", Socket: "/run/a.sock", StateDir: "/var/lib/a"}
	for _, tc := range []struct {
		name string
		edit func(r *instanceRecord)
		want string
	}{
		{"disjoint", func(r *instanceRecord) {
			r.Prefix, r.Pool, r.Socket, r.StateDir = "web", "10.30.0.0/16", "/run/b.sock", "/var/lib/b"
		}, ""},
		{"other netns, same prefix and pool", func(r *instanceRecord) { r.NetNS, r.Socket, r.StateDir = "net:[2]", "/run/b.sock", "/var/lib/b" }, ""},
		{"same state dir", func(r *instanceRecord) { r.NetNS = "net:[2]" }, "state dir"},
		{"same socket", func(r *instanceRecord) { r.StateDir = "/var/lib/b" }, "socket"},
		{"same prefix", func(r *instanceRecord) { r.Socket, r.StateDir, r.Pool = "/run/b.sock", "/var/lib/b", "10.30.0.0/16" }, "name prefix"},
		{"prefixes extend each other", func(r *instanceRecord) {
			r.Prefix, r.Socket, r.StateDir, r.Pool = "enf2", "/run/b.sock", "/var/lib/b", "10.30.0.0/16"
		}, "extend each other"},
		{"overlapping pools", func(r *instanceRecord) {
			r.Prefix, r.Socket, r.StateDir, r.Pool = "web", "/run/b.sock", "/var/lib/b", "10.20.128.0/17"
		}, "overlaps"},
	} {
		o := base
		tc.edit(&o)
		got := conflict(base, o)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: conflict = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestInstanceRegistry: a registered daemon is live to others while its
// record is locked; a record nobody holds is stale and removed.
func TestInstanceRegistry(t *testing.T) {
	dir := t.TempDir()
	cfg := ServeConfig{NamePrefix: "enf", Pool: netip.MustParsePrefix("10.20.0.0/16"), Socket: "/run/a.sock", StateDir: filepath.Join(dir, "state")}
	first := &instance{}
	if err := first.register(cfg, dir); err != nil {
		t.Fatalf("register: %v", err)
	}
	second := &instance{}
	cfg2 := cfg
	cfg2.Socket, cfg2.StateDir = "/run/b.sock", filepath.Join(dir, "state2")
	if err := second.register(cfg2, dir); err == nil || !strings.Contains(err.Error(), "name prefix") || !errors.Is(err, api.ErrOtherDaemon) {
		t.Fatalf("second register beside a live one: %v, want a refusal naming the prefix", err)
	}
	first.release()
	if err := second.register(cfg2, dir); err != nil {
		t.Fatalf("register once the first is gone: %v", err)
	}
	second.release()
	left, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if _, err := liveInstances(dir); err != nil {
		t.Fatal(err)
	}
	after, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(left) != 1 || len(after) != 0 {
		t.Errorf("records before the sweep %v, after %v: want the stale one removed", left, after)
	}
	if _, err := os.Stat(filepath.Join(dir, ".lock")); err != nil {
		t.Errorf("registry lock file: %v", err)
	}
}

func TestStateDirLock(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	f, err := lockStateDir(dir)
	if err != nil {
		t.Fatalf("lock: %v", err)
	}
	if _, err := lockStateDir(dir); err == nil || !strings.Contains(err.Error(), "in use by enforcerd pid") || !errors.Is(err, api.ErrOtherDaemon) {
		t.Errorf("second lock: %v, want a refusal naming the pid", err)
	}
	if pid := stateDirHeld(dir); pid == "" {
		t.Errorf("stateDirHeld while locked: empty")
	}
	f.Close()
	if pid := stateDirHeld(dir); pid != "" {
		t.Errorf("stateDirHeld after release: %q", pid)
	}
}

// TestReleaseRegistry: reap drops its prefix's stale record and the stale socket it names,
// keeps the registry while another daemon is registered, and removes the registry and the run
// directory once none is; a daemon that waited on the removed registry's lock registers anew.
func TestReleaseRegistry(t *testing.T) {
	run := filepath.Join(t.TempDir(), "enforcerd")
	dir := filepath.Join(run, "instances")
	sock := filepath.Join(t.TempDir(), "enforcerd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // a daemon killed by SIGKILL leaves its socket
	ln.Close()
	cfg := ServeConfig{NamePrefix: "enf", Pool: netip.MustParsePrefix("10.20.0.0/16"), Socket: sock, StateDir: filepath.Join(run, "s1")}
	mine := &instance{}
	if err := mine.register(cfg, dir); err != nil {
		t.Fatal(err)
	}
	other := &instance{}
	cfg2 := ServeConfig{NamePrefix: "web", Pool: netip.MustParsePrefix("10.30.0.0/16"), Socket: filepath.Join(run, "b.sock"), StateDir: filepath.Join(run, "s2")}
	if err := other.register(cfg2, dir); err != nil {
		t.Fatal(err)
	}
	mine.release() // the daemon of "enf" is gone

	removed, err := releaseRegistry(dir, "enf")
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 || !strings.HasSuffix(removed[0], "-enf.json") || removed[1] != sock {
		t.Errorf("removed %v, want enf's record and %s", removed, sock)
	}
	if recs, _ := filepath.Glob(filepath.Join(dir, "*.json")); len(recs) != 1 || !strings.HasSuffix(recs[0], "-web.json") {
		t.Errorf("records left %v, want web's only", recs)
	}

	// A daemon waiting for the registry's lock while it is removed.
	reg, err := lockRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		third := &instance{}
		cfg3 := cfg
		cfg3.StateDir = filepath.Join(run, "s3")
		err := third.register(cfg3, dir)
		third.release()
		waited <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := os.Remove(filepath.Join(dir, registryLockName)); err != nil { // as releaseRegistry does
		t.Fatal(err)
	}
	reg.Close()
	if err := <-waited; err != nil {
		t.Fatalf("register: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, registryLockName)); err != nil {
		t.Errorf("the waiter did not take the lock anew: %v", err)
	}

	other.release()
	removed, err = releaseRegistry(dir, "web")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Errorf("run dir after the last release: %v (removed %v)", err, removed)
	}
	if _, err := releaseRegistry(dir, "web"); err != nil {
		t.Errorf("second release: %v", err)
	}
	if _, err := os.Stat(run); !os.IsNotExist(err) {
		t.Errorf("a second release left the run dir: %v", err)
	}
}
