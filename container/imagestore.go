package container

import (
	"archive/tar"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/container/rules"
)

// ImageStore is the daemon's directory of imported images (<state-dir>/images by default):
//
//	DIR/NAME/rootfs      the unpacked root filesystem a session's overlay uses as its lower layer
//	DIR/NAME/image.json  what was imported (ImageMeta)
//	DIR/.import-*        an import under way (removed when it fails, and by OpenImageStore)
//	DIR/.rm-*            an image being removed (likewise)
//
// DIR is root's, 0700: no host user can reach an image, so the setuid files and the owners an
// image brings are only ever seen inside a sandbox. NAME is 0755 and rootfs 0755, root's, so
// ResolveImage accepts DIR/NAME/rootfs with DIR among the image directories. An image appears
// at NAME only whole: it is unpacked under .import-* and renamed into place (RENAME_NOREPLACE),
// and it leaves NAME by a rename too, before it is deleted.
//
// The store does not know which sessions use an image; its one caller (the daemon) checks that
// before Detach, under the lock its creates hold.
type ImageStore struct {
	Dir    string
	Limits UnpackLimits
}

// ErrUnknownImage: no image of that name in the store. ErrImageExists: the name is taken.
var (
	ErrUnknownImage = errors.New("unknown image")
	ErrImageExists  = errors.New("image name taken")
)

// ImageMeta is an image's image.json: written once at import, read by list. Stored on disk:
// keep its fields compatible across upgrades.
type ImageMeta struct {
	Name     string    `json:"name"`
	Digest   string    `json:"digest"` // the image manifest's digest (sha256:...)
	Format   string    `json:"format"` // docker-archive or oci-archive
	Source   string    `json:"source"` // what the importer named (its file name)
	Imported time.Time `json:"imported"`
	Layers   int       `json:"layers"`
	// SizeBytes counts the regular files' content unpacked (hard links once).
	SizeBytes int64 `json:"size_bytes"`
	// SkippedDevices counts the device nodes the layers held and the import skipped.
	SkippedDevices int `json:"skipped_devices,omitempty"`
	// From the image's config, for the operator (a session does not apply them).
	Architecture string   `json:"architecture,omitempty"`
	Env          []string `json:"env,omitempty"`
	WorkingDir   string   `json:"working_dir,omitempty"`
	Entrypoint   []string `json:"entrypoint,omitempty"`
	Cmd          []string `json:"cmd,omitempty"`
	User         string   `json:"user,omitempty"`
}

// The formats Import recognises.
const (
	FormatDockerArchive = "docker-archive" // what `docker save` and `podman save` write
	FormatOCIArchive    = "oci-archive"    // a tar of an OCI image layout
)

const (
	imageMetaFile = "image.json"
	imageRootfs   = "rootfs"
)

// OpenImageStore makes dir (root's, 0700) when it is missing, refuses one anybody but root
// could write to, and removes what an import or a removal cut short by a crash left in it.
//
// An image keeps its setuid-root programs (every distribution image has su, mount and passwd;
// a hostile one has whatever its author put there) on a host filesystem mounted without
// nosuid, so no host user may reach into the store: a store that pre-exists searchable by
// others (an operator's mkdir, a package's default) is made 0700, and so is every image's
// directory (also those imported before this rule), as the layer root is (see privateDir).
// Only the daemon reads an image: it bind-mounts the rootfs into a sandbox's layer dir.
func OpenImageStore(dir string, limits UnpackLimits) (*ImageStore, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("image store %q: want an absolute directory", dir)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("image store: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return nil, fmt.Errorf("image store %s: not a directory", dir)
	case st == nil || st.Uid != 0:
		return nil, fmt.Errorf("image store %s: not owned by root; it must be root's, writable by root only", dir)
	case fi.Mode().Perm()&0o022 != 0:
		return nil, fmt.Errorf("image store %s: writable by group or others (mode %#o); want root-only write (0700)", dir, fi.Mode().Perm())
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if strings.HasPrefix(e.Name(), ".import-") || strings.HasPrefix(e.Name(), ".rm-") {
			if err := os.RemoveAll(p); err != nil {
				return nil, fmt.Errorf("image store: remove leftover %s: %w", e.Name(), err)
			}
			continue
		}
		if _, err := os.Lstat(filepath.Join(p, imageMetaFile)); e.IsDir() && err == nil {
			if err := os.Chmod(p, 0o700); err != nil {
				return nil, fmt.Errorf("image store: %w", err)
			}
		}
	}
	return &ImageStore{Dir: dir, Limits: limits}, nil
}

