package nsmgr

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// resolvManager is a Manager with only what the resolv.conf files need (no
// kernel handle).
func resolvManager(t *testing.T, prefix string) *Manager {
	t.Helper()
	geo, err := NewIPAM(netip.MustParsePrefix("10.20.0.0/16"))
	if err != nil {
		t.Fatal(err)
	}
	return &Manager{cfg: Config{Prefix: prefix, EtcNetnsDir: filepath.Join(t.TempDir(), "netns")}, geo: geo}
}

func TestResolvConfWriteRemove(t *testing.T) {
	m := resolvManager(t, "enf")
	path := m.ResolvConfPath("s1")
	if want := filepath.Join(m.cfg.EtcNetnsDir, "enf-s1", "resolv.conf"); path != want {
		t.Fatalf("ResolvConfPath = %s, want %s", path, want)
	}
	// EtcNetnsDir itself does not exist yet: it is created.
	if err := m.writeResolvConf("s1"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "nameserver 10.20.255.254\n" {
		t.Fatalf("resolv.conf = %q, %v; want exactly the nameserver line", b, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("resolv.conf mode: %v %v, want 0644", fi.Mode(), err)
	}
	if err := m.writeResolvConf("s1"); err != nil { // idempotent (Recover rewrites)
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("session dir holds %v, want only resolv.conf", ents)
	}
	for i := 0; i < 2; i++ { // every delete is idempotent
		if err := m.removeResolvConf("s1"); err != nil {
			t.Fatalf("remove #%d: %v", i+1, err)
		}
		if _, err := os.Stat(filepath.Dir(path)); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("remove #%d: session dir left: %v", i+1, err)
		}
	}
	if _, err := os.Stat(m.cfg.EtcNetnsDir); err != nil {
		t.Errorf("EtcNetnsDir itself removed: %v", err)
	}
}

// An operator's own file beside ours keeps the directory (and the file).
func TestResolvConfRemoveKeepsOthers(t *testing.T) {
	m := resolvManager(t, "enf")
	if err := m.writeResolvConf("s1"); err != nil {
		t.Fatal(err)
	}
	hosts := filepath.Join(m.cfg.EtcNetnsDir, "enf-s1", "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.removeResolvConf("s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.ResolvConfPath("s1")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("resolv.conf left: %v", err)
	}
	if _, err := os.Stat(hosts); err != nil {
		t.Errorf("operator's file removed: %v", err)
	}
}

// Only directories whose name parses as this prefix's netns name are
// claimed: not a prefix that extends this one, not an invalid session
// name, not a file.
func TestResolvConfSessions(t *testing.T) {
	m := resolvManager(t, "enf")
	if got, err := m.resolvConfSessions(); err != nil || got != nil {
		t.Fatalf("missing EtcNetnsDir: %v %v, want nothing", got, err)
	}
	for _, d := range []string{"enf-b", "enf-a", "enf2-a", "enf-", "enf--x", "enf-A", "en-a", "other", "enf-x_y"} {
		if err := os.MkdirAll(filepath.Join(m.cfg.EtcNetnsDir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(m.cfg.EtcNetnsDir, "enf-file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := m.resolvConfSessions()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b"}; !slices.Equal(got, want) {
		t.Errorf("resolvConfSessions = %v, want %v", got, want)
	}
}
