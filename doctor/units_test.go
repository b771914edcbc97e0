package doctor

import (
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// shippedSocketUnit is scripts/enforcerd.socket, as install.sh installs it.
func shippedSocketUnit(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "scripts", "enforcerd.socket"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeUnit(t *testing.T, dir, rel, text string) {
	t.Helper()
	p := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

var defaultWant = SocketWant{
	Socket: "/run/enforcerd/enforcerd.sock",
	DNS:    netip.MustParseAddrPort("10.20.255.254:53"),
	Pool:   netip.MustParsePrefix("10.20.0.0/16"),
}

// TestShippedUnitMatchesDefaults: the socket unit we ship binds what serve
// wants with its defaults.
func TestShippedUnitMatchesDefaults(t *testing.T) {
	dir := t.TempDir()
	writeUnit(t, dir, SocketUnitName, shippedSocketUnit(t))
	u, found, err := ReadSocketUnit([]string{dir}, SocketUnitName)
	if err != nil || !found {
		t.Fatalf("read: found %v, %v", found, err)
	}
	if bad := u.Mismatches(defaultWant); len(bad) > 0 {
		t.Errorf("the shipped unit does not match serve's defaults: %v", bad)
	}
	dns, err := DNSAddrOf(defaultWant.Pool)
	if err != nil || dns != defaultWant.DNS {
		t.Errorf("DNSAddrOf(%s) = %s, %v; want %s", defaultWant.Pool, dns, err, defaultWant.DNS)
	}
}

// TestSocketUnitOverrides: /etc beats the vendor directory, drop-ins apply
// by file name across directories (the higher one hides the same name), an
// empty assignment resets a list, and /dev/null masks.
func TestSocketUnitOverrides(t *testing.T) {
	etc, vendor := t.TempDir(), t.TempDir()
	dirs := []string{etc, vendor}
	writeUnit(t, vendor, SocketUnitName, shippedSocketUnit(t))
	writeUnit(t, vendor, SocketUnitName+".d/10-group.conf", "[Socket]\nSocketGroup=wheel\n")
	writeUnit(t, etc, SocketUnitName+".d/10-group.conf", "[Socket]\nSocketGroup=enforcerd\nSocketMode=0660\n")
	writeUnit(t, etc, SocketUnitName+".d/20-pool.conf", "[Socket]\nListenDatagram=\nListenDatagram=10.21.255.254:53\n# ListenStream=/nope\n[Install]\nListenStream=/ignored\n")
	writeUnit(t, etc, SocketUnitName+".d/README", "ListenStream=/ignored\n")
	u, found, err := ReadSocketUnit(dirs, SocketUnitName)
	if err != nil || !found {
		t.Fatalf("read: found %v, %v", found, err)
	}
	if u.Group != "enforcerd" || u.Mode != 0o660 || !slices.Equal(u.Datagrams, []string{"10.21.255.254:53"}) ||
		!slices.Equal(u.Streams, []string{"/run/enforcerd/enforcerd.sock", "10.20.255.254:53"}) {
		t.Errorf("unit %+v", u)
	}
	if want := []string{filepath.Join(vendor, SocketUnitName), filepath.Join(etc, SocketUnitName+".d/10-group.conf"), filepath.Join(etc, SocketUnitName+".d/20-pool.conf")}; !slices.Equal(u.Files, want) {
		t.Errorf("files %v, want %v", u.Files, want)
	}

	// A full unit in /etc replaces the vendor one.
	writeUnit(t, etc, SocketUnitName, "[Socket]\nListenStream=/run/other.sock\n")
	u, _, _ = ReadSocketUnit(dirs, SocketUnitName)
	if !slices.Equal(u.Streams, []string{"/run/other.sock"}) || u.Files[0] != filepath.Join(etc, SocketUnitName) {
		t.Errorf("/etc override: %+v", u)
	}
	// Masked.
	os.Remove(filepath.Join(etc, SocketUnitName))
	if err := os.Symlink(os.DevNull, filepath.Join(etc, SocketUnitName)); err != nil {
		t.Fatal(err)
	}
	if u, _, _ = ReadSocketUnit(dirs, SocketUnitName); !u.Masked {
		t.Errorf("a unit linked to /dev/null is not masked: %+v", u)
	}
	// None.
	if _, found, err := ReadSocketUnit([]string{t.TempDir()}, SocketUnitName); found || err != nil {
		t.Errorf("empty dir: found %v, %v", found, err)
	}
	// A malformed mode.
	bad := t.TempDir()
	writeUnit(t, bad, SocketUnitName, "[Socket]\nSocketMode=rw\n")
	if _, _, err := ReadSocketUnit([]string{bad}, SocketUnitName); err == nil || !strings.Contains(err.Error(), "SocketMode=rw: want an octal mode such as 0660") {
		t.Errorf("bad mode: %v", err)
	}
}

// TestSocketUnitMismatches: each difference is named with both values.
func TestSocketUnitMismatches(t *testing.T) {
	u := SocketUnit{Streams: []string{"/run/enforcerd/enforcerd.sock", "10.20.255.254:53"}, Datagrams: []string{"10.20.255.254:53"}, Mode: 0o600}
	if bad := u.Mismatches(defaultWant); len(bad) != 0 {
		t.Fatalf("matching unit: %v", bad)
	}
	w := defaultWant
	w.Group = "enforcerd"
	w.Socket = "/run/e2.sock"
	w.Pool = netip.MustParsePrefix("10.21.0.0/16")
	w.DNS = netip.MustParseAddrPort("10.21.255.254:53")
	got := u.Mismatches(w)
	want := []string{
		"ListenStream=/run/enforcerd/enforcerd.sock, but the config's socket is /run/e2.sock",
		`SocketGroup=unset (root only), but the config's socket-group is "enforcerd"`,
		`SocketMode=0600, but the config wants 0660 (socket-group "enforcerd")`,
		"ListenStream=10.20.255.254:53, but the pool 10.21.0.0/16 resolves through 10.21.255.254:53",
		"ListenDatagram=10.20.255.254:53, but the pool 10.21.0.0/16 resolves through 10.21.255.254:53",
	}
	if !slices.Equal(got, want) {
		t.Errorf("mismatches\n got %q\nwant %q", got, want)
	}
	// systemd's default mode (0666) is not what serve makes.
	u.Mode = systemdSocketMode
	if got := u.Mismatches(defaultWant); !slices.Equal(got, []string{"SocketMode=0666, but the config wants 0600 (root only: no socket-group)"}) {
		t.Errorf("default mode: %q", got)
	}
	// A gid and a group name of the same group match.
	u = SocketUnit{Streams: []string{"/run/enforcerd/enforcerd.sock"}, Group: "root", Mode: 0o660}
	w = defaultWant
	w.Group = "0"
	if got := u.Mismatches(w); len(got) != 0 {
		t.Errorf("root and 0: %q", got)
	}
	if SocketModeFor("") != fs.FileMode(0o600) || SocketModeFor("g") != fs.FileMode(0o660) {
		t.Error("SocketModeFor")
	}
}
