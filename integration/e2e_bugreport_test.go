package integration

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2EBugreport: `enforcerd bugreport` against the test daemon writes
// one tar.gz holding every section (versions of client and daemon, the
// effective config, doctor's JSON, health, the session summary, the
// daemon's warning and error lines, kernel and package versions), and a
// scope password given at create appears in no file of it. Control: the
// scoped session exists and shows the scope's host, so the password was
// given and accepted, and a log line carrying it is in the archive
// without it. With no daemon on the socket the archive is still
// written, the daemon's sections left out with a note each.
func TestE2EBugreport(t *testing.T) {
	e := newE2E(t)
	pw := fmt.Sprintf("pw%016x", rand.Uint64())
	e.createNetOnly("scoped", "--scope", "https://bugreport:"+pw+"@api.e2e.test/v1", "--label", "case=bugreport")
	if info := e.inspect("scoped"); !strings.Contains(strings.Join(info.Policy.Allow, " "), "api.e2e.test") || strings.Contains(fmt.Sprint(info), pw) {
		t.Fatalf("control: the scoped session's policy %v, want the scope's host and no password", info.Policy.Allow)
	}
	// A refused create carrying the password too (a bad port).
	e.expectFail(1, "session", "create", "refused", "--network-only", "--scope", "https://bugreport:"+pw+"@api.e2e.test:99999/")

	dir := t.TempDir()
	// The daemon logs no scope credential; a log line that carried one
	// anyway (here appended to a copy of its log) is scrubbed: the line is
	// in the archive, the password is not.
	daemonLog := filepath.Join(dir, "enforcerd.log")
	leak := "level=ERROR msg=\"test line\" url=https://bugreport:" + pw + "@api.e2e.test/v1\n"
	if err := os.WriteFile(daemonLog, []byte(e.d.Log()+leak), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(archive string, extra ...string) bugreportJSON {
		t.Helper()
		args := append([]string{"--net=" + e.w.HostPath, e.bin, "bugreport", "--json", "--output", archive, "--daemon-log", daemonLog},
			e.d.ServeArgs()[1:]...) // serve's options: the same config
		cmd := exec.Command("nsenter", append(args, extra...)...)
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("enforcerd bugreport: %v\n%s%s", err, out, stderr)
		}
		var got bugreportJSON
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("bugreport --json: %v: %s", err, out)
		}
		if got.Archive != archive {
			t.Errorf("bugreport --json names %s, want %s", got.Archive, archive)
		}
		return got
	}

	archive := filepath.Join(dir, "report.tar.gz")
	sum := run(archive)
	files := e2eReadArchive(t, archive)
	for name, content := range files {
		if strings.Contains(content, pw) {
			t.Errorf("%s holds the scope password", name)
		}
	}
	status := map[string]string{}
	for _, s := range sum.Sections {
		status[s.Name] = s.Status
		if s.Status != "ok" {
			t.Errorf("section %s: %s (%s), want ok against a running daemon", s.Name, s.Status, s.Note)
		}
	}
	want := map[string]string{ // each section's file and a text it must hold
		"version":    `"skew": false`,
		"config":     `"name_prefix": "` + e.d.Prefix + `"`,
		"doctor":     `"checks": [`,
		"health":     `"status": "ok"`,
		"sessions":   `"name": "scoped"`,
		"daemon-log": "PUBLIC OVERRIDE",
		"kernel":     "uname: Linux ",
		"packages":   "nftables ",
	}
	for _, s := range sum.Sections {
		delete(want, s.Name)
	}
	if len(want) > 0 {
		t.Errorf("sections missing from the summary: %v", want)
	}
	var prefix string
	for name := range files {
		prefix, _, _ = strings.Cut(name, "/")
	}
	for name, text := range map[string]string{
		"version.json":   `"daemon": {`,
		"config.json":    `"state_dir": "` + e.d.StateDir + `"`,
		"doctor.json":    `"checks": [`,
		"health.json":    `"status": "ok"`,
		"sessions.json":  `"case": "bugreport"`,
		"daemon-log.txt": `msg="test line" url=https://api.e2e.test/v1`,
		"kernel.txt":     "uname: Linux ",
		"packages.txt":   "nftables ",
		"summary.json":   `"sections": [`,
	} {
		content, ok := files[prefix+"/"+name]
		if !ok {
			t.Errorf("the archive has no %s (files: %v)", name, e2eKeys(files))
			continue
		}
		if !strings.Contains(content, text) {
			t.Errorf("%s does not hold %q:\n%s", name, text, e2eTail(content, 20))
		}
	}
	if c := files[prefix+"/sessions.json"]; !strings.Contains(c, `"allow_entries": 1`) || strings.Contains(c, "api.e2e.test") {
		t.Errorf("sessions.json: want counts and no policy entries:\n%s", c)
	}

	// No daemon on the socket: still an archive, the daemon's sections
	// noted as unavailable.
	degraded := filepath.Join(dir, "degraded.tar.gz")
	sum = run(degraded, "--socket", filepath.Join(dir, "none.sock"))
	files = e2eReadArchive(t, degraded)
	for _, s := range sum.Sections {
		switch s.Name {
		case "health", "sessions":
			if s.Status != "unavailable" || !strings.Contains(s.Note, "cannot reach enforcerd") {
				t.Errorf("without a daemon, section %s: %s %q, want unavailable naming why", s.Name, s.Status, s.Note)
			}
		default:
			if s.Status != "ok" {
				t.Errorf("without a daemon, section %s: %s %q, want ok", s.Name, s.Status, s.Note)
			}
		}
	}
	for name, content := range files {
		if strings.HasSuffix(name, "/version.json") && !strings.Contains(content, `"daemon_error": "not reachable`) {
			t.Errorf("without a daemon, version.json does not say the daemon is not reachable:\n%s", content)
		}
		if strings.HasSuffix(name, "/health.json") || strings.HasSuffix(name, "/sessions.json") {
			t.Errorf("without a daemon the archive has %s", name)
		}
	}
}

type bugreportJSON struct {
	Archive  string `json:"archive"`
	Sections []struct {
		Name, Status, Note string
	} `json:"sections"`
}

// e2eReadArchive returns the files of a tar.gz by name.
func e2eReadArchive(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if fi, _ := f.Stat(); fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %o, want 0600", path, fi.Mode().Perm())
	}
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("%s: %s: %v", path, hdr.Name, err)
		}
		files[hdr.Name] = string(b)
	}
}

func e2eKeys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
