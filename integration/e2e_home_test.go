package integration

// Root's home in a sandbox with a read-only root (issue 27 finding 11): ssh
// keeps its host keys under the passwd home, /root, not $HOME; it was
// read-only while $HOME was /tmp, so ssh could store nothing. Now the
// passwd home is writable and $HOME names it, the rest of the root stays
// read-only, and the image is never written.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestE2ESandboxRootHomeWritable(t *testing.T) {
	e := newE2E(t)
	e.create("ro")
	e.create("rw", "--writable")
	script := `h=$(awk -F: '$1=="root"{print $6}' /etc/passwd); echo "home=$h HOME=$HOME"
mkdir -p "$h/.ssh" && echo key > "$h/.ssh/known_hosts" && cat "$h/.ssh/known_hosts"
if touch /etc/enforcerd-probe 2>/dev/null; then echo root-writable; else echo root-read-only; fi`
	for _, c := range []struct{ session, root string }{{"ro", "root-read-only"}, {"rw", "root-writable"}} {
		out := e.mustSh(c.session, script)
		want := "home=/root HOME=/root\nkey\n" + c.root + "\n"
		if out != want {
			t.Errorf("%s: %q, want %q", c.session, out, want)
		}
	}
	// The image is shared and never written.
	if _, err := os.Stat(filepath.Join(e.rootfs, "root", ".ssh")); err == nil {
		t.Errorf("the image's /root got the sandbox's .ssh")
	}
	// What the image holds in /root stays visible (the busybox image's
	// /root is empty: a file of the sandbox's own session stays its own).
	if out := e.mustSh("ro", "ls -A /root"); strings.TrimSpace(out) != ".ssh" {
		t.Errorf("ro: /root holds %q, want only the .ssh just made", out)
	}
}
