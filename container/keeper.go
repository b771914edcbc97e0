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
// What it does, forever: close(3); then wait4(-1) to reap any child (the orphans every exec'd
// process tree leaves are re-parented to it), and when it has no child, sleep a second and look
// again. It installs no signal handler, so as a pid namespace's init it ignores every signal
// sent from inside the sandbox; Destroy's SIGKILL comes from outside and ends the sandbox.
//
// keeperCodeAMD64 is this assembly (GNU as, intel syntax), assembled with `as --64` and copied
// out of .text with `objcopy -O binary`:
//
//	_start: mov edi, 3
//	        mov eax, 3          # close(3): drop the inherited memfd
//	        syscall
//	1:      mov edi, -1
//	        xor esi, esi
//	        xor edx, edx
//	        xor r10d, r10d
//	        mov eax, 61         # wait4(-1, NULL, 0, NULL)
//	        syscall
//	        test rax, rax
//	        jns 1b              # reaped one: look for the next
//	        cmp rax, -4         # EINTR
//	        je 1b
//	        lea rdi, [rip + ts]
//	        xor esi, esi
//	        mov eax, 35         # nanosleep(&ts, NULL): no child now
//	        syscall
//	        jmp 1b
//	ts:     .quad 1, 0          # one second
var keeperCodeAMD64 = []byte{
	0xbf, 0x03, 0x00, 0x00, 0x00, 0xb8, 0x03, 0x00, 0x00, 0x00, 0x0f, 0x05,
	0xbf, 0xff, 0xff, 0xff, 0xff, 0x31, 0xf6, 0x31, 0xd2, 0x45, 0x31, 0xd2,
	0xb8, 0x3d, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x85, 0xc0, 0x79, 0xe8,
	0x48, 0x83, 0xf8, 0xfc, 0x74, 0xe2, 0x48, 0x8d, 0x3d, 0x0b, 0x00, 0x00,
	0x00, 0x31, 0xf6, 0xb8, 0x23, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xeb, 0xd0,
	0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
	0x00, 0x00, 0x00, 0x00,
}

// keeperFD is the fd number the keeper is inherited as in the container's init (the first of
// Process.ExtraFiles); keeperPath is how the init executes it.
const keeperFD = 3

var keeperPath = "/proc/self/fd/" + strconv.Itoa(keeperFD)

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
