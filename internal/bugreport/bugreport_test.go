package bugreport

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

func TestScrub(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:hunter2@api.example.com/x":           "https://api.example.com/x",
		`{"scope":["https://u:p@ss@h.example.org:8443/"]}`: `{"scope":["https://h.example.org:8443/"]}`,
		"see ftp://anon@files.example.net and more":        "see ftp://files.example.net and more",
		"mail root@example.com, not a URL":                 "mail root@example.com, not a URL",
		"https://api.example.com/a@b":                      "https://api.example.com/a@b",
		"no at sign here":                                  "no at sign here",
	} {
		if got := string(Scrub([]byte(in))); got != want {
			t.Errorf("Scrub(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestArchive: the archive holds summary.json and each available section
// under one directory, mode 0600; an unavailable section is in the
// summary with its note and has no file; every section is scrubbed.
func TestArchive(t *testing.T) {
	rep := &Report{Created: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
	rep.AddJSON("version", "version.json", map[string]string{"version": "1.0"}, nil)
	rep.AddJSON("health", "health.json", nil, errors.New("the daemon did not answer:\n  connection refused"))
	rep.Add("log", "log.txt", []byte("level=ERROR msg=x url=https://u:secret@h.example.com/\n"), "")
	rep.Add("partial", "partial.txt", []byte("some\n"), "only some")
	var buf bytes.Buffer
	if err := rep.WriteArchive(&buf, "br"); err != nil {
		t.Fatal(err)
	}
	files := readArchive(t, &buf)
	if got := slices.Sorted(maps.Keys(files)); !slices.Equal(got, []string{"br/log.txt", "br/partial.txt", "br/summary.json", "br/version.json"}) {
		t.Fatalf("archive files %v", got)
	}
	if strings.Contains(files["br/log.txt"], "secret") {
		t.Errorf("log.txt kept a URL's password: %q", files["br/log.txt"])
	}
	var sum Summary
	if err := json.Unmarshal([]byte(files["br/summary.json"]), &sum); err != nil {
		t.Fatal(err)
	}
	want := []SectionSummary{
		{Name: "version", File: "version.json", Status: "ok", Bytes: len(files["br/version.json"])},
		{Name: "health", File: "health.json", Status: "unavailable", Note: "the daemon did not answer: connection refused"},
		{Name: "log", File: "log.txt", Status: "ok", Bytes: len(files["br/log.txt"])},
		{Name: "partial", File: "partial.txt", Status: "partial", Note: "only some", Bytes: 5},
	}
	if !slices.Equal(sum.Sections, want) || !sum.Created.Equal(rep.Created) {
		t.Errorf("summary %+v, want %+v", sum, want)
	}
}

func readArchive(t *testing.T, r io.Reader) map[string]string {
	t.Helper()
	gz, err := gzip.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Mode != 0o600 || hdr.Typeflag != tar.TypeReg {
			t.Errorf("%s: mode %o type %c, want a regular file 0600", hdr.Name, hdr.Mode, hdr.Typeflag)
		}
		b, _ := io.ReadAll(tr)
		files[hdr.Name] = string(b)
	}
}

// TestSessionsCarryNoSecrets: the summary counts policy entries and keeps
// labels; no entry, scope, pin or rootfs reaches it.
func TestSessionsCarryNoSecrets(t *testing.T) {
	info := api.SessionInfo{
		Name: "s1", Egress: "allowlist", Sandbox: true, Rootfs: "/images/secret-image",
		Policy:      api.PolicyView{Allow: []string{"https://user:hunter2@api.example.com", "b.example.com"}, Deny: []string{"c.example.com"}, OnDeny: "drop", Generation: 2, Pinned: map[string][]string{"p.example.com": {"198.18.0.1"}}},
		SandboxView: &api.SandboxView{MemoryBytes: 1 << 20, Pids: 64, CPUs: 1},
		Attested:    []api.AttestedAddr{{IP: "198.18.0.9:443/tcp"}},
		Labels:      map[string]string{"run": "42"},
	}
	got := Sessions([]api.SessionInfo{info})
	b, _ := json.Marshal(got)
	for _, leak := range []string{"hunter2", "api.example.com", "b.example.com", "c.example.com", "p.example.com", "secret-image", "198.18.0.9"} {
		if strings.Contains(string(b), leak) {
			t.Errorf("session summary holds %q: %s", leak, b)
		}
	}
	s := got[0]
	if s.Allow != 2 || s.Deny != 1 || s.Pinned != 1 || s.Attested != 1 || s.Generation != 2 || s.Labels["run"] != "42" || s.MemoryBytes != 1<<20 || !s.Sandbox {
		t.Errorf("session summary %+v", s)
	}
	if empty := Sessions(nil); empty == nil || len(empty) != 0 {
		t.Errorf("Sessions(nil) = %#v, want an empty list (JSON [])", empty)
	}
}

func TestLogFileErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "enforcerd.log")
	log := "time=1 level=INFO msg=a\ntime=2 level=WARN msg=b\n{\"level\":\"ERROR\",\"msg\":\"c\"}\ntime=4 level=ERROR msg=d\ntime=5 level=INFO msg=e\n"
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LogFileErrors(path, 2)
	if want := "{\"level\":\"ERROR\",\"msg\":\"c\"}\ntime=4 level=ERROR msg=d\n"; err != nil || string(got) != want {
		t.Errorf("LogFileErrors(2) = %q, %v; want %q", got, err, want)
	}
	os.WriteFile(path, []byte("time=1 level=INFO msg=a\n"), 0o600)
	if _, err := LogFileErrors(path, 2); err == nil || !strings.Contains(err.Error(), "no ERROR or WARN line") {
		t.Errorf("a log without errors: %v", err)
	}
	if _, err := LogFileErrors(filepath.Join(t.TempDir(), "none"), 2); err == nil {
		t.Errorf("a missing log: no error")
	}
}

// TestPackagesCoverMakefile: every package the Makefile's PKGS installs
// has its version recorded.
func TestPackagesCoverMakefile(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	// (the value may go on over lines ending in a backslash)
	joined := strings.ReplaceAll(string(mk), "\\\n", " ")
	m := regexp.MustCompile(`(?m)^PKGS\s*:?=\s*(.*)$`).FindStringSubmatch(joined)
	if m == nil {
		t.Fatal("no PKGS line in the Makefile")
	}
	for _, p := range strings.Fields(m[1]) {
		if !slices.Contains(Packages, p) {
			t.Errorf("the Makefile installs %s; bugreport.Packages does not record its version", p)
		}
	}
}

func TestKernel(t *testing.T) {
	k, err := Kernel()
	if err != nil || !strings.HasPrefix(string(k), "uname: Linux ") {
		t.Errorf("Kernel() = %q, %v", k, err)
	}
}
