package container

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// The sandbox's pid 1 (the keeper) is a tiny static program built here, not a file of the
// image: the daemon binary cannot serve (it links libc dynamically, and the image need not have
// the loader), and an image need not have a shell. It is handed to the container's init as
// inherited fd 3 (a sealed memfd) and executed as /proc/self/fd/3, so the image gets no file.
//
// What it does: it names itself (below), installs its SIGTERM handler, closes fd 3; then,
// forever, wait4(-1) to reap any child (the orphans every exec'd process tree leaves are
// re-parented to it), and when it has no child, sleep a second and look again.
//
// Its name: it is started as [/proc/self/fd/3, "enforcerd init SESSION"] (keeperArgs) and
// copies argv[1] over argv[0], then puts a space on the last byte of the argument area, so
// /proc/PID/cmdline (what ps and systemctl status show) is "enforcerd init SESSION" (the kernel
// reads a changed argument area up to its first NUL, as for setproctitle); prctl(PR_SET_NAME)
// makes its comm "enforcerd-init" instead of "3".
//
// Signals: as a pid namespace's init it gets only the signals it has a handler for (and the
// SIGKILL of an ancestor namespace). Its one handler is for SIGTERM, and ends the sandbox
// (exit_group: the kernel then SIGKILLs every other process of the pid namespace) only when
// the sender is outside the sandbox: kill() or tgkill() (si_code SI_USER or SI_TKILL, whose
// si_pid the kernel fills in, so a guest cannot forge it) from a process the sandbox's pid
// namespace cannot see (si_pid 0). Every other SIGTERM returns (through the restorer's
// rt_sigreturn) and is ignored, so a guest still cannot end its sandbox with kill -TERM 1. So
// systemd's SIGTERM to every remaining process at host shutdown ends a sandbox at once, where
// an init with no handler would hold the shutdown for its 90 s timeout. A daemon restart does
// not signal sandboxes (the unit's KillMode=process signals only the daemon).
//
// keeperCodeAMD64 is this assembly (GNU as, intel syntax), assembled with `as --64` and copied
// out of .text with `objcopy -O binary -j .text`:
//
//	_start:   mov rdi, [rsp + 8]          # argv[0]
//	          mov rsi, [rsp + 16]         # argv[1]: the title
//	          test rsi, rsi
//	          jz 3f
//	2:        mov al, [rsi]               # copy it over argv[0], its NUL included
//	          mov [rdi], al
//	          inc rsi
//	          inc rdi
//	          test al, al
//	          jnz 2b
//	          mov byte ptr [rsi - 1], 0x20  # the last byte of the arguments: not NUL
//	3:        mov edi, 15                 # prctl(PR_SET_NAME, comm)
//	          lea rsi, [rip + comm]
//	          mov eax, 157
//	          syscall
//	          sub rsp, 32                 # struct sigaction on the stack
//	          lea rax, [rip + onterm]
//	          mov [rsp], rax              # handler
//	          mov qword ptr [rsp + 8], 0x04000004  # SA_SIGINFO | SA_RESTORER
//	          lea rax, [rip + restorer]
//	          mov [rsp + 16], rax         # restorer
//	          mov qword ptr [rsp + 24], 0 # mask
//	          mov edi, 15                 # rt_sigaction(SIGTERM, &act, NULL, 8)
//	          mov rsi, rsp
//	          xor edx, edx
//	          mov r10d, 8
//	          mov eax, 13
//	          syscall
//	          mov edi, 3
//	          mov eax, 3                  # close(3): drop the inherited memfd
//	          syscall
//	1:        mov edi, -1
//	          xor esi, esi
//	          xor edx, edx
//	          xor r10d, r10d
//	          mov eax, 61                 # wait4(-1, NULL, 0, NULL)
//	          syscall
//	          test rax, rax
//	          jns 1b                      # reaped one: look for the next
//	          cmp rax, -4                 # EINTR (a signal came)
//	          je 1b
//	          lea rdi, [rip + ts]
//	          xor esi, esi
//	          mov eax, 35                 # nanosleep(&ts, NULL): no child now
//	          syscall
//	          jmp 1b
//	onterm:   mov eax, [rsi + 8]          # siginfo.si_code
//	          test eax, eax               # SI_USER
//	          je 4f
//	          cmp eax, -6                 # SI_TKILL
//	          jne 5f
//	4:        cmp dword ptr [rsi + 16], 0 # siginfo.si_pid: 0 when sent from outside
//	          jne 5f
//	          mov edi, 143
//	          mov eax, 231                # exit_group(128 + SIGTERM)
//	          syscall
//	5:        ret
//	restorer: mov eax, 15                 # rt_sigreturn
//	          syscall
//	ts:       .quad 1, 0                  # one second
//	comm:     .asciz "enforcerd-init"
var keeperCodeAMD64 = []byte{
	0x48, 0x8b, 0x7c, 0x24, 0x08, 0x48, 0x8b, 0x74, 0x24, 0x10, 0x48, 0x85,
	0xf6, 0x74, 0x12, 0x8a, 0x06, 0x88, 0x07, 0x48, 0xff, 0xc6, 0x48, 0xff,
	0xc7, 0x84, 0xc0, 0x75, 0xf2, 0xc6, 0x46, 0xff, 0x20, 0xbf, 0x0f, 0x00,
	0x00, 0x00, 0x48, 0x8d, 0x35, 0xbd, 0x00, 0x00, 0x00, 0xb8, 0x9d, 0x00,
	0x00, 0x00, 0x0f, 0x05, 0x48, 0x83, 0xec, 0x20, 0x48, 0x8d, 0x05, 0x75,
	0x00, 0x00, 0x00, 0x48, 0x89, 0x04, 0x24, 0x48, 0xc7, 0x44, 0x24, 0x08,
	0x04, 0x00, 0x00, 0x04, 0x48, 0x8d, 0x05, 0x80, 0x00, 0x00, 0x00, 0x48,
	0x89, 0x44, 0x24, 0x10, 0x48, 0xc7, 0x44, 0x24, 0x18, 0x00, 0x00, 0x00,
	0x00, 0xbf, 0x0f, 0x00, 0x00, 0x00, 0x48, 0x89, 0xe6, 0x31, 0xd2, 0x41,
	0xba, 0x08, 0x00, 0x00, 0x00, 0xb8, 0x0d, 0x00, 0x00, 0x00, 0x0f, 0x05,
	0xbf, 0x03, 0x00, 0x00, 0x00, 0xb8, 0x03, 0x00, 0x00, 0x00, 0x0f, 0x05,
	0xbf, 0xff, 0xff, 0xff, 0xff, 0x31, 0xf6, 0x31, 0xd2, 0x45, 0x31, 0xd2,
	0xb8, 0x3d, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x85, 0xc0, 0x79, 0xe8,
	0x48, 0x83, 0xf8, 0xfc, 0x74, 0xe2, 0x48, 0x8d, 0x3d, 0x31, 0x00, 0x00,
	0x00, 0x31, 0xf6, 0xb8, 0x23, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xeb, 0xd0,
	0x8b, 0x46, 0x08, 0x85, 0xc0, 0x74, 0x05, 0x83, 0xf8, 0xfa, 0x75, 0x12,
	0x83, 0x7e, 0x10, 0x00, 0x75, 0x0c, 0xbf, 0x8f, 0x00, 0x00, 0x00, 0xb8,
	0xe7, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xc3, 0xb8, 0x0f, 0x00, 0x00, 0x00,
	0x0f, 0x05, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x65, 0x6e, 0x66, 0x6f, 0x72, 0x63,
	0x65, 0x72, 0x64, 0x2d, 0x69, 0x6e, 0x69, 0x74, 0x00,
}

