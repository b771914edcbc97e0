package container

import (
	"bytes"
	"debug/elf"
	"testing"
)

func TestKeeperELF(t *testing.T) {
	b, err := keeperELF("amd64")
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not an ELF file: %v", err)
	}
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		t.Errorf("header %+v", f.FileHeader)
	}
	if len(f.Progs) != 1 {
		t.Fatalf("%d program headers, want 1", len(f.Progs))
	}
	p := f.Progs[0]
	if p.Type != elf.PT_LOAD || p.Flags != elf.PF_R|elf.PF_X || p.Off != 0 || p.Filesz != uint64(len(b)) || p.Memsz != p.Filesz {
		t.Errorf("segment %+v", p.ProgHeader)
	}
	if f.Entry != p.Vaddr+120 || f.Entry >= p.Vaddr+p.Memsz {
		t.Errorf("entry %#x outside the code of segment %#x+%d", f.Entry, p.Vaddr, p.Memsz)
	}
	if !bytes.Equal(b[120:], keeperCodeAMD64) {
		t.Error("code is not keeperCodeAMD64")
	}
	if _, err := keeperELF("mips"); errString(err) != "sandbox keeper: no built-in keeper for GOARCH mips; only amd64 is supported" {
		t.Errorf("mips: %v", err)
	}
}
