package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/runc/libcontainer/seccomp"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// The host checks read /proc and /sys only.

// Capability bits (linux/capability.h).
const (
	capNetAdmin = 12
	capSysAdmin = 21
)

// missingCaps returns the names of CAP_NET_ADMIN and CAP_SYS_ADMIN when
// the CapEff line of a /proc/<pid>/status text lacks them.
func missingCaps(status string) ([]string, error) {
	for _, line := range strings.Split(status, "\n") {
		v, ok := strings.CutPrefix(line, "CapEff:")
		if !ok {
			continue
		}
		bits, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("capability line %q: not hex", line)
		}
		var missing []string
		for _, c := range []struct {
			bit  uint
			name string
		}{{capNetAdmin, "CAP_NET_ADMIN"}, {capSysAdmin, "CAP_SYS_ADMIN"}} {
			if bits&(1<<c.bit) == 0 {
				missing = append(missing, c.name)
			}
		}
		return missing, nil
	}
	return nil, errors.New("no CapEff line in /proc/self/status")
}

// checkOverlay: sandboxes' roots are overlay mounts.
func checkOverlay(*doctorEnv) (string, string) {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return StatusFail, fmt.Sprintf("read /proc/filesystems: %v", err)
	}
	if hasFilesystem(string(b), "overlay") {
		return StatusOK, "overlay listed in /proc/filesystems"
	}
	return StatusFail, "overlay not in /proc/filesystems (modprobe overlay): sandboxes cannot mount their root; --network-only sessions still work"
}

// hasFilesystem reports whether a /proc/filesystems text lists fs.
func hasFilesystem(list, fs string) bool {
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[len(f)-1] == fs {
			return true
		}
	}
	return false
}

// checkSeccomp: the kernel filters syscalls (the Seccomp field and the
// filter actions in /proc) and this binary was built with seccomp support
// (cgo and -tags seccomp), without which container.New refuses.
func checkSeccomp(*doctorEnv) (string, string) {
	if !seccomp.Enabled {
		return StatusFail, "this binary was built without seccomp support (build with cgo and -tags seccomp): sandboxes are refused"
	}
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return StatusFail, fmt.Sprintf("read /proc/self/status: %v", err)
	}
	if !strings.Contains(string(b), "\nSeccomp:") {
		return StatusFail, "the kernel has no seccomp (no Seccomp field in /proc/self/status): sandboxes cannot be confined"
	}
	if _, err := os.Stat("/proc/sys/kernel/seccomp/actions_avail"); err != nil {
		return StatusFail, "the kernel has no seccomp filter mode (/proc/sys/kernel/seccomp/actions_avail missing): sandboxes cannot be confined"
	}
	maj, min, micro := seccomp.Version()
	return StatusOK, fmt.Sprintf("kernel seccomp filters; libseccomp %d.%d.%d", maj, min, micro)
}

// checkCgroup: a cgroup v2 (unified) or v1 hierarchy at /sys/fs/cgroup,
// and (as root) the directories the sandboxes' cgroups are made in
// writable.
func checkCgroup(e *doctorEnv) (string, string) {
	status, detail := cgroupHierarchy()
	if status != StatusOK {
		return status, detail
	}
	if os.Geteuid() != 0 {
		return status, detail + "; writability not checked: needs root"
	}
	dirs, err := container.CgroupParents(e.cfg.NamePrefix)
	if err != nil {
		return StatusFail, err.Error()
	}
	for _, d := range dirs {
		if err := cgroupWritable(d); err != nil {
			return StatusFail, err.Error() + ": sandboxes cannot be made"
		}
	}
	where := dirs[0]
	if len(dirs) > 1 {
		where = fmt.Sprintf("%s and %d more", dirs[0], len(dirs)-1)
	}
	return StatusOK, fmt.Sprintf("%s; the sandboxes' cgroups can be made in %s (judged from this process's cgroup; the service's is its unit's, Delegate=yes)", detail, where)
}

// cgroupWritable checks that dir, or the nearest of its parents that
// exists, accepts a new directory: access(2) reports a read-only mount
// (EROFS) and missing write permission.
func cgroupWritable(dir string) error {
	at := dir
	for {
		_, err := os.Stat(at)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || at == "/" {
			return fmt.Errorf("stat cgroup dir %s: %w", at, err)
		}
		at = filepath.Dir(at)
	}
	if err := unix.Access(at, unix.W_OK); err != nil {
		if errors.Is(err, unix.EROFS) {
			return fmt.Errorf("cgroup dir %s is on a read-only mount", at)
		}
		return fmt.Errorf("cgroup dir %s is not writable: %w", at, err)
	}
	return nil
}