// keeperFD is the fd number the keeper is inherited as in the container's init (the first of
// Process.ExtraFiles); keeperPath is how the init executes it.
const keeperFD = 3

var keeperPath = "/proc/self/fd/" + strconv.Itoa(keeperFD)

// keeperArgs is the keeper's command line: it runs keeperPath and shows itself as argv[1]
// ("enforcerd init SESSION").
func keeperArgs(session string) []string {
	return []string{keeperPath, "enforcerd init " + session}
}

// keeperBase is the address the keeper is loaded at (above vm.mmap_min_addr).
const keeperBase = 0x400000

// keeperELF returns the keeper as a static ELF executable for goarch: one read+execute
// PT_LOAD segment holding the headers and the code, entry right after the headers.
func keeperELF(goarch string) ([]byte, error) {
	var code []byte
	var machine elf.Machine
	switch goarch {
	case "amd64":
		code, machine = keeperCodeAMD64, elf.EM_X86_64
	default:
		return nil, fmt.Errorf("sandbox keeper: no built-in keeper for GOARCH %s; only amd64 is supported", goarch)
	}
	const hdrs = 64 + 56 // ELF64 header + one program header
	size := uint64(hdrs + len(code))
	var b bytes.Buffer
	ident := [elf.EI_NIDENT]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)}
	hdr := elf.Header64{
		Ident:     ident,
		Type:      uint16(elf.ET_EXEC),
		Machine:   uint16(machine),
		Version:   uint32(elf.EV_CURRENT),
		Entry:     keeperBase + hdrs,
		Phoff:     64,
		Ehsize:    64,
		Phentsize: 56,
		Phnum:     1,
		Shentsize: 64,
	}
	prog := elf.Prog64{
		Type:   uint32(elf.PT_LOAD),
		Flags:  uint32(elf.PF_R | elf.PF_X),
		Off:    0,
		Vaddr:  keeperBase,
		Paddr:  keeperBase,
		Filesz: size,
		Memsz:  size,
		Align:  0x1000,
	}
	_ = binary.Write(&b, binary.LittleEndian, hdr) // writes to a bytes.Buffer cannot fail
	_ = binary.Write(&b, binary.LittleEndian, prog)
	b.Write(code)
	return b.Bytes(), nil
}

// newKeeperFile puts the keeper into a sealed, read-only memfd (no file on any disk, no way to
// change it once sealed) and returns it opened read-only.
func newKeeperFile(goarch string) (*os.File, error) {
	exe, err := keeperELF(goarch)
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("enforcerd-keeper", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("sandbox keeper: memfd_create: %w", err)
	}
	rw := os.NewFile(uintptr(fd), "enforcerd-keeper")
	defer rw.Close()
	if _, err := rw.Write(exe); err != nil {
		return nil, fmt.Errorf("sandbox keeper: write: %w", err)
	}
	if err := rw.Chmod(0o555); err != nil {
		return nil, fmt.Errorf("sandbox keeper: chmod: %w", err)
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(rw.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return nil, fmt.Errorf("sandbox keeper: seal: %w", err)
	}
	// A read-only description of the same memfd: exec refuses a file open for writing.
	ro, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(rw.Fd())), os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sandbox keeper: reopen read-only: %w", err)
	}
	return ro, nil
}
