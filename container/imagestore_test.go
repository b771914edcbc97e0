package container

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/enforcerd/enforcerd/container/rules"
)

// requireRoot: the unpacker gives files the image's owners, which takes root. Under CI=true a
// missing root fails the test.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("image import tests need root (they chown to the image's owners)")
	}
	t.Skip("needs root")
}

// entry is one tar entry of a test layer.
type entry struct {
	name, link string
	typ        byte
	mode       int64
	uid        int
	body       string
	size       int64 // for a regular file without body: that many zero bytes
}

func file(name, body string) entry {
	return entry{name: name, typ: tar.TypeReg, mode: 0o644, body: body}
}
func dir(name string) entry { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, to string) entry {
	return entry{name: name, typ: tar.TypeSymlink, mode: 0o777, link: to}
}
func hardlink(name, to string) entry {
	return entry{name: name, typ: tar.TypeLink, mode: 0o644, link: to}
}

func layerTar(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.uid,
			ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		var body io.Reader = strings.NewReader(e.body)
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
			if e.size > 0 {
				hdr.Size, body = e.size, io.LimitReader(zeroReader{}, e.size)
			}
		}
		if e.typ == tar.TypeChar {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Size > 0 {
			if _, err := io.Copy(tw, body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// testImage is an image of the given layers (each a list of entries), built in memory.
func testImage(t *testing.T, layers ...[]entry) v1.Image {
	t.Helper()
	img := empty.Image
	for _, l := range layers {
		data := layerTar(t, l...)
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Config.Env, cf.Config.Cmd = "linux", []string{"PATH=/bin"}, []string{"/bin/sh"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// dockerArchive is img as `docker save` writes it.
func dockerArchive(t *testing.T, img v1.Image) []byte {
	t.Helper()
	tag, err := name.NewTag("example.org/test/image:1")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tarball.Write(tag, img, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// ociArchive is img in an OCI image layout, tarred by TarLayout.
func ociArchive(t *testing.T, img v1.Image) []byte {
	t.Helper()
	dir := t.TempDir()
	p, err := ocilayout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rules.TarLayout(dir, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func newStore(t *testing.T, limits UnpackLimits) *ImageStore {
	t.Helper()
	s, err := OpenImageStore(filepath.Join(t.TempDir(), "images"), limits)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// storeNames lists everything in the store's directory, hidden entries included.
func storeNames(t *testing.T, s *ImageStore) []string {
	t.Helper()
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// goodLayers: a base layer and one that whites out, makes a directory opaque and writes
// through an in-image symlink.
func goodLayers() [][]entry {
	suid := file("bin/su", "#!su")
	suid.mode, suid.uid = 0o4755, 1000
	dev := entry{name: "dev/null", typ: tar.TypeChar, mode: 0o666}
	fifo := entry{name: "run/fifo", typ: tar.TypeFifo, mode: 0o640}
	base := []entry{
		dir("bin/"), suid, file("bin/sh", "#!sh"), hardlink("bin/sh-link", "bin/sh"),
		dir("usr/"), dir("usr/lib/"), symlink("lib", "usr/lib"), symlink("abs", "/usr/lib"),
		dir("etc/"), file("etc/gone", "x"), file("etc/kept", "k"),
		dir("opq/"), file("opq/old", "o"), dir("opq/sub/"), file("opq/sub/deep", "d"),
		dir("dev/"), dev, dir("run/"), fifo,
		file("./dot-slash", "ok"),
	}
	top := []entry{
		file("etc/.wh.gone", ""), file("opq/new", "n"), file("opq/.wh..wh..opq", ""),
		file("lib/through-symlink", "t"), file("bin/sh", "#!sh2"),
	}
	return [][]entry{base, top}
}

func TestImportAppliesLayers(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		format  string
		archive func(*testing.T, v1.Image) []byte
	}{{FormatDockerArchive, dockerArchive}, {FormatOCIArchive, ociArchive}} {
		t.Run(tc.format, func(t *testing.T) {
			s := newStore(t, UnpackLimits{})
			img := testImage(t, goodLayers()...)
			meta, err := s.Import("box", "box.tar", bytes.NewReader(tc.archive(t, img)))
			if err != nil {
				t.Fatal(err)
			}
			want, _ := img.Digest()
			if meta.Format != tc.format || meta.Digest != want.String() || meta.Layers != 2 || meta.SkippedDevices != 1 || meta.Source != "box.tar" {
				t.Errorf("meta = %+v; want format %s, digest %s, 2 layers, 1 skipped device", meta, tc.format, want)
			}
			if len(meta.Cmd) != 1 || meta.Cmd[0] != "/bin/sh" || len(meta.Env) != 1 {
				t.Errorf("meta config = env %v cmd %v; want the image's", meta.Env, meta.Cmd)
			}
			root := s.Rootfs("box")
			read := func(p string) string {
				b, err := os.ReadFile(filepath.Join(root, p))
				if err != nil {
					return "<" + err.Error() + ">"
				}
				return string(b)
			}
			for p, want := range map[string]string{
				"etc/kept": "k", "opq/new": "n", "usr/lib/through-symlink": "t", "bin/sh": "#!sh2", "dot-slash": "ok",
			} {
				if got := read(p); got != want {
					t.Errorf("%s = %q; want %q", p, got, want)
				}
			}
			for _, p := range []string{"etc/gone", "etc/.wh.gone", "opq/old", "opq/sub", "opq/.wh..wh..opq", "dev/null"} {
				if _, err := os.Lstat(filepath.Join(root, p)); !os.IsNotExist(err) {
					t.Errorf("%s: want absent (whiteout, opaque dir or device node), got err %v", p, err)
				}
			}
			fi, err := os.Lstat(filepath.Join(root, "bin/su"))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode()&os.ModeSetuid == 0 || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
				t.Errorf("bin/su: mode %v uid %d; want setuid kept, uid 1000", fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
			}
			for link, to := range map[string]string{"lib": "usr/lib", "abs": "/usr/lib"} {
				if got, err := os.Readlink(filepath.Join(root, link)); err != nil || got != to {
					t.Errorf("%s: symlink to %q (%v); want kept as a symlink to %q", link, got, err, to)
				}
			}
			// The hard link was made in the base layer; the top layer replaced bin/sh, so
			// the link keeps the old content, as in a container runtime.
			if got := read("bin/sh-link"); got != "#!sh" {
				t.Errorf("bin/sh-link = %q; want the base layer's #!sh", got)
			}
			if fi, err := os.Lstat(filepath.Join(root, "run/fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 || fi.Mode().Perm() != 0o640 {
				t.Errorf("run/fifo: %v %v; want a fifo, mode 0640", fi, err)
			}
			if _, err := ResolveImage(root, []string{s.Dir}); err != nil {
				t.Errorf("ResolveImage of the imported rootfs: %v", err)
			}
			if names := storeNames(t, s); len(names) != 1 || names[0] != "box" {
				t.Errorf("store holds %v; want only box", names)
			}
			list, err := s.List()
			if err != nil || len(list) != 1 || list[0].Name != "box" || list[0].Digest != meta.Digest {
				t.Errorf("List = %+v, %v; want box", list, err)
			}
		})
	}
}

// TestImportHardLinkInSameLayer: a link to a file made earlier in the same layer shares its
// inode.
func TestImportHardLinkInSameLayer(t *testing.T) {
	requireRoot(t)
	s := newStore(t, UnpackLimits{})
	img := testImage(t, []entry{dir("bin/"), file("bin/a", "A"), hardlink("bin/b", "bin/a")})
	if _, err := s.Import("links", "l.tar", bytes.NewReader(dockerArchive(t, img))); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(s.Rootfs("links"), "bin/a"))
	b, _ := os.Stat(filepath.Join(s.Rootfs("links"), "bin/b"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Errorf("bin/b is not a hard link of bin/a")
	}
}

// TestImportRefusesHostile: each hostile archive is refused with one line naming the bad entry
// and leaves nothing in the store; the control, the same shape without the hostile entry,
// imports.
func TestImportRefusesHostile(t *testing.T) {
	requireRoot(t)
	// A host file the archives aim at; it must survive each of them.
	host := t.TempDir()
	victim := filepath.Join(host, "victim")
	if err := os.WriteFile(victim, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	deep := strings.Repeat("../", 12)
	dev := entry{name: "bin/sda", typ: tar.TypeChar, mode: 0o600}
	big := file("bin/big", "")
	big.size = 2 << 20
	many := []entry{dir("bin/")}
	for i := range 20 {
		many = append(many, file("bin/f"+string(rune('a'+i)), "x"))
	}
	for _, tc := range []struct {
		name    string
		layers  [][]entry
		limits  UnpackLimits
		want    string // in the one-line error
		control bool   // imports: the positive control
	}{
		{name: "control", layers: [][]entry{{dir("bin/"), file("bin/sh", "x"), symlink("bin/up", "../etc"), dev}}, control: true},
		{name: "dotdot", layers: [][]entry{{dir("bin/"), file("../escape", "x")}}, want: `entry "../escape": '..' in the path: path leaves the image`},
		{name: "dotdot-inside", layers: [][]entry{{dir("bin/"), file("bin/../../escape", "x")}}, want: `entry "bin/../../escape": '..' in the path`},
		{name: "absolute", layers: [][]entry{{file(victim, "pwned")}}, want: `entry "` + victim + `": absolute path: path leaves the image`},
		{name: "absolute-symlink-then-write", layers: [][]entry{{symlink("out", host), file("out/victim", "pwned")}}, want: `entry "out/victim": directory "out": a symlink in it leads out of the image`},
		{name: "absolute-symlink-next-layer", layers: [][]entry{{symlink("out", host)}, {file("out/new", "pwned")}}, want: `layer 2 of 2`},
		{name: "relative-symlink-escape-then-write", layers: [][]entry{{dir("bin/"), symlink("bin/out", deep+strings.TrimPrefix(host, "/")), file("bin/out/victim", "pwned")}}, want: `entry "bin/out/victim": directory "bin/out": a symlink in it leads out of the image`},
		{name: "whiteout-through-symlink", layers: [][]entry{{symlink("out", host)}, {file("out/.wh.victim", "")}}, want: `entry "out/.wh.victim": directory "out": a symlink in it leads out`},
		{name: "opaque-through-symlink", layers: [][]entry{{symlink("out", host)}, {file("out/.wh..wh..opq", "")}}, want: `entry "out/.wh..wh..opq": directory "out": a symlink in it leads out`},
		{name: "hardlink-absolute", layers: [][]entry{{hardlink("shadow", "/etc/shadow")}}, want: `entry "shadow": hard link to "/etc/shadow": absolute path`},
		{name: "hardlink-dotdot", layers: [][]entry{{hardlink("shadow", deep+"etc/shadow")}}, want: `entry "shadow": hard link to "` + deep + `etc/shadow": '..' in the path`},
		{name: "hardlink-through-symlink", layers: [][]entry{{symlink("etc", "/etc"), hardlink("shadow", "etc/shadow")}}, want: `entry "shadow": hard link to "etc/shadow": directory "etc": a symlink in it leads out of the image`},
		{name: "hardlink-missing", layers: [][]entry{{hardlink("shadow", "etc/shadow")}}, want: `hard link to "etc/shadow": directory "etc": no such file or directory`},
		{name: "hardlink-not-yet", layers: [][]entry{{dir("etc/"), hardlink("etc/l", "etc/later"), file("etc/later", "x")}}, want: `entry "etc/l": hard link to "etc/later": no such file in the image`},
		{name: "whiteout-dotdot", layers: [][]entry{{dir("bin/"), file("bin/.wh..", "")}}, want: `entry "bin/.wh..": whiteout of ".": not a name`},
		{name: "tar-bomb-bytes", layers: [][]entry{{dir("bin/"), big}}, limits: UnpackLimits{MaxBytes: 1 << 20}, want: `entry "bin/big": 2097152 bytes, the image would unpack to more than 1048576 bytes: over the unpack limit`},
		{name: "tar-bomb-entries", layers: [][]entry{many}, limits: UnpackLimits{MaxEntries: 10}, want: `more than 10 entries: over the unpack limit`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.limits)
			archive := dockerArchive(t, testImage(t, tc.layers...))
			_, err := s.Import("hostile", "h.tar", bytes.NewReader(archive))
			if tc.control {
				if err != nil {
					t.Fatalf("control: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("imported; want refused with %q", tc.want)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") || !strings.Contains(msg, tc.want) || !strings.HasPrefix(msg, `image "hostile": layer `) || !strings.HasSuffix(msg, "nothing was kept") {
				t.Errorf("error %q; want one line with %q", msg, tc.want)
			}
			if names := storeNames(t, s); len(names) != 0 {
				t.Errorf("store holds %v after a refused import; want nothing", names)
			}
			if b, err := os.ReadFile(victim); err != nil || string(b) != "host" {
				t.Errorf("host file: %q %v; want untouched", b, err)
			}
			if entries, _ := os.ReadDir(host); len(entries) != 1 {
				t.Errorf("host dir holds %d entries; want only the victim", len(entries))
			}
		})
	}
}

func TestImportRefusesNonArchives(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name, body, want string
	}{
		{"empty", "", `image "x": f: not a tar archive (no entries)`},
		{"text", strings.Repeat("not a tar ", 100), `image "x": f: not a tar archive`},
		{"plain-tar", string(layerTar(t, file("a", "b"))), `image "x": f: not an image archive: want a docker save archive (with manifest.json) or an OCI image layout (with oci-layout and index.json)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, UnpackLimits{})
			_, err := s.Import("x", "f", strings.NewReader(tc.body))
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("err %v; want %q", err, tc.want)
			}
			if names := storeNames(t, s); len(names) != 0 {
				t.Errorf("store holds %v; want nothing", names)
			}
		})
	}
}

func TestImportNamesAndRemove(t *testing.T) {
	requireRoot(t)
	s := newStore(t, UnpackLimits{})
	archive := dockerArchive(t, testImage(t, []entry{dir("bin/"), file("bin/sh", "x")}))
	for _, bad := range []string{"", "UPPER", ".hidden", "a/b", "..", "a:b", strings.Repeat("a", 64)} {
		_, err := s.Import(bad, "f", bytes.NewReader(archive))
		if err == nil || !strings.HasPrefix(err.Error(), "image name "+strconvQuote(bad)+": want 1 to 63") {
			t.Errorf("name %q: err %v; want refused naming it", bad, err)
		}
	}
	if _, err := s.Import("ok-1.2_x", "f", bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	_, err := s.Import("ok-1.2_x", "f", bytes.NewReader(archive))
	if err == nil || err.Error() != `image "ok-1.2_x": image name taken; remove it first (enforcerd image rm ok-1.2_x) or choose another name` {
		t.Errorf("second import: %v; want name taken", err)
	}
	trash, err := s.Detach("ok-1.2_x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ResolveImage(s.Rootfs("ok-1.2_x"), []string{s.Dir}); err == nil {
		t.Error("a detached image still resolves")
	}
	if err := s.Purge(trash); err != nil {
		t.Fatal(err)
	}
	if names := storeNames(t, s); len(names) != 0 {
		t.Errorf("store holds %v after remove; want nothing", names)
	}
	if _, err := s.Detach("ok-1.2_x"); err == nil || !strings.Contains(err.Error(), "unknown image") {
		t.Errorf("detach twice: %v; want unknown image", err)
	}
}

// TestOpenImageStoreCleansLeftovers: what a crashed import or removal left is gone at open; a
// store others can write to is refused.
func TestOpenImageStoreCleansLeftovers(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "images")
	for _, d := range []string{dir, filepath.Join(dir, ".import-x-1"), filepath.Join(dir, ".rm-y-2"), filepath.Join(dir, "keep")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	s, err := OpenImageStore(dir, UnpackLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if names := storeNames(t, s); len(names) != 1 || names[0] != "keep" {
		t.Errorf("store holds %v; want only keep", names)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenImageStore(dir, UnpackLimits{}); err == nil || !strings.Contains(err.Error(), "writable by group or others (mode 0777)") {
		t.Errorf("open of a 0777 store: %v; want refused", err)
	}
}

func strconvQuote(s string) string { return `"` + s + `"` }
