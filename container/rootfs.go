package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// overlayOptions is the mount data of a sandbox's root: the image as the only lower layer, so
// every write (including the mount points libcontainer creates) lands in the session's upper
// dir and the image is never changed. index=off: the shared lower layer is never tagged.
// volatile: the upper layer is never synced to disk (it dies with the session, and a daemon
// that crashed reaps it), which makes unmounting cost ~1 ms instead of a sync of the whole
// filesystem under LayerDir (~50 ms measured).
func overlayOptions(image string, l layout) (string, error) {
	for _, p := range []string{image, l.upper, l.work} {
		if strings.ContainsAny(p, ",:\\\n") {
			return "", fmt.Errorf("path %q: overlayfs cannot take ',', ':' or '\\' in a layer path; move it", p)
		}
	}
	return fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,volatile", image, l.upper, l.work), nil
}

// prepareLayer makes the sandbox's layer dir, writes its /etc files and mounts its root. On
// error it leaves whatever it made for removeLayer (the caller's rollback) to take away.
func prepareLayer(image string, l layout, spec Spec) error {
	st, err := os.Stat(image)
	if err != nil {
		return fmt.Errorf("rootfs %s: %w", image, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("rootfs %s: not a directory", image)
	}
	opts, err := overlayOptions(image, l)
	if err != nil {
		return err
	}
	if err := os.Mkdir(l.dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("layer dir %s: %w", l.dir, ErrExists)
		}
		return fmt.Errorf("make layer dir %s: %w", l.dir, err)
	}
	if err := privateDir(l.dir, spec.UserNS); err != nil {
		return err
	}
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{l.upper, 0o755}, {l.work, 0o700}, {l.rootfs, 0o755}, {l.etc, 0o755}} {
		if err := os.Mkdir(d.path, d.mode); err != nil {
			return fmt.Errorf("make %s: %w", d.path, err)
		}
	}
	if spec.UserNS && spec.Writable {
		// The merged root takes the upper dir's owner: make it the sandbox's own root.
		if err := os.Chown(l.upper, UserNSHostID, UserNSHostID); err != nil {
			return fmt.Errorf("chown %s: %w", l.upper, err)
		}
	}
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.Name
	}
	files := map[string]string{
		"resolv.conf": resolvConf(spec.DNS),
		"hosts":       hostsFile(hostname, spec.Hosts),
		"hostname":    hostname + "\n",
	}
	for _, f := range etcFiles {
		p := filepath.Join(l.etc, f)
		if err := os.WriteFile(p, []byte(files[f]), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	if err := unix.Mount("overlay", l.rootfs, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", l.rootfs, err)
	}
	return nil
}

// removeLayer unmounts the sandbox's root and removes its layer dir. Idempotent: a missing dir
// or a root that is not mounted is success. It refuses to remove a dir whose root is still a
// mount point, so it never deletes through a live overlay.
func removeLayer(l layout) error {
	for range 8 {
		err := unix.Unmount(l.rootfs, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // not (or no longer) a mount point, or already gone
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", l.rootfs, err)
		}
	}
	mounted, err := isMountPoint(l.rootfs)
	if err != nil {
		return err
	}
	if mounted {
		return fmt.Errorf("remove layer dir %s: %s is still mounted", l.dir, l.rootfs)
	}
	if err := os.RemoveAll(l.dir); err != nil {
		return fmt.Errorf("remove layer dir %s: %w", l.dir, err)
	}
	return nil
}

// isMountPoint reports whether path is mounted on (its device differs from its parent's).
// A missing path is not a mount point.
func isMountPoint(path string) (bool, error) {
	var st, pst unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	if err := unix.Lstat(filepath.Dir(path), &pst); err != nil {
		return false, fmt.Errorf("stat %s: %w", filepath.Dir(path), err)
	}
	return st.Dev != pst.Dev, nil
}

// Host users must never reach what a sandbox writes: a writable sandbox's upper dir holds files
// it made as root, setuid ones included, on a host filesystem mounted without nosuid. (The
// overlay mount itself is nosuid,nodev; the upper dir below it is not a mount.) So the layer
// root and every sandbox's layer dir are private to root, enforced with chmod even when they
// pre-exist with a wider mode. The one exception is the user-namespaced sandbox, whose init runs
// as host uid and gid UserNSHostID while it mounts its root: the layer root, and such a
// sandbox's own layer dir, let that group search them (mode 0710, group UserNSHostID) and
// nobody else. No host account has that gid on a normal system (it is the first subordinate id
// range, see UserNSHostID).

// ensurePrivateDirs makes (or re-modes) the state dir 0700 and the layer root 0710 root:UserNSHostID.
func ensurePrivateDirs(cfg Config) error {
	for _, d := range []string{cfg.StateDir, cfg.LayerDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("make %s: %w", d, err)
		}
	}
	if err := privateDir(cfg.StateDir, false); err != nil {
		return err
	}
	return privateDir(cfg.LayerDir, true)
}

// privateDir gives dir to root with mode 0700, or 0710 with group UserNSHostID when userNS.
func privateDir(dir string, userNS bool) error {
	gid, mode := 0, os.FileMode(0o700)
	if userNS {
		gid, mode = UserNSHostID, 0o710
	}
	if err := os.Chown(dir, 0, gid); err != nil {
		return fmt.Errorf("chown %s: %w", dir, err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	return nil
}

// checkSearchable verifies that every directory from / down to dir lets a user-namespaced
// sandbox's root search it: its init runs as host uid and gid UserNSHostID while it mounts its
// root from the layer dir, and the kernel checks those ids on every path component. A
// directory searchable by others passes, and so does one that group UserNSHostID may search
// (the layer root, see privateDir).
func checkSearchable(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("user namespace: stat %s: %w", d, err)
		}
		byGroup := st.Mode().Perm()&0o010 != 0 && st.Sys().(*syscall.Stat_t).Gid == UserNSHostID
		if st.Mode().Perm()&0o001 == 0 && !byGroup {
			return fmt.Errorf("user namespace: %s (mode %#o) is not searchable by others; the sandbox's root (host uid %d) must reach its layer dir: chmod o+x it", d, st.Mode().Perm(), UserNSHostID)
		}
		if d == "/" {
			return nil
		}
	}
}
