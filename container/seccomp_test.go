package container

import (
	"slices"
	"testing"

	"github.com/opencontainers/runc/libcontainer/configs"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

func TestDeniedSyscallsCoverThePromise(t *testing.T) {
	promised := []string{"kexec_load", "init_module", "finit_module", "delete_module", "bpf",
		"perf_event_open", "mount", "umount2", "pivot_root", "swapon", "swapoff", "reboot",
		"settimeofday", "clock_settime", "acct", "add_key", "keyctl", "request_key", "unshare",
		"setns", "userfaultfd", "open_by_handle_at", "ptrace", "process_vm_readv", "process_vm_writev"}
	for _, s := range promised {
		if !slices.Contains(DeniedSyscalls(), s) {
			t.Errorf("DeniedSyscalls lacks %s", s)
		}
	}
	if !slices.IsSorted(deniedSyscalls) || len(slices.Compact(slices.Clone(deniedSyscalls))) != len(deniedSyscalls) {
		t.Error("deniedSyscalls must be sorted and without duplicates")
	}
}

// A typo in the list would be silently ignored by libcontainer; every name must be a syscall
// libseccomp knows on at least one of the ABIs the filter covers.
func TestDeniedSyscallsAreKnown(t *testing.T) {
	archs := []libseccomp.ScmpArch{libseccomp.ArchAMD64, libseccomp.ArchX86, libseccomp.ArchX32}
	for _, name := range append(DeniedSyscalls(), "clone", "clone3") {
		known := false
		for _, a := range archs {
			if _, err := libseccomp.GetSyscallFromNameByArch(name, a); err == nil {
				known = true
			}
		}
		if !known {
			t.Errorf("syscall %q unknown to libseccomp on amd64, x86 and x32", name)
		}
	}
}

func TestSeccompProfile(t *testing.T) {
	p := seccompProfile()
	if p.DefaultAction != configs.Allow {
		t.Errorf("default action %v, want Allow", p.DefaultAction)
	}
	if got := seccompArchitectures("amd64"); !slices.Equal(got, []string{"amd64", "x86", "x32"}) {
		t.Errorf("amd64 architectures %v", got)
	}
	rules := map[string]*configs.Syscall{}
	for _, s := range p.Syscalls {
		if rules[s.Name] != nil {
			t.Errorf("two rules for %s", s.Name)
		}
		rules[s.Name] = s
	}
	for _, name := range deniedSyscalls {
		r := rules[name]
		if r == nil || r.Action != configs.Errno || r.ErrnoRet == nil || *r.ErrnoRet != uint(unix.EPERM) || len(r.Args) != 0 {
			t.Errorf("%s: want an unconditional EPERM rule, got %+v", name, r)
		}
	}
	if r := rules["clone3"]; r == nil || r.Action != configs.Errno || *r.ErrnoRet != uint(unix.ENOSYS) {
		t.Errorf("clone3: want ENOSYS, got %+v", r)
	}
	r := rules["clone"]
	if r == nil || r.Action != configs.Errno || *r.ErrnoRet != uint(unix.EPERM) || len(r.Args) != 1 {
		t.Fatalf("clone: want one conditional EPERM rule, got %+v", r)
	}
	a := r.Args[0]
	if a.Index != 0 || a.Op != configs.MaskEqualTo || a.Value != unix.CLONE_NEWUSER || a.ValueTwo != unix.CLONE_NEWUSER {
		t.Errorf("clone arg %+v: want flags & CLONE_NEWUSER == CLONE_NEWUSER", a)
	}
	if len(p.Syscalls) != len(deniedSyscalls)+2 {
		t.Errorf("%d rules, want %d", len(p.Syscalls), len(deniedSyscalls)+2)
	}
}
