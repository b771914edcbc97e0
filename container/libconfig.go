package container

import (
	"path/filepath"

	"github.com/opencontainers/cgroups"
	devconfig "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/container/rules"
)

// layout names the host paths of one sandbox; all live under Config.LayerDir/<id>.
type layout struct {
	id     string // "<prefix>-<name>": container id, layer dir name and cgroup name
	dir    string // LayerDir/<id>; on a read-only root, a tmpfs of its own (see prepareLayer)
	rootfs string // dir/rootfs: the overlay mount the sandbox pivots into
	upper  string // dir/upper
	work   string // dir/work
	lower  string // dir/lower: the image, bind-mounted read-only (the overlay's lower layer)
	etc    string // dir/etc: resolv.conf, hosts, hostname (bind-mounted read-only); a small tmpfs of its own on a disk-backed layer
	home   string // dir/home: on a read-only root, the upper layer of root's home (see rootHome)
}

func newLayout(layerDir, prefix, name string) layout {
	id := prefix + "-" + name
	dir := filepath.Join(layerDir, id)
	return layout{
		id:     id,
		dir:    dir,
		rootfs: filepath.Join(dir, "rootfs"),
		upper:  filepath.Join(dir, "upper"),
		work:   filepath.Join(dir, "work"),
		lower:  filepath.Join(dir, "lower"),
		etc:    filepath.Join(dir, "etc"),
		home:   filepath.Join(dir, "home"),
	}
}

// etcFiles are the per-session files bind-mounted over the image's.
var etcFiles = []string{"resolv.conf", "hosts", "hostname"}

// maskedPaths are hidden from the guest (runc's defaults): kernel memory, keys, timers and
// hardware state it has no business reading.
var maskedPaths = []string{
	"/proc/acpi",
	"/proc/asound",
	"/proc/interrupts",
	"/proc/kcore",
	"/proc/keys",
	"/proc/latency_stats",
	"/proc/sched_debug",
	"/proc/scsi",
	"/proc/timer_list",
	"/proc/timer_stats",
	"/sys/devices/virtual/powercap",
	"/sys/firmware",
}

// readonlyPaths are visible but read-only. /sys is mounted read-only as a whole.
var readonlyPaths = []string{
	"/proc/bus",
	"/proc/fs",
	"/proc/irq",
	"/proc/sys",
	"/proc/sysrq-trigger",
}

// hostFacts are the few facts about the machine the builder needs, measured once by New.
type hostFacts struct {
	// memsw: cgroup v1 with swap accounting (memory.memsw.limit_in_bytes exists), or v2.
	memsw bool
}

// buildConfig is the whole libcontainer configuration of a sandbox: pure, no I/O.
func buildConfig(prefix string, l layout, spec Spec, facts hostFacts) (*configs.Config, error) {
	if err := validateSpec(spec); err != nil {
		return nil, err
	}
	caps, err := capabilitySet(spec)
	if err != nil {
		return nil, err
	}
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.Name
	}
	mem := spec.MemoryBytes
	if mem == 0 {
		mem = rules.DefaultMemoryBytes
	}
	pids := spec.PidsMax
	if pids == 0 {
		pids = rules.DefaultPidsMax
	}
	quota, err := cpuQuota(spec.CPUs)
	if err != nil {
		return nil, err
	}
	zero := 0

	c := &configs.Config{
		Rootfs:          l.rootfs,
		Readonlyfs:      !spec.Writable,
		Hostname:        hostname,
		NoNewPrivileges: true,
		OomScoreAdj:     &zero, // an ordinary process, whatever the daemon's own adjustment
		Capabilities: &configs.Capabilities{
			Bounding:  caps,
			Effective: caps,
			Permitted: caps,
			// NET_RAW is also ambient, so a tool run as a non-root --user
			// keeps it across execve (ping, nmap -sS); nothing else is.
			Inheritable: ambientCaps(spec),
			Ambient:     ambientCaps(spec),
		},
		Sysctl: sandboxSysctls(spec),
		Namespaces: configs.Namespaces{
			{Type: configs.NEWNS},
			{Type: configs.NEWPID},
			{Type: configs.NEWIPC},
			{Type: configs.NEWUTS},
			{Type: configs.NEWCGROUP},
			{Type: configs.NEWNET, Path: spec.NetnsPath},
		},
		Mounts:        sandboxMounts(l, spec),
		Devices:       sandboxDevices(),
		MaskPaths:     append([]string(nil), maskedPaths...),
		ReadonlyPaths: append([]string(nil), readonlyPaths...),
		Seccomp:       seccompProfile(),
		Labels:        []string{"enforcerd.session=" + spec.Name},
		Cgroups: &cgroups.Cgroup{
			Parent: prefix,
			Name:   l.id,
			Resources: &cgroups.Resources{
				Memory:    mem,
				PidsLimit: &pids,
				CpuQuota:  quota,
				CpuPeriod: CPUPeriod,
				Devices:   deviceRules(),
			},
		},
	}
	if facts.memsw {
		c.Cgroups.Resources.MemorySwap = mem // memory+swap = memory: no swap
	}
	if !spec.UserNS {
		// The tmpfs libcontainer puts under the cgroup mounts (v1) is
		// writable otherwise: a fake memory.max there would lie to runtimes.
		c.ReadonlyPaths = append(c.ReadonlyPaths, "/sys/fs/cgroup")
	}
	if spec.NetnsPath == "" {
		c.Networks = []*configs.Network{{Type: "loopback"}}
	}
	if spec.UserNS {
		c.Namespaces = append(c.Namespaces, configs.Namespace{Type: configs.NEWUSER})
		m := []configs.IDMap{{ContainerID: 0, HostID: UserNSHostID, Size: UserNSSize}}
		c.UIDMappings = m
		c.GIDMappings = append([]configs.IDMap(nil), m...)
	}
	return c, nil
}

