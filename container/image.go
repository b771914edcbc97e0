package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ResolveImage returns the real path (symlinks resolved) of rootfs when it is an image the
// operator granted: a directory strictly inside one of imagesDirs, where the image directory and
// every directory from it down to rootfs belong to root and are writable by root only, and every
// directory above the image directory belongs to root and is not writable by others unless
// sticky. Anything else is refused with one line naming rootfs: the host's root, a path outside
// every image directory (after symlinks and ".."), or a tree someone else could change. Without
// imagesDirs every rootfs is refused.
//
// Why the whole chain: a caller of the API is not the operator. If any directory on the way were
// theirs, they could swap it for a symlink to / between this check and the mount. Root-owned,
// root-writable directories can only change under root. Above the image directory a sticky,
// world-writable directory such as /tmp is accepted: nobody but root can rename a root-owned
// entry in it.
//
// Callers use the returned path, not rootfs, so the directory mounted is the one checked.
func ResolveImage(rootfs string, imagesDirs []string) (string, error) {
	return resolveImage(rootfs, imagesDirs, isRoot)
}

func isRoot(uid uint32) bool { return uid == 0 }

// lexicallyInside reports whether the clean absolute path p is one of dirs
// or below one, by its text alone.
func lexicallyInside(p string, dirs []string) bool {
	for _, d := range dirs {
		d = filepath.Clean(d)
		if p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/") {
			return true
		}
	}
	return false
}

// resolveImage is ResolveImage with the test of a trusted owner (root in production; unit tests,
// which cannot chown, add their own uid).
func resolveImage(rootfs string, imagesDirs []string, trusted func(uid uint32) bool) (string, error) {
	if len(imagesDirs) == 0 {
		return "", fmt.Errorf("rootfs %q: no image directory is configured; the operator must start serve with --images-dir DIR to allow sandboxes", rootfs)
	}
	if !filepath.IsAbs(rootfs) {
		return "", fmt.Errorf("rootfs %q: not an absolute path; want the image directory's absolute path", rootfs)
	}
	// Lexically outside every image directory: refused before the path is
	// looked at, so a caller learns nothing about directories not granted
	// (whether they exist). Symlinks inside are resolved and checked below.
	if filepath.Clean(rootfs) == "/" {
		return "", fmt.Errorf("rootfs %q: the host's root directory is never an image", rootfs)
	}
	if !lexicallyInside(filepath.Clean(rootfs), imagesDirs) {
		return "", fmt.Errorf("rootfs %q: not inside an image directory (%s); want an image imported (enforcerd image import) or a directory under serve's --images-dir", rootfs, strings.Join(imagesDirs, ", "))
	}
	real, err := filepath.EvalSymlinks(rootfs)
	if err != nil {
		return "", fmt.Errorf("rootfs %q: %w", rootfs, pathErr(err))
	}
	if real == "/" {
		return "", fmt.Errorf("rootfs %q: the host's root directory is never an image", rootfs)
	}
	for _, d := range imagesDirs {
		root, err := filepath.EvalSymlinks(d)
		if err != nil {
			continue // a missing image directory grants nothing
		}
		if real == root {
			return "", fmt.Errorf("rootfs %q: is the image directory %s itself; want an image inside it", rootfs, d)
		}
		rel, err := filepath.Rel(root, real)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			continue
		}
		if err := checkImageChain(root, real, trusted); err != nil {
			return "", fmt.Errorf("rootfs %q: %w", rootfs, err)
		}
		return real, nil
	}
	return "", fmt.Errorf("rootfs %q: not inside an image directory (%s); want an image imported (enforcerd image import) or a directory under serve's --images-dir", rootfs, strings.Join(imagesDirs, ", "))
}

// checkImageChain checks the directories from / down to real (root is an ancestor of real, both
// without symlinks): above root, owned by a trusted uid and not writable by others unless
// sticky; from root down, owned by a trusted uid and writable by the owner only.
func checkImageChain(root, real string, trusted func(uid uint32) bool) error {
	for d := real; ; d = filepath.Dir(d) {
		inside := d == root || strings.HasPrefix(d, root+"/")
		if err := checkImageDir(d, trusted, inside); err != nil {
			return err
		}
		if d == "/" {
			return nil
		}
	}
}

func checkImageDir(d string, trusted func(uid uint32) bool, strict bool) error {
	fi, err := os.Lstat(d)
	if err != nil {
		return pathErr(err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", d)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no owner information", d)
	}
	if !trusted(st.Uid) {
		return fmt.Errorf("%s is owned by uid %d, not root; every directory from / down to the image must belong to root", d, st.Uid)
	}
	perm := fi.Mode().Perm()
	switch {
	case strict && perm&0o022 != 0:
		return fmt.Errorf("%s is writable by group or others (mode %#o); an image and its image directory must be writable by root only", d, perm)
	case !strict && perm&0o002 != 0 && fi.Mode()&os.ModeSticky == 0:
		return fmt.Errorf("%s is writable by others (mode %#o) and not sticky; anyone could replace the image directory below it", d, perm)
	}
	return nil
}

// pathErr drops the path from an *os.PathError (the caller names the value already).
func pathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