// Rootfs is the root filesystem directory of the image name (whether or not it exists).
func (s *ImageStore) Rootfs(name string) string { return filepath.Join(s.Dir, name, imageRootfs) }

// Get reads the image's metadata.
func (s *ImageStore) Get(name string) (ImageMeta, error) {
	if err := rules.ValidateImageName(name); err != nil {
		return ImageMeta{}, err
	}
	data, err := os.ReadFile(filepath.Join(s.Dir, name, imageMetaFile))
	if errors.Is(err, os.ErrNotExist) {
		return ImageMeta{}, fmt.Errorf("image %q: %w (import it with: enforcerd image import %s FILE)", name, ErrUnknownImage, name)
	}
	if err != nil {
		return ImageMeta{}, fmt.Errorf("image %q: %w", name, err)
	}
	var m ImageMeta
	if err := json.Unmarshal(data, &m); err != nil {
		return ImageMeta{}, fmt.Errorf("image %q: %s: %w", name, imageMetaFile, err)
	}
	m.Name = name
	return m, nil
}

// List returns the store's images, by name.
func (s *ImageStore) List() ([]ImageMeta, error) {
	entries, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	out := []ImageMeta{}
	for _, e := range entries {
		if !e.IsDir() || rules.ValidateImageName(e.Name()) != nil {
			continue
		}
		m, err := s.Get(e.Name())
		if err != nil {
			continue // not an image (the operator's own directory), or one being removed
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Detach takes the image out of the store by renaming it to a .rm-* directory, which the
// caller then removes with Purge: from the rename on, no create can resolve it.
func (s *ImageStore) Detach(name string) (string, error) {
	if _, err := s.Get(name); err != nil {
		return "", err
	}
	trash := filepath.Join(s.Dir, ".rm-"+name+"-"+randomSuffix())
	if err := os.Rename(filepath.Join(s.Dir, name), trash); err != nil {
		return "", fmt.Errorf("image %q: %w", name, err)
	}
	return trash, nil
}

// Purge removes what Detach renamed.
func (s *ImageStore) Purge(trash string) error {
	if !strings.HasPrefix(filepath.Base(trash), ".rm-") || filepath.Dir(trash) != s.Dir {
		return fmt.Errorf("purge %q: not a detached image of the store", trash)
	}
	return os.RemoveAll(trash)
}

func randomSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Import unpacks the image archive read from r (a docker save archive or a tar of an OCI image
// layout, told apart by their index files) as the image name. source is what the importer
// named, kept in the metadata. It fails with one line naming what was refused (the entry and
// the layer) and then leaves nothing in the store.
func (s *ImageStore) Import(name, source string, r io.Reader) (meta ImageMeta, err error) {
	if err := rules.ValidateImageName(name); err != nil {
		return meta, err
	}
	final := filepath.Join(s.Dir, name)
	if _, err := os.Lstat(final); err == nil {
		return meta, fmt.Errorf("image %q: %w; remove it first (enforcerd image rm %s) or choose another name", name, ErrImageExists, name)
	}
	tmp, err := os.MkdirTemp(s.Dir, ".import-"+name+"-")
	if err != nil {
		return meta, fmt.Errorf("image %q: %w", name, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	limits := s.Limits.withDefaults()

	archive := filepath.Join(tmp, "archive.tar")
	if err := saveArchive(archive, r, limits.MaxBytes); err != nil {
		return meta, fmt.Errorf("image %q: %w", name, err)
	}
	img, format, err := openArchive(archive, filepath.Join(tmp, "layout"))
	if err != nil {
		return meta, fmt.Errorf("image %q: %s: %w", name, source, err)
	}
	meta, err = unpackImage(img, filepath.Join(tmp, imageRootfs), limits)
	if err != nil {
		return meta, fmt.Errorf("image %q: %w; nothing was kept", name, err)
	}
	meta.Name, meta.Format, meta.Source, meta.Imported = name, format, source, time.Now().UTC()
	for _, p := range []string{archive, filepath.Join(tmp, "layout")} {
		if err := os.RemoveAll(p); err != nil {
			return meta, fmt.Errorf("image %q: %w", name, err)
		}
	}
	data, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return meta, err
	}
	if err := os.WriteFile(filepath.Join(tmp, imageMetaFile), append(data, '\n'), 0o644); err != nil {
		return meta, fmt.Errorf("image %q: %w", name, err)
	}
	if err := os.Chmod(tmp, 0o700); err != nil { // root's only: see OpenImageStore
		return meta, fmt.Errorf("image %q: %w", name, err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return meta, fmt.Errorf("image %q: %w; remove it first (enforcerd image rm %s) or choose another name", name, ErrImageExists, name)
		}
		return meta, fmt.Errorf("image %q: %w", name, err)
	}
	return meta, nil
}

// saveArchive copies the upload to file, at most max bytes.
func saveArchive(file string, r io.Reader, max int64) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	n, err := io.Copy(f, io.LimitReader(r, max+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("read the archive: %w", err)
	}
	if n > max {
		return fmt.Errorf("archive larger than %d bytes", max)
	}
	return nil
}

// openArchive recognises the archive at path and opens its image: a docker save archive (it
// holds manifest.json; Docker 25 and later write an OCI layout beside it, the manifest wins) or
// an OCI image layout (oci-layout and index.json), which is unpacked to layoutDir first.
func openArchive(file, layoutDir string) (v1.Image, string, error) {
	names, err := tarNames(file)
	if err != nil {
		return nil, "", err
	}
	switch {
	case names["manifest.json"]:
		opener := func() (io.ReadCloser, error) { return os.Open(file) }
		m, err := tarball.LoadManifest(opener)
		if err != nil {
			return nil, "", fmt.Errorf("docker archive: %w", err)
		}
		if len(m) != 1 {
			return nil, "", fmt.Errorf("docker archive holds %d images; want one (save one image per file)", len(m))
		}
		img, err := tarball.Image(opener, nil)
		if err != nil {
			return nil, "", fmt.Errorf("docker archive: %w", err)
		}
		return img, FormatDockerArchive, nil
	case names["index.json"] && names["oci-layout"]:
		if err := extractLayout(file, layoutDir); err != nil {
			return nil, "", fmt.Errorf("oci archive: %w", err)
		}
		idx, err := ocilayout.ImageIndexFromPath(layoutDir)
		if err != nil {
			return nil, "", fmt.Errorf("oci archive: %w", err)
		}
		img, err := pickImage(idx, 0)
		if err != nil {
			return nil, "", fmt.Errorf("oci archive: %w", err)
		}
		return img, FormatOCIArchive, nil
	}
	return nil, "", errors.New("not an image archive: want a docker save archive (with manifest.json) or an OCI image layout (with oci-layout and index.json)")
}

// tarNames lists the (cleaned) names of the archive's entries.
func tarNames(file string) (map[string]bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if len(names) == 0 {
				return nil, errors.New("not a tar archive (no entries)")
			}
			return names, nil
		}
		if err != nil {
			return nil, fmt.Errorf("not a tar archive: %w", err)
		}
		names[path.Clean(hdr.Name)] = true
	}
}

// isLayoutBlob reports whether name is blobs/ALG/HEX, a layout's blob path (ALG of a-z0-9, HEX
// 32 to 128 lower-case hex digits).
func isLayoutBlob(name string) bool {
	parts := strings.Split(name, "/")
	if len(parts) != 3 || parts[0] != "blobs" || parts[1] == "" || len(parts[2]) < 32 || len(parts[2]) > 128 {
		return false
	}
	for _, c := range parts[1] {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	for _, c := range parts[2] {
		if !(c >= 'a' && c <= 'f' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// extractLayout unpacks an OCI layout's own files (oci-layout, index.json and
// blobs/ALG/HEX, regular files only) from the archive at path into dir; it skips anything
// else a layout may carry.
func extractLayout(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path2Rel(hdr.Name)
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		if name != "oci-layout" && name != "index.json" && !isLayoutBlob(name) {
			continue
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
}

// path2Rel is a tar name as a relative slash path without a leading "./".
func path2Rel(name string) string {
	return strings.TrimPrefix(path.Clean("/"+name), "/")
}

// pickImage returns the one image an index names: its only image, or, among several, the one
// for linux on this machine's architecture; nested indexes are followed.
func pickImage(idx v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, errors.New("indexes nested too deep")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var cands []v1.Descriptor
	for _, d := range im.Manifests {
		if d.MediaType.IsImage() || d.MediaType.IsIndex() {
			cands = append(cands, d)
		}
	}
	if len(cands) > 1 {
		var mine []v1.Descriptor
		for _, d := range cands {
			if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
				mine = append(mine, d)
			}
		}
		if len(mine) == 0 {
			return nil, fmt.Errorf("the index lists %d images and none for linux/%s", len(cands), runtime.GOARCH)
		}
		cands = mine[:1]
	}
	if len(cands) == 0 {
		return nil, errors.New("the index lists no image")
	}
	if cands[0].MediaType.IsIndex() {
		child, err := idx.ImageIndex(cands[0].Digest)
		if err != nil {
			return nil, err
		}
		return pickImage(child, depth+1)
	}
	return idx.Image(cands[0].Digest)
}

// unpackImage applies the image's layers, in order, to the new directory rootfs.
func unpackImage(img v1.Image, rootfs string, limits UnpackLimits) (ImageMeta, error) {
	var meta ImageMeta
	digest, err := img.Digest()
	if err != nil {
		return meta, fmt.Errorf("image digest: %w", err)
	}
	meta.Digest = digest.String()
	cf, err := img.ConfigFile()
	if err != nil {
		return meta, fmt.Errorf("image config: %w", err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return meta, fmt.Errorf("image config: os %q; want linux", cf.OS)
	}
	if cf.Architecture != "" && cf.Architecture != runtime.GOARCH {
		return meta, fmt.Errorf("image config: architecture %q; want %s, this machine's", cf.Architecture, runtime.GOARCH)
	}
	meta.Architecture = cf.Architecture
	meta.Env, meta.WorkingDir, meta.User = cf.Config.Env, cf.Config.WorkingDir, cf.Config.User
	meta.Entrypoint, meta.Cmd = cf.Config.Entrypoint, cf.Config.Cmd
	layers, err := img.Layers()
	if err != nil {
		return meta, fmt.Errorf("image layers: %w", err)
	}
	meta.Layers = len(layers)

	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return meta, err
	}
	root, err := os.Open(rootfs)
	if err != nil {
		return meta, err
	}
	defer root.Close()
	u := &unpacker{root: root, limits: limits}
	for i, l := range layers {
		if err := applyImageLayer(u, l); err != nil {
			d, _ := l.Digest()
			return meta, fmt.Errorf("layer %d of %d (%s): %w", i+1, len(layers), shortDigest(d), err)
		}
	}
	// The root is the store's, whatever the image's "./" entry said: ResolveImage wants it
	// root's and root-writable only.
	if err := root.Chown(0, 0); err != nil {
		return meta, err
	}
	if err := root.Chmod(0o755); err != nil {
		return meta, err
	}
	meta.SizeBytes, meta.SkippedDevices = u.bytes, u.devices
	return meta, nil
}

func applyImageLayer(u *unpacker, l v1.Layer) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := u.applyLayer(rc); err != nil {
		return err
	}
	// Drain the stream: a layer read from a compressed blob verifies its digest at the end.
	if _, err := io.Copy(io.Discard, rc); err != nil {
		return err
	}
	return rc.Close()
}

func shortDigest(h v1.Hash) string {
	s := h.String()
	if len(s) > 19 {
		return s[:19]
	}
	return s
}
