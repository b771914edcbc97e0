package container

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// writeInPlace keeps the inode (a file bind mount holds it) and leaves
// exactly the new content, shorter or longer than the old.
func TestWriteInPlace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(p, []byte("127.0.0.1\tlocalhost\n198.18.1.10\tapi.e2e.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ino := func() uint64 {
		t.Helper()
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return st.Sys().(*syscall.Stat_t).Ino
	}
	was := ino()
	for _, want := range []string{
		"127.0.0.1\tlocalhost\n", // shorter
		"127.0.0.1\tlocalhost\n198.18.1.11\tdocs.e2e.test\n198.18.2.10\tcdn.e2e.test\n", // longer
		"x\n",
		"127.0.0.1\tlocalhost\n", // one byte of padding would be left: none is
	} {
		if err := writeInPlace(p, []byte(want)); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("after writing %q the file holds %q", want, got)
		}
		if ino() != was {
			t.Errorf("writing %q replaced the inode", want)
		}
	}
	if err := writeInPlace(filepath.Join(t.TempDir(), "missing"), []byte("x\n")); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v, want not-exist (it is never created)", err)
	}
}
