package container

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestHeldRecords(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "output"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := &heldLog{f: f, max: 64}
	out, errs := heldStream{l, StreamStdout}, heldStream{l, StreamStderr}
	for _, w := range []struct {
		s heldStream
		p string
	}{{out, "one\n"}, {errs, "two\n"}, {out, "three\n"}} {
		if n, err := w.s.Write([]byte(w.p)); err != nil || n != len(w.p) {
			t.Fatalf("write %q: %d, %v", w.p, n, err)
		}
	}
	recs, end, err := ReadHeldRecords(f, 0, 1<<20)
	if err != nil || len(recs) != 3 {
		t.Fatalf("read: %d records, %v", len(recs), err)
	}
	if recs[1].Stream != StreamStderr || string(recs[1].Data) != "two\n" || recs[2].End != end {
		t.Fatalf("records: %+v end %d", recs, end)
	}
	// Resuming at a record's end gives exactly the records after it.
	rest, _, err := ReadHeldRecords(f, recs[0].End, 1<<20)
	if err != nil || len(rest) != 2 || string(rest[0].Data) != "two\n" {
		t.Fatalf("resume: %+v %v", rest, err)
	}
	for off, want := range map[int64]bool{0: true, recs[0].End: true, recs[0].End + 1: false, end: true, end + 1: false} {
		if ok, err := HeldBoundary(f, off); err != nil || ok != want {
			t.Errorf("boundary %d: %v %v, want %v", off, ok, err, want)
		}
	}
	// Past the bound: one note on stderr, then nothing; the writer is never refused.
	if n, err := out.Write(bytes.Repeat([]byte("x"), 40)); err != nil || n != 40 {
		t.Fatalf("write past the bound: %d %v", n, err)
	}
	_, _ = out.Write([]byte("more"))
	recs, _, _ = ReadHeldRecords(f, end, 1<<20)
	if len(recs) != 1 || recs[0].Stream != StreamStderr || !strings.Contains(string(recs[0].Data), "passed 64 bytes; the rest is discarded") {
		t.Fatalf("after the bound: %+v", recs)
	}
	// A record half written is not read yet.
	fi, _ := f.Stat()
	if _, err := f.Write([]byte{StreamStdout, 0, 0, 0, 9, 'a'}); err != nil {
		t.Fatal(err)
	}
	recs, off, err := ReadHeldRecords(f, fi.Size(), 1<<20)
	if err != nil || len(recs) != 0 || off != fi.Size() {
		t.Fatalf("partial record: %+v %d %v", recs, off, err)
	}
}

// A holder's command line names its role, session and exec; its DIR comes from the
// environment and must end in that session and exec, or the holder refuses to run.
func TestHolderCommandLine(t *testing.T) {
	dir := "/var/lib/enforcerd/execs/box/0123456789abcdef"
	if got := strings.Join(holderArgs(dir), " "); got != "enforcerd exec-holder box 0123456789abcdef" {
		t.Errorf("holderArgs = %q", got)
	}
	for _, tc := range []struct {
		env  string
		args []string
	}{
		{"", []string{"box", "0123456789abcdef"}},
		{dir, []string{"other", "0123456789abcdef"}},
		{dir, []string{"box"}},
	} {
		t.Setenv(HolderDirEnv, tc.env)
		if code := RunHolderCommand(tc.args); code != 125 {
			t.Errorf("%s=%q, args %q: exit %d, want 125", HolderDirEnv, tc.env, tc.args, code)
		}
	}
	if pid := HolderPid(t.TempDir()); pid != 0 {
		t.Errorf("HolderPid of a dir without holder.pid: %d", pid)
	}
	// A pid that is not a holder (here the test itself) is not taken for one.
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, heldPidFile), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if pid := HolderPid(other); pid != 0 {
		t.Errorf("HolderPid took the test process %d for a holder", pid)
	}
}
