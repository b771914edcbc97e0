package container

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// UnpackLimits bound what one import may write; zero fields take the defaults below. They stop
// a tar bomb (an archive of a few KiB that unpacks into terabytes or millions of inodes) before
// it fills the daemon's filesystem.
type UnpackLimits struct {
	MaxBytes   int64 // bytes of regular file content over all layers (DefaultMaxImageBytes)
	MaxEntries int64 // tar entries over all layers (DefaultMaxImageEntries)
}

// The default unpack limits: large enough for a toolbox image (a Kali or CUDA image is 5 to
// 20 GiB, about 200,000 files), small enough to stop a bomb before the disk is full.
const (
	DefaultMaxImageBytes   = 64 << 30
	DefaultMaxImageEntries = 4 << 20
)

func (l UnpackLimits) withDefaults() UnpackLimits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxImageBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxImageEntries
	}
	return l
}

// unpacker applies image layers, in order, to one root directory. Every file it makes is made
// relative to a directory fd that was opened beneath the root with openat2(RESOLVE_BENEATH), so
// no entry can reach outside the root: not by "..", not by an absolute name, not through a
// symlink an earlier entry made (the kernel refuses any resolution that leaves the root, an
// absolute symlink included, with EXDEV). Nothing else writes into the root while it is
// unpacked (a new directory in the root-only store), so the checks cannot race.
//
// Policy, as a container runtime applies it to an image:
//   - whiteouts: ".wh.NAME" removes NAME from the layers below; ".wh..wh..opq" in a directory
//     hides everything the layers below put there (what this layer puts there stays);
//   - owners, modes (setuid, setgid and sticky bits included) and modification times are kept
//     as the image has them; extended attributes (file capabilities) are not applied;
//   - symlinks are kept as symlinks, whatever they point to: they are resolved inside the
//     sandbox, under its own root, never by the unpacker;
//   - a hard link must name a file of the image already unpacked (a directory is refused);
//   - device nodes (character and block) are skipped and counted: the sandbox gets its /dev
//     from the runtime and its root is mounted nodev, so an image's device node could never be
//     opened in it, and one left in the store would be a host device node readable by its
//     owner; fifos are made;
//   - the entry names "..", absolute names, and entries whose directory is a symlink leading
//     out of the root are refused, and so is every entry type a layer does not hold (sparse
//     files, tape continuations).
type unpacker struct {
	root    *os.File // the image's root directory
	limits  UnpackLimits
	bytes   int64 // regular file content written so far
	entries int64
	devices int // device nodes skipped

	layer map[string]bool // the paths the current layer made (an opaque dir keeps them)
}

// entryError is the one line an import fails with: the entry that was refused and why.
type entryError struct {
	name string
	err  error
}

func (e *entryError) Error() string { return fmt.Sprintf("entry %q: %v", e.name, e.err) }
func (e *entryError) Unwrap() error { return e.err }

var (
	errLeavesImage = errors.New("path leaves the image")
	errOverLimit   = errors.New("over the unpack limit")
)

// applyLayer applies one layer's tar stream to the root.
func (u *unpacker) applyLayer(r io.Reader) error {
	u.layer = map[string]bool{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read layer: %w", err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		if err := u.applyEntry(hdr, tr); err != nil {
			return &entryError{name: hdr.Name, err: err}
		}
	}
}

// cleanEntryName returns the entry's path relative to the root ("." for the root itself), or
// errLeavesImage for an absolute name or one with a ".." element.
func cleanEntryName(name string) (string, error) {
	if name == "" {
		return "", errors.New("empty name")
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("absolute path: %w", errLeavesImage)
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", fmt.Errorf("'..' in the path: %w", errLeavesImage)
		}
	}
	return path.Clean(name), nil
}

func (u *unpacker) applyEntry(hdr *tar.Header, body io.Reader) error {
	u.entries++
	if u.entries > u.limits.MaxEntries {
		return fmt.Errorf("more than %d entries: %w", u.limits.MaxEntries, errOverLimit)
	}
	rel, err := cleanEntryName(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "." {
		return nil // the root's own owner and mode are the store's (root, 0755)
	}
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}

	if strings.HasPrefix(base, ".wh.") {
		return u.whiteout(dir, base)
	}
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		u.devices++
		return nil
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	default:
		return fmt.Errorf("entry type %q: not supported in an image layer", hdr.Typeflag)
	}

	parent, err := u.mkdirAll(dir)
	if err != nil {
		return err
	}
	defer parent.Close()
	pfd := int(parent.Fd())

	// What an earlier layer (or entry) put at this name is replaced, except a directory by a
	// directory: that one is kept, its owner and mode updated.
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if !(hdr.Typeflag == tar.TypeDir && st.Mode&unix.S_IFMT == unix.S_IFDIR) {
			if err := removeAllAt(pfd, base); err != nil {
				return fmt.Errorf("replace the earlier entry: %w", err)
			}
		}
	} else if !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("stat: %w", err)
	}
	u.layer[rel] = true

	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir: %w", err)
		}
		fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open the directory: %w", err)
		}
		defer unix.Close(fd)
		return setOwnerModeTimes(fd, hdr, mode)
	case tar.TypeReg:
		if hdr.Size > u.limits.MaxBytes-u.bytes {
			return fmt.Errorf("%d bytes, the image would unpack to more than %d bytes: %w", hdr.Size, u.limits.MaxBytes, errOverLimit)
		}
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		f := os.NewFile(uintptr(fd), base)
		defer f.Close()
		n, err := io.Copy(f, io.LimitReader(body, hdr.Size))
		u.bytes += n
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if n != hdr.Size {
			return fmt.Errorf("truncated: %d of %d bytes", n, hdr.Size)
		}
		return setOwnerModeTimes(fd, hdr, mode)
	case tar.TypeSymlink:
		if hdr.Linkname == "" {
			return errors.New("symlink with an empty target")
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
		ts := []unix.Timespec{unix.NsecToTimespec(modNanos(hdr)), unix.NsecToTimespec(modNanos(hdr))}
		if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("set times: %w", err)
		}
		return nil
	case tar.TypeLink:
		return u.hardLink(hdr.Linkname, pfd, base)
	case tar.TypeFifo:
		if err := unix.Mkfifoat(pfd, base, 0o600); err != nil {
			return fmt.Errorf("mkfifo: %w", err)
		}
		// A fifo cannot be opened without a reader; the name was made just now, in a
		// directory nobody else writes to.
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
		if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
		return nil
	}
	return nil
}

