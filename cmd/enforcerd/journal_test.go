package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/internal/cli"
)

// TestJournalPriorities: every line starts with the syslog priority of its
// level, derived loggers included, so journalctl -p err finds the errors.
func TestJournalPriorities(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(newJournalHandler(&b, slog.NewJSONHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})))
	log.Debug("d")
	log.Info("i")
	log.With("session", "a").Warn("w")
	log.WithGroup("g").Error("e")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := []string{"<7>", "<6>", "<4>", "<3>"}
	if len(lines) != len(want) {
		t.Fatalf("lines %q", lines)
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, want[i]+"{") {
			t.Errorf("line %d = %q, want the prefix %s", i, l, want[i])
		}
	}
}

// journalFile is a file standing in for the journal stream: JOURNAL_STREAM
// set to its device and inode, as systemd sets it for the service.
func journalFile(t *testing.T, env map[string]string) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "stream"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	env["JOURNAL_STREAM"] = fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	return f
}

// TestOnJournalStream: only the stream JOURNAL_STREAM names gets prefixes
// (a child with other output inherits the variable).
func TestOnJournalStream(t *testing.T) {
	env := map[string]string{}
	f := journalFile(t, env)
	getenv := func(k string) string { return env[k] }
	if !cli.OnJournalStream(getenv, f) {
		t.Errorf("the named stream is not recognised (JOURNAL_STREAM=%s)", env["JOURNAL_STREAM"])
	}
	other, err := os.Create(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if cli.OnJournalStream(getenv, other) {
		t.Errorf("another file taken for the journal stream")
	}
	if cli.OnJournalStream(func(string) string { return "" }, f) || cli.OnJournalStream(getenv, nil) {
		t.Errorf("no JOURNAL_STREAM, or no file: want false")
	}
}

// TestServeErrorOnJournal: serve's start error and a config error, written
// to the journal stream, are at priority 3; the start error is a JSON
// record when the log format is json.
func TestServeErrorOnJournal(t *testing.T) {
	c := newTestCLI(t)
	f := journalFile(t, c.env)
	c.Stderr = f
	c.serve = func(ServeConfig) error { return errors.New("preflight check nftables failed: no nf_tables") }
	read := func() string {
		t.Helper()
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(0)
		f.Seek(0, 0)
		return string(b)
	}
	if code := c.run("serve", "--pool", "10.20.0.1/16"); code != cli.ExitUsage {
		t.Fatalf("bad pool: exit %d", code)
	}
	if got := read(); !strings.HasPrefix(got, "<3>enforcerd serve: --pool: invalid pool 10.20.0.1/16") || strings.Count(got, "\n") != 1 {
		t.Errorf("config error on the journal stream: %q", got)
	}
	// Under systemd (JOURNAL_STREAM set) the log format defaults to json.
	if code := c.run("serve"); code != cli.ExitRefused {
		t.Fatalf("failed start: exit %d", code)
	}
	want := `<3>{"time":"2025-01-02T03:04:05Z","level":"ERROR","msg":"enforcerd serve: preflight check nftables failed: no nf_tables"}` + "\n"
	if got := read(); got != want {
		t.Errorf("start error on the journal stream:\n got %q\nwant %q", got, want)
	}
	if code := c.run("serve", "--log-format", "text"); code != cli.ExitRefused {
		t.Fatalf("failed start: exit %d", code)
	}
	if got := read(); got != "<3>enforcerd serve: preflight check nftables failed: no nf_tables\n" {
		t.Errorf("text start error on the journal stream: %q", got)
	}
}
