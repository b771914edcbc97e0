package container

import (
	"net/netip"
	"slices"
	"testing"

	devconfig "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/container/rules"
)

func build(t *testing.T, spec Spec, facts hostFacts) *configs.Config {
	t.Helper()
	if spec.Name == "" {
		spec.Name = "s1"
	}
	if spec.Rootfs == "" {
		spec.Rootfs = "/img"
	}
	c, err := buildConfig("enf", newLayout("/var/lib/enforcerd/layers", "enf", spec.Name), spec, facts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mountAt(c *configs.Config, dest string) *configs.Mount {
	for _, m := range c.Mounts {
		if m.Destination == dest {
			return m
		}
	}
	return nil
}

func TestBuildConfigNamespaces(t *testing.T) {
	c := build(t, Spec{NetnsPath: "/run/netns/enf-s1"}, hostFacts{})
	want := map[configs.NamespaceType]string{
		configs.NEWNS: "", configs.NEWPID: "", configs.NEWIPC: "", configs.NEWUTS: "",
		configs.NEWCGROUP: "", configs.NEWNET: "/run/netns/enf-s1",
	}
	if len(c.Namespaces) != len(want) {
		t.Errorf("namespaces %+v", c.Namespaces)
	}
	for typ, path := range want {
		if !c.Namespaces.Contains(typ) || c.Namespaces.PathOf(typ) != path {
			t.Errorf("namespace %s: want path %q, got %+v", typ, path, c.Namespaces)
		}
	}
	if c.Namespaces.Contains(configs.NEWUSER) || c.UIDMappings != nil {
		t.Error("user namespace without UserNS")
	}
	if len(c.Networks) != 0 {
		t.Errorf("networks %+v with a netns path", c.Networks)
	}

	c = build(t, Spec{UserNS: true}, hostFacts{})
	if !c.Namespaces.Contains(configs.NEWUSER) || c.Namespaces.PathOf(configs.NEWNET) != "" {
		t.Errorf("UserNS: namespaces %+v", c.Namespaces)
	}
	wantMap := []configs.IDMap{{ContainerID: 0, HostID: UserNSHostID, Size: UserNSSize}}
	if !slices.Equal(c.UIDMappings, wantMap) || !slices.Equal(c.GIDMappings, wantMap) {
		t.Errorf("mappings %+v %+v", c.UIDMappings, c.GIDMappings)
	}
	if mountAt(c, "/sys") != nil {
		t.Error("sysfs mounted in a user namespace")
	}
	if len(c.Networks) != 1 || c.Networks[0].Type != "loopback" {
		t.Errorf("no netns path: want a loopback network, got %+v", c.Networks)
	}
}

func TestBuildConfigSecurity(t *testing.T) {
	for _, spec := range []Spec{{}, {NetRaw: true}, {ExtraCaps: ForbiddenCapabilities()}} {
		c := build(t, spec, hostFacts{})
		if !c.NoNewPrivileges {
			t.Error("NoNewPrivileges off")
		}
		if c.Seccomp == nil || len(c.Seccomp.Syscalls) == 0 {
			t.Error("no seccomp profile")
		}
		caps := c.Capabilities
		for _, set := range [][]string{caps.Bounding, caps.Effective, caps.Permitted, caps.Inheritable, caps.Ambient} {
			for _, f := range ForbiddenCapabilities() {
				if slices.Contains(set, f) {
					t.Errorf("%+v: forbidden %s granted", spec, f)
				}
			}
			if set != nil && slices.Contains(set, "CAP_NET_RAW") != spec.NetRaw {
				t.Errorf("%+v: CAP_NET_RAW in %v", spec, set)
			}
		}
		// Only NET_RAW (with --net-raw) is inheritable and ambient: a
		// non-root user keeps it, and nothing else, across execve.
		if want := ambientCaps(spec); !slices.Equal(caps.Inheritable, want) || !slices.Equal(caps.Ambient, want) {
			t.Errorf("%+v: inheritable/ambient capabilities %v %v, want %v", spec, caps.Inheritable, caps.Ambient, want)
		}
		if !spec.UserNS && c.Sysctl["net.ipv4.ping_group_range"] != "0 2147483647" {
			t.Errorf("%+v: ping_group_range %q: unprivileged ping would fail", spec, c.Sysctl["net.ipv4.ping_group_range"])
		}
		for _, p := range []string{"/proc/sys", "/proc/sysrq-trigger"} {
			if !slices.Contains(c.ReadonlyPaths, p) {
				t.Errorf("%s not read-only", p)
			}
		}
		for _, p := range []string{"/proc/kcore", "/proc/keys", "/sys/firmware"} {
			if !slices.Contains(c.MaskPaths, p) {
				t.Errorf("%s not masked", p)
			}
		}
		if m := mountAt(c, "/sys"); m == nil || m.Flags&unix.MS_RDONLY == 0 {
			t.Errorf("/sys not read-only: %+v", m)
		}
		if m := mountAt(c, "/proc"); m == nil || m.Flags&(unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_NODEV) != unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_NODEV {
			t.Errorf("/proc flags: %+v", m)
		}
	}
}

func TestBuildConfigFilesystem(t *testing.T) {
	c := build(t, Spec{}, hostFacts{})
	if c.Rootfs != "/var/lib/enforcerd/layers/enf-s1/rootfs" || !c.Readonlyfs {
		t.Errorf("rootfs %q readonly=%v", c.Rootfs, c.Readonlyfs)
	}
	if m := mountAt(c, "/tmp"); m == nil || m.Device != "tmpfs" {
		t.Errorf("read-only root without a tmpfs /tmp: %+v", m)
	}
	for _, f := range []string{"resolv.conf", "hosts", "hostname"} {
		m := mountAt(c, "/etc/"+f)
		if m == nil || m.Source != "/var/lib/enforcerd/layers/enf-s1/etc/"+f || m.Device != "bind" ||
			m.Flags&(unix.MS_BIND|unix.MS_RDONLY) != unix.MS_BIND|unix.MS_RDONLY {
			t.Errorf("/etc/%s: %+v", f, m)
		}
	}
	if c.Hostname != "s1" {
		t.Errorf("hostname %q, want the session name", c.Hostname)
	}
	c = build(t, Spec{Writable: true, Hostname: "box"}, hostFacts{})
	if c.Readonlyfs || mountAt(c, "/tmp") != nil || c.Hostname != "box" {
		t.Errorf("writable: readonly=%v /tmp=%+v hostname=%q", c.Readonlyfs, mountAt(c, "/tmp"), c.Hostname)
	}
}

func TestBuildConfigCgroups(t *testing.T) {
	c := build(t, Spec{}, hostFacts{})
	cg := c.Cgroups
	if cg.Parent != "enf" || cg.Name != "enf-s1" || cg.Path != "" || cg.Systemd {
		t.Errorf("cgroup %q/%q path %q systemd %v", cg.Parent, cg.Name, cg.Path, cg.Systemd)
	}
	r := cg.Resources
	if r == nil || r.Memory != rules.DefaultMemoryBytes || r.PidsLimit == nil || *r.PidsLimit != rules.DefaultPidsMax || r.MemorySwap != 0 {
		t.Fatalf("default resources %+v", r)
	}
	// No --cpus is one CPU, never unlimited.
	if r.CpuPeriod != CPUPeriod || r.CpuQuota != CPUPeriod {
		t.Errorf("default cpu quota %d period %d, want %d of %d", r.CpuQuota, r.CpuPeriod, CPUPeriod, CPUPeriod)
	}
	for _, rule := range r.Devices {
		if rule.Permissions == "m" || (rule.Major == devconfig.Wildcard && rule.Minor == devconfig.Wildcard) {
			t.Errorf("device rule %+v allows more than named devices", rule)
		}
	}
	for _, d := range c.Devices {
		if d.Path == "" {
			t.Errorf("device without a path: %+v", d)
		}
	}
	c = build(t, Spec{MemoryBytes: 64 << 20, PidsMax: 32, CPUs: 1.5}, hostFacts{memsw: true})
	r = c.Cgroups.Resources
	if r.Memory != 64<<20 || r.MemorySwap != 64<<20 || *r.PidsLimit != 32 || r.CpuQuota != 150000 || r.CpuPeriod != CPUPeriod {
		t.Errorf("resources %+v", r)
	}
}

func TestBuildConfigRejectsBadSpec(t *testing.T) {
	_, err := buildConfig("enf", newLayout("/l", "enf", "s1"), Spec{Name: "s1", Rootfs: "/img",
		Hosts: map[string][]netip.Addr{"a\nb": {netip.MustParseAddr("1.2.3.4")}}}, hostFacts{})
	if errString(err) != `pinned host "a\nb": not a DNS name; use letters, digits, '-', '_' and dots` {
		t.Errorf("got %v", err)
	}
}
