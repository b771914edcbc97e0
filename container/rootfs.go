package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// overlayOptions is the mount data of a sandbox's root: the image (bound at lower) as the only
// lower layer, so every write (including the mount points libcontainer creates) lands in the
// session's upper dir and the image is never changed. index=off: the shared lower layer is never
// tagged. volatile: the upper layer is never synced to disk (it dies with the session, and a
// daemon that crashed reaps it), which makes unmounting cost ~1 ms instead of a sync of the
// whole filesystem under LayerDir (~50 ms measured).
//
// The layer paths are relative to the layer dir, and the overlay is mounted from a thread whose
// working directory is that dir (mountIn): the sandbox reads its root's options in /proc/mounts,
// and they name no host path (not the operator's image directory, not the state directory).
const overlayOptions = "lowerdir=lower,upperdir=upper,workdir=work,index=off,volatile"

// mountIn runs mount with dir as the working directory, on a thread of its own: unshare
// (CLONE_FS) gives the thread a working directory apart from the process's, and the thread is
// never handed back to the Go scheduler (its goroutine ends locked, so the runtime ends it).
// The thread leaves dir before it ends: the runtime does not end the process's main thread
// but parks it for good, and a parked thread's working directory would pin the layer's
// tmpfs after its unmount.
func mountIn(dir string, mount func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread's fs state is its own
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			done <- fmt.Errorf("unshare fs: %w", err)
			return
		}
		if err := unix.Chdir(dir); err != nil {
			done <- fmt.Errorf("chdir %s: %w", dir, err)
			return
		}
		err := mount()
		_ = unix.Chdir("/")
		done <- err
	}()
	return <-done
}

// prepareLayer makes the sandbox's layer dir, writes its /etc files and mounts its root. On
// error it leaves whatever it made for removeLayer (the caller's rollback) to take away.
//
// A read-only root's layer dir is a tmpfs of the sandbox's own (layerOnTmpfs): its upper layer
// only ever holds the mount points libcontainer makes before it remounts the root read-only,
// and root's home (prepareRootHome) and the etc files live there too. So one tmpfs mount replaces
// the disk directories, the etc tmpfs and the home tmpfs such a layer had before, the overlay is
// mounted over a tmpfs upper (the disk-backed one costs the upper filesystem's checks: a work
// dir, whiteout and xattr probes, each a journaled create and unlink) and removing the layer is
// one unmount. A writable root keeps its upper layer on the disk under LayerDir: what the
// sandbox writes there may be large.
func prepareLayer(image string, l layout, spec Spec) error {
	st, err := os.Stat(image)
	if err != nil {
		return fmt.Errorf("rootfs %s: %w", image, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("rootfs %s: not a directory", image)
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
	onTmpfs := layerOnTmpfs(spec)
	if onTmpfs {
		// The tmpfs's root gets the layer dir's owner and mode (see privateDir).
		if err := unix.Mount("tmpfs", l.dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, layerTmpfsOptions(spec.UserNS)); err != nil {
			return fmt.Errorf("mount tmpfs on %s: %w", l.dir, err)
		}
	}
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{l.upper, 0o755}, {l.work, 0o700}, {l.rootfs, 0o755}, {l.lower, 0o755}, {l.etc, 0o755}} {
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
	// The etc files live on a tmpfs (the layer's own, or one of their own on a disk-backed
	// layer): a bind mount shows its source's path within its filesystem in the sandbox's
	// mountinfo, and on a tmpfs that path is only "/etc/hosts" or "/hosts", no host path.
	if !onTmpfs {
		if err := unix.Mount("tmpfs", l.etc, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
			return fmt.Errorf("mount tmpfs on %s: %w", l.etc, err)
		}
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
	// The image, read-only, at lower: only this bind names its path (in the host's mount table).
	if err := unix.Mount(image, l.lower, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", image, l.lower, err)
	}
	if err := unix.Mount("", l.lower, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("make %s read-only: %w", l.lower, err)
	}
	home := false
	if !spec.Writable {
		if home, err = prepareRootHome(l, spec); err != nil {
			return err
		}
	}
	// Both overlays from one thread (see mountIn).
	return mountIn(l.dir, func() error {
		if err := unix.Mount("overlay", "rootfs", "overlay", unix.MS_NOSUID|unix.MS_NODEV, overlayOptions); err != nil {
			return fmt.Errorf("mount overlay on %s: %w", l.rootfs, err)
		}
		if !home {
			return nil
		}
		if err := unix.Mount("overlay", filepath.Join("rootfs", rootHome), "overlay", unix.MS_NOSUID|unix.MS_NODEV, homeOptions); err != nil {
			return fmt.Errorf("mount overlay on %s: %w", filepath.Join(l.rootfs, rootHome), err)
		}
		return nil
	})
}

// layerOnTmpfs reports whether the sandbox's layer dir is a tmpfs of its own: a read-only
// root's is (see prepareLayer).
func layerOnTmpfs(spec Spec) bool { return !spec.Writable }

// layerTmpfsOptions is the mount data of a layer tmpfs: its root private to root as
// privateDir makes a layer dir (group UserNSHostID may search it for a user-namespaced
// sandbox). No size: what the sandbox writes there (root's home) is memory charged to its
// cgroup, as /tmp is.
func layerTmpfsOptions(userNS bool) string {
	if userNS {
		return "mode=710,uid=0,gid=" + strconv.Itoa(UserNSHostID)
	}
	return "mode=700,uid=0,gid=0"
}

// rootHome is root's home in every image enforcerd runs (its passwd entry's home,
// /root): ssh, git and most tools keep their files under the passwd home, not $HOME.
const rootHome = "root"

// homeOptions is the mount data of root's home on a read-only root: the image's /root
// (through lower) under an upper layer on a tmpfs of the session's own, relative to the layer
// dir as overlayOptions is.
const homeOptions = "lowerdir=lower/" + rootHome + ",upperdir=home/upper,workdir=home/work,index=off"

// prepareRootHome prepares root's home on a read-only root, so that it is writable, as
// $HOME says (issue 27: ssh could not store host keys, its passwd home /root being read-only
// while $HOME was /tmp): an overlay of the image's /root, whose contents stay visible (tools an
// image installed there, dot files), under an upper layer on the layer's tmpfs (a read-only
// root's layer dir is one, see prepareLayer), mounted on the root's /root before libcontainer
// remounts the root read-only (a mount of its own keeps its own flags). What the sandbox
// writes there is memory charged to its cgroup, as /tmp is, and never reaches the image. It
// makes the upper and work dirs and reports whether the overlay is wanted (prepareLayer mounts
// it with the root's): an image without a real /root directory (none, or a symlink) gets
// nothing.
func prepareRootHome(l layout, spec Spec) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(l.lower, rootHome), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false, nil
	}
	if err := os.Mkdir(l.home, 0o700); err != nil {
		return false, fmt.Errorf("make %s: %w", l.home, err)
	}
	upper, work := filepath.Join(l.home, "upper"), filepath.Join(l.home, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return false, fmt.Errorf("make %s: %w", d, err)
		}
	}
	// The merged home takes the upper dir's owner and mode: the image's /root's, its owner
	// mapped to the sandbox's root in a user namespace.
	uid, gid := int(st.Uid), int(st.Gid)
	if spec.UserNS {
		uid, gid = UserNSHostID+uid, UserNSHostID+gid
	}
	if err := os.Chown(upper, uid, gid); err != nil {
		return false, fmt.Errorf("chown %s: %w", upper, err)
	}
	if err := os.Chmod(upper, os.FileMode(st.Mode&0o7777)); err != nil {
		return false, fmt.Errorf("chmod %s: %w", upper, err)
	}
	return true, nil
}

