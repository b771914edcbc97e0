package cli

import (
	"testing"
	"time"
)

// TestErrorLinePriority: the line a failed command ends with carries err's
// priority on the journal stream, as text or as a JSON record.
func TestErrorLinePriority(t *testing.T) {
	now := func() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) }
	for _, tc := range []struct {
		json, journal bool
		want          string
	}{
		{false, false, "enforcerd serve: boom\n"},
		{false, true, "<3>enforcerd serve: boom\n"},
		{true, false, `{"time":"2025-01-02T03:04:05Z","level":"ERROR","msg":"enforcerd serve: boom"}` + "\n"},
		{true, true, `<3>{"time":"2025-01-02T03:04:05Z","level":"ERROR","msg":"enforcerd serve: boom"}` + "\n"},
	} {
		if got := errorLine("enforcerd serve: boom", tc.json, tc.journal, now); got != tc.want {
			t.Errorf("json %v journal %v: %q, want %q", tc.json, tc.journal, got, tc.want)
		}
	}
}
