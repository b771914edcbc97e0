package world

import (
	"os"
	"os/exec"
	"testing"
)

// RequireRoot stops a live test that cannot run: under CI=true it fails,
// elsewhere it skips.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		unmet(tb, "root")
	}
}

// RequireTool stops a live test that needs a command (nft, ip, busybox)
// the machine lacks, as RequireRoot does: under CI=true it fails,
// elsewhere it skips.
func RequireTool(tb testing.TB, name string) {
	tb.Helper()
	if _, err := exec.LookPath(name); err != nil {
		unmet(tb, name)
	}
}

// unmet fails (CI=true) or skips a live test that lacks what.
func unmet(tb testing.TB, what string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("live test needs %s (CI=true: failing instead of skipping)", what)
	}
	tb.Skipf("live test needs %s", what)
}