// sandboxSysctls are set in the sandbox's netns at start: unprivileged ICMP
// echo sockets for every group, as container runtimes set it, so ping works
// without NET_RAW. Not for a user-namespaced sandbox: its root does not own
// the session's netns (the host's user namespace does), so the kernel
// refuses the write.
func sandboxSysctls(spec Spec) map[string]string {
	if spec.UserNS {
		return nil
	}
	return map[string]string{"net.ipv4.ping_group_range": "0 2147483647"}
}

// ambientCaps are the capabilities a sandbox's processes keep whatever
// their uid: NET_RAW with spec.NetRaw, else none.
func ambientCaps(spec Spec) []string {
	if spec.NetRaw {
		return []string{"CAP_NET_RAW"}
	}
	return nil
}

func sandboxMounts(l layout, spec Spec) []*configs.Mount {
	const common = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	ms := []*configs.Mount{
		{Source: "proc", Destination: "/proc", Device: "proc", Flags: common},
		{Source: "tmpfs", Destination: "/dev", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_STRICTATIME, Data: "mode=755,size=65536k"},
		{Source: "devpts", Destination: "/dev/pts", Device: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{Source: "shm", Destination: "/dev/shm", Device: "tmpfs", Flags: common, Data: "mode=1777,size=65536k"},
		{Source: "mqueue", Destination: "/dev/mqueue", Device: "mqueue", Flags: common},
	}
	// sysfs shows the network namespace of whoever mounts it; in a user namespace that does
	// not own the netns the kernel refuses the mount, so /sys stays an empty directory there.
	if !spec.UserNS {
		ms = append(ms, &configs.Mount{Source: "sysfs", Destination: "/sys", Device: "sysfs", Flags: common | unix.MS_RDONLY})
		// The sandbox's own cgroups (a cgroup namespace: only its subtree),
		// read-only, so runtimes can size themselves to the limits.
		ms = append(ms, &configs.Mount{Source: "cgroup", Destination: "/sys/fs/cgroup", Device: "cgroup", Flags: common | unix.MS_RDONLY})
	}
	if !spec.Writable {
		ms = append(ms, &configs.Mount{Source: "tmpfs", Destination: "/tmp", Device: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"})
	}
	for _, f := range etcFiles {
		ms = append(ms, &configs.Mount{
			Source:      filepath.Join(l.etc, f),
			Destination: "/etc/" + f,
			Device:      "bind",
			Flags:       unix.MS_BIND | unix.MS_RDONLY | common,
		})
	}
	return ms
}

// sandboxDevices are the device nodes made in the sandbox's /dev: runc's defaults that name a
// path (null, zero, full, random, urandom, tty).
func sandboxDevices() []*devconfig.Device {
	var ds []*devconfig.Device
	for _, d := range specconv.AllowedDevices {
		if d.Path != "" {
			dd := *d
			ds = append(ds, &dd)
		}
	}
	return ds
}

// deviceRules is the device cgroup allow list: the nodes above plus the sandbox's own pty pair
// (/dev/pts/ptmx 5:2 and the ptys 136:*). runc's default list also allows mknod of any device;
// that rule is deliberately left out.
func deviceRules() []*devconfig.Rule {
	var rs []*devconfig.Rule
	for _, d := range sandboxDevices() {
		r := d.Rule
		rs = append(rs, &r)
	}
	rs = append(rs,
		&devconfig.Rule{Type: devconfig.CharDevice, Major: 5, Minor: 2, Permissions: "rwm", Allow: true},
		&devconfig.Rule{Type: devconfig.CharDevice, Major: 136, Minor: devconfig.Wildcard, Permissions: "rwm", Allow: true},
	)
	return rs
}
