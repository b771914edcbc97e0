package nsmgr

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultNetnsDir is where iproute2 (`ip netns`) looks for named netns.
const DefaultNetnsDir = "/run/netns"

// PrepareNetnsDir makes dir exist and, like `ip netns add`, a shared mount
// point (a bind mount of itself): netns mounted under it then propagate to
// mount namespaces cloned later, and unmounting one here unmounts their
// copies, so a sandbox's mount namespace does not keep a deleted netns
// alive. Once dir is a mount point, `ip netns add` leaves it alone.
//
// It binds dir only while no mount exists below it: a recursive bind made
// while netns are mounted there duplicates their mounts, hides the
// originals, and every later unmount-and-remove of those netns fails with
// EBUSY (seen when a test world existed). In that case dir is left as it
// is, which only loses the propagation above.
func PrepareNetnsDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create netns dir %s: %w", dir, err)
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil // already a mount point (an earlier run or iproute2 made it)
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make netns dir %s a shared mount: %w", dir, err)
	}
	busy, err := hasMountsBelow(dir)
	if err != nil || busy {
		return err
	}
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount netns dir %s onto itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make netns dir %s a shared mount: %w", dir, err)
	}
	return nil
}

// hasMountsBelow reports whether something is mounted inside dir.
func hasMountsBelow(dir string) (bool, error) {
	// thread-self, not self: /proc/self is the main thread, which a library
	// that locks a goroutine and setns()es it (libcontainer's mount-source
	// thread) can leave wedged in a container's mount namespace for good.
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("read mountinfo: %w", err)
	}
	below := filepath.Clean(dir) + "/"
	for _, line := range strings.Split(string(b), "\n") {
		// Field 5 is the mount point (octal escapes only for space, tab,
		// newline and backslash, which netns names cannot contain).
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], below) {
			return true, nil
		}
	}
	return false, nil
}

// createNetnsFile creates the empty file a netns is bind-mounted on. It
// fails if the file exists, which is what makes two creates of one session
// name exclusive.
func createNetnsFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file %s: %w", path, err)
	}
	return f.Close()
}

// removeNetns unmounts (lazily, MNT_DETACH) and removes a netns file. Both
// steps treat "already gone" as success. The kernel destroys the netns, and
// with it the veth pair, in the background once nothing else holds it.
func removeNetns(path string) error {
	// A file may carry stacked mounts (mounted twice by hand): unmount all.
	for i := 0; i < 8; i++ {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // not (or no longer) a mount point, or no file
		}
		if err != nil {
			return fmt.Errorf("unmount netns %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns file %s: %w", path, err)
	}
	return nil
}

// isNetnsMount reports whether path has a netns mounted on it (a file left
// by a create that crashed before its mount is not).
func isNetnsMount(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}
