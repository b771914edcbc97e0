package daemon

import (
	"bytes"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/netpolicy"
)

// TestReconcileLogsSkippedRecords: each state record that does not load is
// logged with its file and the reason, once (a quarantined one is not
// read again).
func TestReconcileLogsSkippedRecords(t *testing.T) {
	w := newWorld(t)
	dir := filepath.Join(w.stateDir, "sessions")
	if err := os.WriteFile(filepath.Join(dir, "broken.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	reconcile := func() string {
		t.Helper()
		var buf bytes.Buffer
		guard, err := netpolicy.NewGuard(smPool, nil)
		if err != nil {
			t.Fatal(err)
		}
		store, err := NewStateStore(w.stateDir)
		if err != nil {
			t.Fatal(err)
		}
		d := New(Config{StateDir: w.stateDir, NamePrefix: smPrefix, Pool: smPool}, Parts{
			Network: w.nets, Firewall: w.fw, Sandboxes: w.boxes, Guard: guard, Pin: fakePin, DNSAddr: smDNSAddr, Store: store,
			Resolver: &fakeResolver{in: w.in, reg: map[netip.Addr]dnsproxy.SessionPolicy{}},
			Log:      slog.New(slog.NewTextHandler(&buf, nil)),
		})
		if err := d.Reconcile(); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		return buf.String()
	}
	log := reconcile()
	for _, want := range []string{
		`file=` + filepath.Join(dir, "broken.json.bad") + ` session=broken reason="load state of session broken:`,
		`file=` + filepath.Join(dir, "notes.txt") + ` session="" reason="state directory ` + dir + `: unexpected entry \"notes.txt\""`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if log := reconcile(); strings.Contains(log, "broken") {
		t.Errorf("the quarantined record was reported again:\n%s", log)
	}
}
