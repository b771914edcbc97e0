package integration

// An image's setuid-root programs (every distribution image has su, mount
// and passwd; a hostile image has whatever its author put there) are kept
// in the image store with their modes, on a host filesystem mounted
// without nosuid. A local unprivileged user must never reach them there,
// even when the state dir and the store pre-exist world-searchable (an
// operator's mkdir, a package's default): otherwise importing an image
// hands every host user a setuid-root shell.

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestE2EImageSetuidUnreachable(t *testing.T) {
	dir := e2eSetuidSearchableDir(t, "e2e-image-suid-")
	e := prepareE2E(t, dir)
	for _, d := range []string{e.d.StateDir, filepath.Join(e.d.StateDir, "images")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e.start()

	// The payload: the host's id(1), which reports an effective uid of 0
	// when it runs setuid root (busybox would drop the privilege).
	idPath, err := exec.LookPath("id")
	if err != nil {
		t.Fatal(err)
	}
	payload, err := os.ReadFile(idPath)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/id", Typeflag: tar.TypeReg, Mode: 0o4755, Size: int64(len(payload))},
	} {
		h.ModTime = time.Unix(1700000000, 0)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(payload); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	archive := e2eDockerSave(t, e2eImageOf(t, buf.Bytes()), filepath.Join(dir, "suid.tar"))
	e.cli("image", "import", "suid", archive)

	asNobody := func(name string, args ...string) (out string, started bool, err error) {
		cmd := exec.Command(name, args...)
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: e2eNobody, Gid: e2eNobody, Groups: []uint32{}}}
		b, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		return string(b), err == nil || errors.As(err, &ee), err
	}
	planted := filepath.Join(e.d.StateDir, "images", "suid", "rootfs", "bin", "id")
	// Positive controls: the file is there, setuid root, for root; the same
	// bytes setuid root in a directory the user reaches make it root (the
	// filesystem honours setuid); and the user reaches the store's parent.
	fi, err := os.Stat(planted)
	if err != nil || fi.Mode()&os.ModeSetuid == 0 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("root: stat %s: %v %v; want setuid root", planted, fi, err)
	}
	reachable := filepath.Join(dir, "suid-control")
	e2eCopyFile(t, planted, reachable, 0o755)
	if err := os.Chmod(reachable, os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	if out, _, err := asNobody(reachable); err != nil || !strings.Contains(out, "euid=0(") {
		t.Fatalf("nobody: a setuid-root copy in %s: %v %q; want euid 0 (the exploit works where reachable)", dir, err, out)
	}
	if out, _, err := asNobody("stat", e.d.StateDir); err != nil {
		t.Fatalf("nobody: stat %s: %v %q", e.d.StateDir, err, out)
	}
	// The attack: run the image's setuid-root program from the store.
	if out, started, err := asNobody(planted); started {
		t.Errorf("nobody: executed %s (setuid root, from an imported image): %v %q", planted, err, out)
	}
	if out, _, err := asNobody("stat", planted); err == nil {
		t.Errorf("nobody: stat %s: reachable: %q", planted, out)
	}
}