// setOwnerModeTimes applies the entry's owner, then its mode (a chown clears the setuid and
// setgid bits, so the mode goes second), then its times, to an open file.
func setOwnerModeTimes(fd int, hdr *tar.Header, mode uint32) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	tv := []unix.Timeval{unix.NsecToTimeval(modNanos(hdr)), unix.NsecToTimeval(modNanos(hdr))}
	if err := unix.Futimes(fd, tv); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

// modNanos is the entry's modification time in ns since the epoch; 0 (the epoch) when the
// archive gives none or one before it.
func modNanos(hdr *tar.Header) int64 {
	if hdr.ModTime.Unix() <= 0 {
		return 0
	}
	return hdr.ModTime.UnixNano()
}

// hardLink links base in the directory pfd to target, a file of the image already unpacked.
func (u *unpacker) hardLink(target string, pfd int, base string) error {
	rel, err := cleanEntryName(target)
	if err != nil {
		return fmt.Errorf("hard link to %q: %w", target, err)
	}
	if rel == "." {
		return fmt.Errorf("hard link to %q: the image's root is a directory", target)
	}
	tdir, tbase := path.Split(rel)
	tparent, err := u.openBeneath(strings.TrimSuffix(tdir, "/"))
	if err != nil {
		return fmt.Errorf("hard link to %q: %w", target, err)
	}
	defer tparent.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(int(tparent.Fd()), tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("hard link to %q: no such file in the image (a link must follow its target)", target)
		}
		return fmt.Errorf("hard link to %q: %w", target, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("hard link to %q: a directory", target)
	}
	if err := unix.Linkat(int(tparent.Fd()), tbase, pfd, base, 0); err != nil {
		return fmt.Errorf("hard link to %q: %w", target, err)
	}
	return nil
}

// whiteout applies a whiteout entry of directory dir.
func (u *unpacker) whiteout(dir, base string) error {
	d, err := u.openBeneath(dir)
	if errors.Is(err, unix.ENOENT) {
		return nil // nothing below to hide
	}
	if err != nil {
		return err
	}
	defer d.Close()
	if base == ".wh..wh..opq" {
		names, err := d.Readdirnames(-1)
		if err != nil {
			return fmt.Errorf("read the opaque directory: %w", err)
		}
		for _, n := range names {
			if u.layer[path.Join(dir, n)] {
				continue
			}
			if err := removeAllAt(int(d.Fd()), n); err != nil {
				return fmt.Errorf("opaque directory: remove %q: %w", n, err)
			}
		}
		return nil
	}
	name := strings.TrimPrefix(base, ".wh.")
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("whiteout of %q: not a name", name)
	}
	if u.layer[path.Join(dir, name)] {
		return nil // a whiteout hides the layers below, not its own
	}
	if err := removeAllAt(int(d.Fd()), name); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("whiteout: %w", err)
	}
	return nil
}

// openBeneath opens the directory rel (relative to the root, "." for the root) without leaving
// the root: the kernel fails any resolution that would, "..", absolute and escaping symlinks
// alike.
func (u *unpacker) openBeneath(rel string) (*os.File, error) {
	if rel == "" {
		rel = "."
	}
	fd, err := unix.Openat2(int(u.root.Fd()), rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, beneathErr(rel, err)
	}
	return os.NewFile(uintptr(fd), rel), nil
}

func beneathErr(rel string, err error) error {
	switch {
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ELOOP):
		return fmt.Errorf("directory %q: a symlink in it leads out of the image: %w", rel, errLeavesImage)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("directory %q: not a directory", rel)
	}
	return fmt.Errorf("directory %q: %w", rel, err)
}

// mkdirAll opens the directory rel beneath the root, making the missing directories on the way
// (0755, root's: a layer may name a file before, or without, its directory).
func (u *unpacker) mkdirAll(rel string) (*os.File, error) {
	d, err := u.openBeneath(rel)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return d, err
	}
	cur := "."
	for _, el := range strings.Split(rel, "/") {
		next := path.Join(cur, el)
		d, err := u.openBeneath(next)
		if err == nil {
			d.Close()
			cur = next
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return nil, err
		}
		p, err := u.openBeneath(cur)
		if err != nil {
			return nil, err
		}
		err = unix.Mkdirat(int(p.Fd()), el, 0o755)
		p.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("mkdir %q: %w", next, err)
		}
		cur = next
	}
	return u.openBeneath(rel)
}

// removeAllAt removes name in the directory dirfd and, for a directory, everything in it,
// never following a symlink.
func removeAllAt(dirfd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.Unlinkat(dirfd, name, 0)
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	names, err := d.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAllAt(fd, n); err != nil {
				break
			}
		}
	}
	d.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}
