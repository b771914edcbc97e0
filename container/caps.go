package container

import (
	"fmt"
	"slices"
	"strings"
)

// capBits maps every capability name Linux defines (up to 6.x) to its bit number.
var capBits = map[string]uint{
	"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_DAC_READ_SEARCH": 2, "CAP_FOWNER": 3,
	"CAP_FSETID": 4, "CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7, "CAP_SETPCAP": 8,
	"CAP_LINUX_IMMUTABLE": 9, "CAP_NET_BIND_SERVICE": 10, "CAP_NET_BROADCAST": 11,
	"CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13, "CAP_IPC_LOCK": 14, "CAP_IPC_OWNER": 15,
	"CAP_SYS_MODULE": 16, "CAP_SYS_RAWIO": 17, "CAP_SYS_CHROOT": 18, "CAP_SYS_PTRACE": 19,
	"CAP_SYS_PACCT": 20, "CAP_SYS_ADMIN": 21, "CAP_SYS_BOOT": 22, "CAP_SYS_NICE": 23,
	"CAP_SYS_RESOURCE": 24, "CAP_SYS_TIME": 25, "CAP_SYS_TTY_CONFIG": 26, "CAP_MKNOD": 27,
	"CAP_LEASE": 28, "CAP_AUDIT_WRITE": 29, "CAP_AUDIT_CONTROL": 30, "CAP_SETFCAP": 31,
	"CAP_MAC_OVERRIDE": 32, "CAP_MAC_ADMIN": 33, "CAP_SYSLOG": 34, "CAP_WAKE_ALARM": 35,
	"CAP_BLOCK_SUSPEND": 36, "CAP_AUDIT_READ": 37, "CAP_PERFMON": 38, "CAP_BPF": 39,
	"CAP_CHECKPOINT_RESTORE": 40,
}

// defaultCaps is what every sandbox's root gets: Docker's default set without NET_RAW (granted
// only on request), MKNOD (the device cgroup allows no new device anyway) and SETFCAP (file
// capabilities are inert under NoNewPrivileges).
var defaultCaps = []string{
	"CAP_AUDIT_WRITE",
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_NET_BIND_SERVICE",
	"CAP_SETGID",
	"CAP_SETPCAP",
	"CAP_SETUID",
	"CAP_SYS_CHROOT",
}

// forbiddenCaps are never granted, whatever a Spec asks for. The first eight are the ones the
// product promises (they reach the network configuration, the kernel or other processes); the
// rest open known container escapes (DAC_READ_SEARCH: open_by_handle_at) or host-wide state.
var forbiddenCaps = []string{
	"CAP_NET_ADMIN",
	"CAP_SYS_ADMIN",
	"CAP_SYS_MODULE",
	"CAP_SYS_PTRACE",
	"CAP_SYS_RAWIO",
	"CAP_BPF",
	"CAP_PERFMON",
	"CAP_SYS_TIME",
	"CAP_AUDIT_CONTROL",
	"CAP_BLOCK_SUSPEND",
	"CAP_CHECKPOINT_RESTORE",
	"CAP_DAC_READ_SEARCH",
	"CAP_LINUX_IMMUTABLE",
	"CAP_MAC_ADMIN",
	"CAP_MAC_OVERRIDE",
	"CAP_SYSLOG",
	"CAP_SYS_BOOT",
	"CAP_SYS_PACCT",
	"CAP_SYS_TTY_CONFIG",
	"CAP_WAKE_ALARM",
}

// DefaultCapabilities returns the capabilities every sandbox gets (a copy).
func DefaultCapabilities() []string { return slices.Clone(defaultCaps) }

// ForbiddenCapabilities returns the capabilities no sandbox ever gets (a copy).
func ForbiddenCapabilities() []string { return slices.Clone(forbiddenCaps) }

// CapabilityBit returns the bit number of a capability name ("CAP_NET_RAW" or "net_raw"), as it
// appears in the CapEff mask of /proc/PID/status.
func CapabilityBit(name string) (uint, bool) {
	b, ok := capBits[canonicalCap(name)]
	return b, ok
}

func canonicalCap(name string) string {
	n := strings.ToUpper(strings.TrimSpace(name))
	if !strings.HasPrefix(n, "CAP_") {
		n = "CAP_" + n
	}
	return n
}

// capabilitySet returns the sorted capability set of a sandbox: the defaults, NET_RAW when
// spec.NetRaw, and spec.ExtraCaps, with every forbidden capability removed. Unknown names are
// an error; forbidden ones (and NET_RAW without spec.NetRaw) are dropped silently: a request
// cannot raise them.
func capabilitySet(spec Spec) ([]string, error) {
	set := slices.Clone(defaultCaps)
	if spec.NetRaw {
		set = append(set, "CAP_NET_RAW")
	}
	for _, c := range spec.ExtraCaps {
		n := canonicalCap(c)
		if _, ok := capBits[n]; !ok {
			return nil, fmt.Errorf("capability %q: unknown; use a Linux capability name such as CAP_NET_RAW", c)
		}
		set = append(set, n)
	}
	set = slices.DeleteFunc(set, func(c string) bool {
		return slices.Contains(forbiddenCaps, c) || (c == "CAP_NET_RAW" && !spec.NetRaw)
	})
	slices.Sort(set)
	return slices.Compact(set), nil
}
