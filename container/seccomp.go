package container

import (
	"runtime"
	"slices"

	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"
)

// deniedSyscalls fail with EPERM in every sandbox. The profile allows everything else: a
// pentest toolbox runs arbitrary programs, and these are the calls none of them needs, grouped
// by what they would reach:
//
//   - the kernel itself: init_module, finit_module, delete_module, create_module,
//     query_module, get_kernel_syms, kexec_load, kexec_file_load, bpf, perf_event_open,
//     iopl, ioperm, syslog, uselib, nfsservctl, lookup_dcookie, sysfs, _sysctl, vm86, vm86old,
//     io_uring_setup, io_uring_enter, io_uring_register (a large, often exploited surface),
//     userfaultfd (a common exploit primitive);
//   - other processes: ptrace, process_vm_readv, process_vm_writev, kcmp, pidfd_getfd;
//   - mounts and namespaces (libcontainer sets the sandbox up before the filter is loaded):
//     mount, umount, umount2, pivot_root, move_mount, open_tree, fsopen, fsconfig, fsmount,
//     fspick, mount_setattr, unshare, setns, and clone with CLONE_NEWUSER (a user namespace
//     is the one namespace an unprivileged process could make; it would hand it full
//     capabilities over namespaces it creates);
//   - host-wide state: reboot, swapon, swapoff, acct, quotactl, quotactl_fd, settimeofday,
//     clock_settime, clock_adjtime, stime, vhangup;
//   - the kernel keyring (not namespaced): add_key, keyctl, request_key;
//   - file handles (the "shocker" escape): open_by_handle_at, name_to_handle_at.
//
// clone3 fails with ENOSYS instead: its flags live in memory a filter cannot read, and ENOSYS
// makes libc fall back to clone, whose flags the filter checks.
var deniedSyscalls = []string{
	"_sysctl",
	"acct",
	"add_key",
	"bpf",
	"clock_adjtime",
	"clock_settime",
	"create_module",
	"delete_module",
	"finit_module",
	"fsconfig",
	"fsmount",
	"fsopen",
	"fspick",
	"get_kernel_syms",
	"init_module",
	"io_uring_enter",
	"io_uring_register",
	"io_uring_setup",
	"ioperm",
	"iopl",
	"kcmp",
	"kexec_file_load",
	"kexec_load",
	"keyctl",
	"lookup_dcookie",
	"mount",
	"mount_setattr",
	"move_mount",
	"name_to_handle_at",
	"nfsservctl",
	"open_by_handle_at",
	"open_tree",
	"perf_event_open",
	"pidfd_getfd",
	"pivot_root",
	"process_vm_readv",
	"process_vm_writev",
	"ptrace",
	"query_module",
	"quotactl",
	"quotactl_fd",
	"reboot",
	"request_key",
	"setns",
	"settimeofday",
	"stime",
	"swapoff",
	"swapon",
	"sysfs",
	"syslog",
	"umount",
	"umount2",
	"unshare",
	"uselib",
	"userfaultfd",
	"vhangup",
	"vm86",
	"vm86old",
}

// DeniedSyscalls returns the system calls every sandbox is refused with EPERM (a copy); see
// deniedSyscalls for why each is there.
func DeniedSyscalls() []string { return slices.Clone(deniedSyscalls) }

// seccompArchitectures lists the ABIs a process can call the kernel through on this machine;
// the filter covers all of them, so a 32-bit syscall cannot slip past the deny list.
func seccompArchitectures(goarch string) []string {
	switch goarch {
	case "amd64":
		return []string{"amd64", "x86", "x32"}
	case "arm64":
		return []string{"arm64", "arm"}
	}
	return nil
}

// seccompProfile is the libcontainer form of the profile described at deniedSyscalls.
func seccompProfile() *configs.Seccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	sc := &configs.Seccomp{
		DefaultAction: configs.Allow,
		Architectures: seccompArchitectures(runtime.GOARCH),
	}
	for _, name := range deniedSyscalls {
		sc.Syscalls = append(sc.Syscalls, &configs.Syscall{Name: name, Action: configs.Errno, ErrnoRet: &eperm})
	}
	sc.Syscalls = append(sc.Syscalls,
		&configs.Syscall{Name: "clone3", Action: configs.Errno, ErrnoRet: &enosys},
		&configs.Syscall{
			Name: "clone", Action: configs.Errno, ErrnoRet: &eperm,
			Args: []*configs.Arg{{Index: 0, Value: unix.CLONE_NEWUSER, ValueTwo: unix.CLONE_NEWUSER, Op: configs.MaskEqualTo}},
		},
	)
	return sc
}