// cgroupHierarchy: a cgroup v2 (unified) or v1 hierarchy at /sys/fs/cgroup.
func cgroupHierarchy() (string, string) {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		return StatusFail, fmt.Sprintf("statfs /sys/fs/cgroup: %v: sandboxes cannot be limited", err)
	}
	switch st.Type {
	case unix.CGROUP2_SUPER_MAGIC:
		return StatusOK, "cgroup v2 (unified) at /sys/fs/cgroup"
	case unix.TMPFS_MAGIC:
		var have []string
		for _, c := range []string{"memory", "pids", "cpu"} {
			var cs unix.Statfs_t
			if unix.Statfs(filepath.Join("/sys/fs/cgroup", c), &cs) == nil && cs.Type == unix.CGROUP_SUPER_MAGIC {
				have = append(have, c)
			}
		}
		if len(have) < 3 {
			return StatusFail, fmt.Sprintf("cgroup v1 with only %v of the memory, pids and cpu controllers mounted", have)
		}
		return StatusOK, "cgroup v1 (memory, pids, cpu) at /sys/fs/cgroup"
	}
	return StatusFail, fmt.Sprintf("/sys/fs/cgroup is neither cgroup v2 nor a v1 tmpfs (filesystem magic %#x)", st.Type)
}

// mountEntry is one line of a mountinfo file.
type mountEntry struct {
	point  string
	shared bool // optional field "shared:N"
}

// parseMountinfo returns the mount points and their propagation, in order
// (a later mount on the same point hides an earlier one).
func parseMountinfo(text string) []mountEntry {
	var out []mountEntry
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 7 {
			continue
		}
		e := mountEntry{point: f[4]}
		for _, opt := range f[6:] {
			if opt == "-" {
				break
			}
			if strings.HasPrefix(opt, "shared:") {
				e.shared = true
			}
		}
		out = append(out, e)
	}
	return out
}

// propagationVerdict judges dir from the mount table: netns files serve
// bind-mounts there must reach mount namespaces cloned later (sandboxes),
// and their unmount must reach the copies, so dir should be a shared mount
// point, or be one serve can make (nsmgr.PrepareNetnsDir: it binds dir
// onto itself only while nothing is mounted below it).
func propagationVerdict(mounts []mountEntry, dir string, exists bool) (string, string) {
	if !exists {
		return StatusOK, dir + " absent: serve creates it as a shared mount point"
	}
	var at *mountEntry
	below := 0
	for i := range mounts {
		switch {
		case mounts[i].point == dir:
			at = &mounts[i]
		case strings.HasPrefix(mounts[i].point, dir+"/"):
			below++
		}
	}
	switch {
	case at != nil && at.shared:
		return StatusOK, dir + " is a shared mount point"
	case at != nil:
		return StatusOK, dir + " is a private mount point: serve makes it shared"
	case below > 0:
		return StatusWarn, fmt.Sprintf("%s is not a mount point and %d netns are mounted below it: serve leaves it so (binding it now would hide them), and netns it mounts there do not propagate to sandboxes' mount namespaces; remove them or bind %s onto itself as a shared mount", dir, below, dir)
	}
	return StatusOK, dir + " is not a mount point yet: serve makes it a shared one"
}

// checkPropagation judges /run/netns, and warns when this process has a
// mount namespace of its own (a unit's PrivateMounts=, say) in which it is
// not shared: the netns serve mounts would then be invisible to `ip netns`
// on the host.
func checkPropagation(*doctorEnv) (string, string) {
	dir := nsmgr.DefaultNetnsDir
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return StatusFail, fmt.Sprintf("read mountinfo: %v", err)
	}
	_, err = os.Stat(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return StatusFail, fmt.Sprintf("stat %s: %v", dir, err)
	}
	mounts := parseMountinfo(string(b))
	status, detail := propagationVerdict(mounts, dir, err == nil)
	own, _ := os.Readlink("/proc/thread-self/ns/mnt")
	initNS, _ := os.Readlink("/proc/1/ns/mnt")
	if status == StatusOK && own != "" && initNS != "" && own != initNS && !sharedAt(mounts, dir) {
		return StatusWarn, detail + "; this process's mount namespace is not init's, so the netns serve mounts there may be invisible to ip netns on the host"
	}
	return status, detail
}

// sharedAt reports whether dir, or the mount holding it, is shared.
func sharedAt(mounts []mountEntry, dir string) bool {
	best, shared := -1, false
	for _, m := range mounts {
		if (dir == m.point || strings.HasPrefix(dir, strings.TrimSuffix(m.point, "/")+"/")) && len(m.point) >= best {
			best, shared = len(m.point), m.shared
		}
	}
	return shared
}

// checkLegacyIptables: a legacy (x_tables) filter table's FORWARD policy
// drops forwarded traffic like an nftables one, but only iptables-legacy
// can read it, and the daemon never runs iptables.
func checkLegacyIptables(*doctorEnv) (string, string) {
	b, err := os.ReadFile("/proc/net/ip_tables_names")
	if errors.Is(err, fs.ErrNotExist) {
		return StatusOK, "no legacy iptables (ip_tables not loaded)"
	}
	if err != nil {
		return StatusWarn, fmt.Sprintf("read /proc/net/ip_tables_names: %v", err)
	}
	for _, t := range strings.Fields(string(b)) {
		if t == "filter" {
			return StatusWarn, "legacy iptables filter table present; its FORWARD policy cannot be read without iptables-legacy (iptables-legacy -S FORWARD: a -P FORWARD DROP drops the sessions' traffic)"
		}
	}
	return StatusOK, "no legacy iptables filter table"
}
