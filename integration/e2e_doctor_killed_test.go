package integration

// doctor --datapath killed mid-run (issue 27 finding 4): what it left is
// removed by a later run, serve and reap, by its recorded prefix.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/doctor"
)

// startDoctorDatapath starts `enforcerd doctor --datapath` as e.doctor
// runs it, without waiting, and returns the process and the throwaway
// prefix of its run once its table and both netns exist (found by its
// record under the state dir: the file names the prefix).
func (e *e2eEnv) startDoctorDatapath() (*exec.Cmd, string) {
	e.t.Helper()
	cmd := exec.Command("nsenter", "--net="+e.w.HostPath, e.bin, "doctor",
		"--name-prefix", e.d.Prefix, "--state-dir", e.d.StateDir,
		"--upstream", e.w.DNS.Addr().String(), "--public-override", e.w.PublicOverride.String(), "--datapath")
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	dir := filepath.Join(e.d.StateDir, "doctor-datapath")
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir(dir)
		for _, ent := range ents {
			p := ent.Name()
			if ent.IsDir() || strings.HasPrefix(p, ".") {
				continue
			}
			o := e2eReadObjects(e.t, e.w, p, e.t.TempDir())
			if o.Table && len(o.Netns) == 2 && len(o.Links) >= 2 {
				return cmd, p
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatalf("doctor --datapath made no recorded table and netns within 20 s")
	return nil, ""
}

// killMidway SIGKILLs a doctor --datapath run mid-way and checks that it
// left its objects behind (the finding's state), by the exact prefix.
func (e *e2eEnv) killDoctorMidway() string {
	e.t.Helper()
	cmd, prefix := e.startDoctorDatapath()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		e.t.Fatal(err)
	}
	cmd.Wait()
	if left := e2eReadObjects(e.t, e.w, prefix, e.t.TempDir()); left.empty() {
		e.t.Fatalf("the killed run %s left nothing: the test would prove nothing", prefix)
	}
	return prefix
}

// As found (issue 27 finding 4): a `doctor --datapath` killed mid-run left
// a second table, two netns, two veths and addresses, and every later run
// failed with "choose another --pool". The run records its prefix first, so
// a later run, serve and reap remove exactly what it left.
func TestE2EDoctorDatapathKilled(t *testing.T) {
	e := prepareE2E(t, "")
	// A table that drops forwarded traffic holds the run in its 3 s wait
	// for delivery, so it is killed mid-way for sure.
	for _, cleaner := range []string{"doctor", "reap", "serve"} {
		hold := e.addForwardDrop(e.w.UniqueName("xf"))
		killed := e.killDoctorMidway()
		hold()
		switch cleaner {
		case "doctor":
			r := e.doctor(0, "--datapath")
			if r.rows[doctor.CheckDatapath] != doctor.StatusOK || !strings.Contains(r.out, "removed what the killed run "+killed+" left") {
				t.Errorf("the run after a killed one: datapath %q, want ok naming %s\n%s", r.rows[doctor.CheckDatapath], killed, r.out)
			}
			if m := throwawayRE.FindStringSubmatch(r.out); m == nil {
				t.Errorf("no throwaway prefix in\n%s", r.out)
			} else if left := e2eReadObjects(t, e.w, m[1], t.TempDir()); !left.empty() {
				t.Errorf("the second run left objects of %s: %s", m[1], left)
			}
		case "reap":
			if out, err := e.d.Reap(); err != nil || !strings.Contains(out, killed) {
				t.Errorf("reap after a killed run: %v, want it to name %s\n%s", err, killed, out)
			}
		case "serve":
			e.start()
			if err := e.d.Stop(); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(e.d.Log(), killed) {
				t.Errorf("serve after a killed run: its log does not name %s", killed)
			}
		}
		if left := e2eReadObjects(t, e.w, killed, t.TempDir()); !left.empty() {
			t.Errorf("%s after a killed run: objects of %s left: %s", cleaner, killed, left)
		}
		if ents, _ := os.ReadDir(filepath.Join(e.d.StateDir, "doctor-datapath")); len(ents) != 0 {
			var names []string
			for _, ent := range ents {
				names = append(names, ent.Name())
			}
			t.Errorf("%s after a killed run: records left: %v", cleaner, names)
		}
	}
}
