package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
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