// removeLayer unmounts the sandbox's root and removes its layer dir. Idempotent: a missing dir
// or a root that is not mounted is success. It refuses to remove a dir whose root is still a
// mount point, so it never deletes through a live overlay.
func removeLayer(l layout) error {
	// The root first (it stacks on lower), then the image's bind, the etc tmpfs of a
	// disk-backed layer (and the home tmpfs of a layer an earlier version made), then the
	// layer's own tmpfs. A layer dir made before they
	// existed has none of them: not a mount point is success.
	for _, m := range []string{filepath.Join(l.rootfs, rootHome), l.rootfs, l.lower, l.etc, l.home} {
		if err := unmountAll(m); err != nil {
			return err
		}
	}
	for _, m := range []string{l.rootfs, l.lower, l.etc, l.home} {
		mounted, err := isMountPoint(m)
		if err != nil {
			return err
		}
		if mounted {
			// Never delete through a mount: lower is the operator's image.
			return fmt.Errorf("remove layer dir %s: %s is still mounted", l.dir, m)
		}
	}
	if err := unmountAll(l.dir); err != nil {
		return err
	}
	if mounted, err := isMountPoint(l.dir); err != nil || mounted {
		if err == nil {
			err = fmt.Errorf("%s is still mounted", l.dir)
		}
		return fmt.Errorf("remove layer dir %s: %w", l.dir, err)
	}
	if err := os.RemoveAll(l.dir); err != nil {
		return fmt.Errorf("remove layer dir %s: %w", l.dir, err)
	}
	return nil
}

// unmountAll detaches every mount stacked on path (at most 8). A path that is not (or no
// longer) a mount point, or is gone, is success.
func unmountAll(path string) error {
	for range 8 {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
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
