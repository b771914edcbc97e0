package container

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// imageTree is a temporary images dir with images good and bad; trusted is the test's own uid
// (and root), since an unprivileged test cannot chown to root.
func imageTree(t *testing.T) (images string, trusted func(uint32) bool) {
	t.Helper()
	base := t.TempDir()
	images = filepath.Join(base, "images")
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{
		{images, 0o755},
		{filepath.Join(images, "good"), 0o755},
		{filepath.Join(images, "good", "nested"), 0o755},
		{filepath.Join(images, "groupw"), 0o775},
		{filepath.Join(images, "otherw"), 0o757},
		{filepath.Join(images, "wide"), 0o777},
		{filepath.Join(images, "wide", "img"), 0o755},
	} {
		if err := os.Mkdir(d.path, d.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"toroot": "/", "up": "..", "alias": "good", "out": base} {
		if err := os.Symlink(target, filepath.Join(images, link)); err != nil {
			t.Fatal(err)
		}
	}
	me := uint32(os.Getuid())
	return images, func(uid uint32) bool { return uid == 0 || uid == me }
}

func TestResolveImage(t *testing.T) {
	images, trusted := imageTree(t)
	realImages, err := filepath.EvalSymlinks(images)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		rootfs string
		want   string // the real path, or "" when refused
		msg    string // the refusal's text after `rootfs "<value>": `
	}{
		{images + "/good", realImages + "/good", ""},
		{images + "/good/nested", realImages + "/good/nested", ""},
		{images + "/alias", realImages + "/good", ""},                  // a symlink inside: its target is used
		{images + "/good/../good", realImages + "/good", ""},           // ".." that stays inside
		{images + "/good/../../images/good", realImages + "/good", ""}, // and back in
		{"/", "", "the host's root directory is never an image"},
		{images + "/toroot", "", "the host's root directory is never an image"},
		{images + "/good/../..", "", "not inside an image directory (" + images + "); want an image imported (enforcerd image import) or a directory under serve's --images-dir"},
		{images + "/up", "", "not inside an image directory"},
		{images + "/out", "", "not inside an image directory"},
		{"/etc", "", "not inside an image directory"},
		{images, "", "is the image directory " + images + " itself; want an image inside it"},
		{images + "/good/..", "", "is the image directory"},
		{images + "/groupw", "", realImages + "/groupw is writable by group or others (mode 0775); an image and its image directory must be writable by root only"},
		{images + "/otherw", "", "writable by group or others (mode 0757)"},
		{images + "/wide/img", "", realImages + "/wide is writable by group or others (mode 0777)"},
		{images + "/missing", "", "no such file or directory"},
		{"relative/path", "", "not an absolute path"},
	} {
		got, err := resolveImage(tc.rootfs, []string{images}, trusted)
		prefix := "rootfs \"" + tc.rootfs + "\": "
		switch {
		case tc.want != "" && (err != nil || got != tc.want):
			t.Errorf("resolveImage(%q) = %q, %v; want %q", tc.rootfs, got, err, tc.want)
		case tc.want == "" && (err == nil || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), tc.msg)):
			t.Errorf("resolveImage(%q) = %q, %v; want an error %q...%q", tc.rootfs, got, err, prefix, tc.msg)
		}
	}
}

func TestResolveImageOwnerAndGrant(t *testing.T) {
	images, _ := imageTree(t)
	good := images + "/good"
	// Nothing configured: refused, saying what the operator must do.
	_, err := resolveImage(good, nil, func(uint32) bool { return true })
	if want := `rootfs "` + good + `": no image directory is configured; the operator must start serve with --images-dir DIR to allow sandboxes`; err == nil || err.Error() != want {
		t.Errorf("no images dirs: %v, want %q", err, want)
	}
	// An image directory that does not exist grants nothing; the next one still does.
	if _, err := resolveImage(good, []string{"/nonexistent", images}, func(uint32) bool { return true }); err != nil {
		t.Errorf("second images dir: %v", err)
	}
	// Owned by someone untrusted (here: everyone is untrusted but root).
	if os.Getuid() != 0 {
		_, err = ResolveImage(good, []string{images})
		if err == nil || !strings.Contains(err.Error(), "not root; every directory from / down to the image must belong to root") {
			t.Errorf("owned by uid %d: %v, want refused as not root", os.Getuid(), err)
		}
	}
	// Above the image directory: a directory writable by others and not sticky lets anyone swap
	// the whole image directory.
	parent := filepath.Dir(images)
	if err := os.Chmod(parent, 0o777); err != nil {
		t.Fatal(err)
	}
	_, err = resolveImage(good, []string{images}, func(uint32) bool { return true })
	if err == nil || !strings.Contains(err.Error(), "is writable by others (mode 0777) and not sticky") {
		t.Errorf("world-writable parent: %v", err)
	}
	if err := os.Chmod(parent, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := resolveImage(good, []string{images}, func(uint32) bool { return true }); err != nil {
		t.Errorf("sticky world-writable parent (like /tmp): %v", err)
	}
}

func TestCPUQuota(t *testing.T) {
	for _, tc := range []struct {
		cpus  float64
		quota int64
		ok    bool
	}{
		{0, 100000, true}, // DefaultCPUs
		{1, 100000, true},
		{0.2, 20000, true},
		{1.5, 150000, true},
		{0.01, 1000, true},
		{0.004, 0, false},
		{-1, 0, false},
	} {
		q, err := cpuQuota(tc.cpus)
		if (err == nil) != tc.ok || q != tc.quota {
			t.Errorf("cpuQuota(%v) = %d, %v; want %d ok=%v", tc.cpus, q, err, tc.quota, tc.ok)
		}
	}
}
