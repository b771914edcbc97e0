package integration

// What a test runs as another user (uid 65534) must be where that user can
// reach it: the clone, and so bin/enforcerd, may live under a 0700
// directory (what `mktemp -d` makes), and so may $TMPDIR.

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// e2eWorldSearchableDir makes a directory every user may search, removed
// at the test's end, below parents every user may search too: under
// $TMPDIR when its whole chain is, else under /tmp. A daemon directory made
// here leaves only the daemon's own modes to decide what a host user
// reaches.
func e2eWorldSearchableDir(t *testing.T, pattern string) string {
	t.Helper()
	base := os.TempDir()
	if !e2eSearchableByAll(base) {
		base = "/tmp"
	}
	if !e2eSearchableByAll(base) {
		t.Fatalf("neither $TMPDIR (%s) nor /tmp is searchable by every user down from /: want one that is, for the tests that run programs as uid %d", os.TempDir(), e2eNobody)
	}
	return e2eMkdirSearchable(t, base, pattern)
}

// e2eSetuidSearchableDir is e2eWorldSearchableDir on a filesystem that
// honours setuid bits, for the tests whose attack and control are a
// setuid-root file: $TMPDIR, /tmp or /var/tmp, the first that every user
// can search and that is not mounted nosuid (a systemd machine's /tmp is a
// nosuid tmpfs, where the control could not work and the attack would
// prove nothing).
func e2eSetuidSearchableDir(t *testing.T, pattern string) string {
	t.Helper()
	for _, base := range []string{os.TempDir(), "/tmp", "/var/tmp"} {
		var st unix.Statfs_t
		if e2eSearchableByAll(base) && unix.Statfs(base, &st) == nil && st.Flags&unix.ST_NOSUID == 0 {
			return e2eMkdirSearchable(t, base, pattern)
		}
	}
	t.Fatalf("none of $TMPDIR (%s), /tmp and /var/tmp is searchable by every user and honours setuid bits: want one that does, for the setuid tests", os.TempDir())
	return ""
}

// e2eMkdirSearchable makes a directory in base, mode 0755, removed at the
// test's end.
func e2eMkdirSearchable(t *testing.T, base, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp(base, pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// e2eSearchableByAll reports whether dir and every directory above it let
// others search them (the x bit for others).
func e2eSearchableByAll(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == "/" {
			return true
		}
	}
}

// e2eCopyForOtherUsers copies the program bin (mode 0755) into a directory
// from e2eWorldSearchableDir and returns the copy's path.
func e2eCopyForOtherUsers(t *testing.T, bin string) string {
	t.Helper()
	dst := filepath.Join(e2eWorldSearchableDir(t, "e2e-bin-"), filepath.Base(bin))
	e2eCopyFile(t, bin, dst, 0o755)
	return dst
}
