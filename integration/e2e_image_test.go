package integration

// Images end to end: an image archive made in the test from the busybox
// rootfs (docker save format, and an OCI layout), imported through the CLI,
// a sandbox run from it, removal refused while a session uses it, and a
// hostile archive refused with nothing left in the store.

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/enforcerd/enforcerd/api"
)

// e2eDirLayer is a layer tar of the directory dir: its directories, files
// and symlinks, with their modes (owners root).
func e2eDirLayer(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !fi.IsDir() && !fi.Mode().IsRegular() {
			return nil
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = filepath.ToSlash(rel), 0, 0, "", ""
		if fi.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// e2eTarLayer is a layer of the given entries: name -> content for files,
// "->TARGET" for symlinks, "" with a trailing / for directories.
func e2eTarLayer(t *testing.T, entries [][2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e[0], Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e[1])), ModTime: time.Unix(1700000000, 0)}
		switch {
		case strings.HasSuffix(e[0], "/"):
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeDir, 0o755, 0
		case strings.HasPrefix(e[1], "->"):
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeSymlink, strings.TrimPrefix(e[1], "->"), 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(e[1])); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func e2eImageOf(t *testing.T, layers ...[]byte) v1.Image {
	t.Helper()
	img := empty.Image
	for _, data := range layers {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	return img
}

// e2eDockerSave writes img as `docker save` does and returns the file.
func e2eDockerSave(t *testing.T, img v1.Image, file string) string {
	t.Helper()
	tag, err := name.NewTag("example.org/e2e/busybox:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		t.Fatal(err)
	}
	return file
}

func (e *e2eEnv) images() []api.ImageInfo {
	e.t.Helper()
	var list []api.ImageInfo
	if out := e.cli("image", "ls", "--json"); json.Unmarshal([]byte(out), &list) != nil {
		e.t.Fatalf("image ls --json: %q", out)
	}
	return list
}

// storeEntries lists the daemon's image store, hidden entries included.
func (e *e2eEnv) storeEntries() []string {
	e.t.Helper()
	entries, err := os.ReadDir(filepath.Join(e.d.StateDir, "images"))
	if err != nil {
		e.t.Fatalf("image store: %v", err)
	}
	var out []string
	for _, en := range entries {
		out = append(out, en.Name())
	}
	return out
}

func TestE2EImageImportRunRemove(t *testing.T) {
	e := newE2E(t)
	dir := t.TempDir()

	// The store exists from the start, root's and private.
	if fi, err := os.Stat(filepath.Join(e.d.StateDir, "images")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("image store: %v %v; want a 0700 directory made by serve", fi, err)
	}
	// Two layers: the busybox rootfs, then one that whites out a file of the
	// first and adds one, so the sandbox sees the layers applied.
	base := e2eDirLayer(t, e.rootfs)
	top := e2eTarLayer(t, [][2]string{{"etc/.wh.group", ""}, {"etc/image-marker", "from layer 2\n"}})
	img := e2eImageOf(t, base, top)
	archive := e2eDockerSave(t, img, filepath.Join(dir, "busybox.tar"))

	out := e.cli("image", "import", "bb", archive)
	digest, _ := img.Digest()
	if out != "imported bb: "+digest.String()+", 2 layers, "+strings.Fields(out)[5]+"\n" || !strings.HasPrefix(out, "imported bb: sha256:") {
		t.Errorf("image import: %q; want imported bb: %s, 2 layers, SIZE", out, digest)
	}
	// The same image from an OCI layout directory.
	layout := filepath.Join(dir, "oci")
	p, err := ocilayout.Write(layout, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	e.cli("image", "import", "bb-oci", layout)

	list := e.images()
	if len(list) != 2 || list[0].Name != "bb" || list[1].Name != "bb-oci" || list[0].Digest != digest.String() ||
		list[0].Format != "docker-archive" || list[1].Format != "oci-archive" || len(list[0].UsedBy) != 0 {
		t.Fatalf("image ls --json: %+v; want bb (docker-archive) and bb-oci (oci-archive), unused", list)
	}

	// A sandbox from the image: busybox runs, the layers are applied.
	info := e.createWith([]string{"--image", "bb"}, "box")
	if info.Image != "bb" || info.Rootfs != list[0].Rootfs {
		t.Errorf("create --image bb: image %q rootfs %q; want bb and %s", info.Image, info.Rootfs, list[0].Rootfs)
	}
	if out := e.cli("session", "exec", "box", "--", "busybox", "echo", "hello from the image"); out != "hello from the image\n" {
		t.Errorf("busybox echo in the image's sandbox: %q", out)
	}
	if out := e.cli("session", "exec", "box", "--", "cat", "/etc/image-marker"); out != "from layer 2\n" {
		t.Errorf("cat /etc/image-marker: %q; want the second layer's file", out)
	}
	if out, _, code := e.run("session", "exec", "box", "--", "test", "-e", "/etc/group"); code != 1 {
		t.Errorf("test -e /etc/group: exit %d %q; want 1 (whited out by layer 2)", code, out)
	}
	e.createWith([]string{"--image", "bb-oci"}, "box2")
	if out := e.cli("session", "exec", "box2", "--", "busybox", "echo", "oci"); out != "oci\n" {
		t.Errorf("busybox echo in the OCI image's sandbox: %q", out)
	}

	// A second import under a taken name is refused before the archive is
	// read; the CLI still gets the daemon's one line.
	if msg := e.expectFail(1, "image", "import", "bb", archive); msg != `enforcerd image import: image "bb": image name taken; remove it first (enforcerd image rm bb) or choose another name` {
		t.Errorf("import under a taken name: %q", msg)
	}

	// Removal is refused while a session uses the image, naming it, and
	// still after a restart (the daemon knows from the session's record).
	if msg := e.expectFail(1, "image", "rm", "bb"); msg != `enforcerd image rm: image "bb": used by session box; remove the session first: image in use` {
		t.Errorf("image rm while used: %q", msg)
	}
	if err := e.d.Stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	if msg := e.expectFail(1, "image", "rm", "bb"); msg != `enforcerd image rm: image "bb": used by session box; remove the session first: image in use` {
		t.Errorf("image rm while used, after a restart: %q", msg)
	}
	if list := e.images(); len(list[0].UsedBy) != 1 || list[0].UsedBy[0] != "box" {
		t.Errorf("image ls: bb used by %v; want [box]", list[0].UsedBy)
	}
	// The session still runs from it.
	if out := e.cli("session", "exec", "box", "--", "busybox", "echo", "still"); out != "still\n" {
		t.Errorf("exec after the refused rm: %q", out)
	}
	e.cli("session", "rm", "box")
	if out := e.cli("image", "rm", "bb"); out != "bb\n" {
		t.Errorf("image rm bb: %q", out)
	}
	if list := e.images(); len(list) != 1 || list[0].Name != "bb-oci" {
		t.Errorf("image ls after rm: %+v; want only bb-oci", list)
	}
	if got := e.storeEntries(); len(got) != 1 || got[0] != "bb-oci" {
		t.Errorf("image store holds %v after rm; want only bb-oci", got)
	}
	msg := e.expectFail(1, "session", "create", "box3", "--image", "bb")
	if msg != `enforcerd session create: image "bb": unknown image (import it with: enforcerd image import bb FILE)` {
		t.Errorf("create from a removed image: %q", msg)
	}
	e.cli("session", "rm", "box2")
	e.cli("image", "rm", "bb-oci")
}

// TestE2EImageHostileRefused: archives that would write outside the image
// are refused with one line naming the entry, and leave nothing in the
// store; the host file they aim at is untouched.
func TestE2EImageHostileRefused(t *testing.T) {
	e := newE2E(t)
	dir := t.TempDir()
	victimDir := filepath.Join(dir, "host")
	if err := os.Mkdir(victimDir, 0o755); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(victimDir, "victim")
	if err := os.WriteFile(victim, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	good := e2eTarLayer(t, [][2]string{{"bin/", ""}, {"bin/sh", "x"}})
	for _, tc := range []struct {
		name  string
		layer []byte
		want  string
	}{
		{"dotdot", e2eTarLayer(t, [][2]string{{"../../escape", "x"}}), `entry "../../escape": '..' in the path: path leaves the image`},
		{"absolute", e2eTarLayer(t, [][2]string{{victim, "pwned"}}), `entry "` + victim + `": absolute path`},
		{"symlink-out", e2eTarLayer(t, [][2]string{{"out", "->" + victimDir}, {"out/victim", "pwned"}}), `entry "out/victim": directory "out": a symlink in it leads out of the image`},
		{"relative-symlink-out", e2eTarLayer(t, [][2]string{{"out", "->../../../../../../../../" + strings.TrimPrefix(victimDir, "/")}, {"out/victim", "pwned"}}), `entry "out/victim": directory "out": a symlink in it leads out of the image`},
	} {
		archive := e2eDockerSave(t, e2eImageOf(t, good, tc.layer), filepath.Join(dir, tc.name+".tar"))
		msg := e.expectFail(1, "image", "import", "evil", archive)
		if !strings.HasPrefix(msg, `enforcerd image import: image "evil": layer 2 of 2 (sha256:`) || !strings.Contains(msg, tc.want) || !strings.HasSuffix(msg, "; nothing was kept") {
			t.Errorf("%s: %q; want one line with %q", tc.name, msg, tc.want)
		}
		if got := e.storeEntries(); len(got) != 0 {
			t.Errorf("%s: image store holds %v; want nothing", tc.name, got)
		}
		if b, err := os.ReadFile(victim); err != nil || string(b) != "host" {
			t.Errorf("%s: host file %q %v; want untouched", tc.name, b, err)
		}
	}
	// Positive control: the same base layer alone imports under that name.
	archive := e2eDockerSave(t, e2eImageOf(t, good), filepath.Join(dir, "good.tar"))
	e.cli("image", "import", "evil", archive)
	e.cli("image", "rm", "evil")
}
