// Package container runs enforcerd's sandboxes under runc's libcontainer.
//
// It owns, per session: the libcontainer container (state under Config.StateDir, id
// "<prefix>-<name>"), its cgroup ("<prefix>/<prefix>-<name>" relative to the daemon's own cgroup,
// on cgroup v1 and v2), and its layer directory under Config.LayerDir (the overlay upper/work
// dirs, a read-only bind of the image as the lower layer, the host-side overlay mount the
// sandbox uses as its root, and a small tmpfs holding the per-session resolv.conf, hosts and
// hostname files bind-mounted over the image's). The overlay's options are relative to the
// layer dir and the etc files sit on their own tmpfs, so the sandbox's mount table names no host
// path.
//
// It does not own the network: the sandbox joins a network namespace it is given
// (Spec.NetnsPath, made by nsmgr) and holds no capability that could change it. The rules that
// confine the session live in the daemon's netns, which the sandbox cannot see or enter.
//
// Security model, in one place (each part is a tested value in this package):
//   - namespaces: mount, pid, ipc, uts, cgroup, network (the session's), user (optional);
//   - capabilities: DefaultCapabilities, plus NET_RAW only when Spec.NetRaw, minus
//     ForbiddenCapabilities whatever the request says;
//   - NoNewPrivileges; masked /proc and /sys paths; read-only /proc/sys, /proc/sysrq-trigger,
//     /proc/irq, /proc/bus, /proc/fs, /sys and the sandbox's own cgroups at /sys/fs/cgroup;
//   - seccomp: default allow, DeniedSyscalls fail with EPERM (clone3 with ENOSYS, so that libc
//     falls back to clone, whose CLONE_NEWUSER flag is refused);
//   - cgroups: memory (no swap), pids and CPU (a CFS quota per CPUPeriod; rules.DefaultCPUs, one CPU,
//     when the Spec leaves it at zero: never unlimited) limits per session;
//   - the image directory is only ever an overlay lower layer: it is never written. Which
//     directories may be images is the caller's policy: ResolveImage checks a path against the
//     operator's image directories (the daemon calls it for every API request);
//   - what a sandbox writes is unreachable by host users: the state dir and every layer dir are
//     0700 (the layer root and a user-namespaced sandbox's layer dir 0710, group UserNSHostID),
//     re-applied at New and at every Create, and the overlay is mounted nosuid,nodev.
//
// It also owns the image store (imagestore.go, imageunpack.go): root filesystems unpacked from
// image archives (docker save, OCI layout) with go-containerregistry's readers, every entry
// written beneath the image's root through openat2(RESOLVE_BENEATH) so no entry can reach
// outside it, renamed into place only whole. The store knows nothing of sessions; its caller
// (the daemon) decides whether an image is in use before it detaches one.
//
// Limits, stated: a writable session's upper layer lives on the filesystem under LayerDir with
// no quota (a read-only session's /tmp is a tmpfs charged to its memory limit); the user
// namespace maps every sandbox to the same host range; the built-in keeper exists for amd64
// only (New fails elsewhere); an image import skips device nodes, does not apply extended
// attributes (file capabilities), and refuses an entry written through an absolute symlink even
// when the symlink points inside the image.
//
// The process model: libcontainer re-executes the current binary (/proc/self/exe) with the
// argument "init" to set a container up; a binary that uses this package must call MaybeInit
// first thing in main (before flag parsing). The sandbox's long-lived pid 1 (the keeper) is a
// 249-byte static program this package builds in memory (keeper.go) and hands to the init as a
// sealed memfd, shown as "enforcerd init SESSION": it reaps orphans and ignores every signal
// from inside, so the sandbox stays up until Destroy kills it from outside or a SIGTERM from
// outside (systemd's at host shutdown) ends it, whatever image it runs (even one without a
// shell). Init
// and exec'd processes are children of the daemon (nsexec uses CLONE_PARENT); the Manager waits
// on every one of them so no zombie remains.
package container
