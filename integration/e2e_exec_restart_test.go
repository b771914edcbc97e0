package integration

// An exec outlives the daemon: it runs in a holder process of its own, the
// restarted daemon re-adopts it, and the CLI resumes the output where the
// stream was cut, so what it prints is exactly an uninterrupted run's.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// execCounter prints a counter on both streams every 100 ms for 4 s and
// exits 3.
const execCounter = `i=0; while [ $i -lt 40 ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); sleep 0.1; done; exit 3`

// lockedBuffer is a strings.Builder safe to read while a process writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// holderPids are the exec holders of this daemon's state dir: processes whose command line is
// "enforcerd exec-holder SESSION ID" and whose environment names an exec dir under stateDir.
func holderPids(stateDir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) != 4 || args[0] != "enforcerd" || args[1] != "exec-holder" {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", ent.Name(), "environ"))
		want := "ENFORCERD_EXEC_DIR=" + filepath.Join(stateDir, "execs", args[2], args[3])
		if slices.Contains(strings.Split(string(env), "\x00"), want) {
			if pid, err := strconv.Atoi(ent.Name()); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func TestE2EExecOutlivesRestart(t *testing.T) {
	e := newE2E(t)
	e.create("box")

	wantOut, wantErr, code := e.run("session", "exec", "box", "--", "sh", "-c", execCounter)
	if code != 3 || !strings.HasSuffix(wantOut, "out 39\n") || !strings.HasSuffix(wantErr, "err 39\n") {
		t.Fatalf("uninterrupted run: exit %d, stdout %q, stderr %q", code, wantOut, wantErr)
	}

	for _, how := range []string{"SIGTERM", "SIGKILL"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
			defer cancel()
			cmd := e.d.Command(ctx, "session", "exec", "box", "--", "sh", "-c", execCounter)
			var out, errOut lockedBuffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for !strings.Contains(out.String(), "out 8\n") {
				if time.Now().After(deadline) {
					t.Fatalf("no output: %q %q", out.String(), errOut.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			var err error
			if how == "SIGTERM" {
				err = e.d.Stop()
			} else {
				err = e.d.Kill()
			}
			if err != nil {
				t.Fatalf("%s the daemon: %v", how, err)
			}
			// The daemon is gone; the exec runs on: its output grows in
			// the holder's record while nobody reads it.
			if n := len(holderPids(e.d.StateDir)); n != 1 {
				t.Errorf("after %s of the daemon: %d exec holders, want 1", how, n)
			}
			atDown := out.String()
			time.Sleep(time.Second)
			e.start()
			if err := cmd.Wait(); cmd.ProcessState.ExitCode() != 3 {
				t.Fatalf("exec across %s of the daemon: exit %d (%v), want 3\nstderr %q", how, cmd.ProcessState.ExitCode(), err, errOut.String())
			}
			if out.String() != wantOut || errOut.String() != wantErr {
				t.Fatalf("exec across %s: output differs from an uninterrupted run\nstdout %q\n want %q\nstderr %q\n want %q",
					how, out.String(), wantOut, errOut.String(), wantErr)
			}
			if atDown == wantOut {
				t.Errorf("the whole output came before %s: the restart was not mid-way", how)
			}
		})
	}

	// --detach returns the ID at once; exec-status says running, then
	// exited 3; logs prints the recorded output.
	id := strings.TrimSpace(e.cli("session", "exec", "box", "--detach", "--", "sh", "-c", "echo one; echo two >&2; sleep 1; echo three; exit 3"))
	if len(id) != 16 {
		t.Fatalf("exec --detach printed %q, want an exec ID", id)
	}
	var info api.ExecInfo
	if err := json.Unmarshal([]byte(e.cli("session", "exec-status", "box", id)), &info); err != nil || info.State != api.ExecRunning || info.ID != id {
		t.Errorf("exec-status of a running exec: %+v %v", info, err)
	}
	// Across a restart while detached.
	if err := e.d.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	e.start()
	if err := json.Unmarshal([]byte(e.cli("session", "exec-status", "box", id)), &info); err != nil || info.State != api.ExecExited || info.Exit == nil || *info.Exit != 3 {
		t.Errorf("exec-status after the exec ended while the daemon was down: %+v %v", info, err)
	}
	if out, errOut, code := e.run("session", "logs", "box", id); code != 0 || out != "one\nthree\n" || errOut != "two\n" {
		t.Errorf("session logs: exit %d stdout %q stderr %q", code, out, errOut)
	}
	if out, _, code := e.run("session", "exec", "box", "--attach", id); code != 3 || out != "one\nthree\n" {
		t.Errorf("session exec --attach of an ended exec: exit %d stdout %q", code, out)
	}
	var list []api.ExecInfo
	if err := json.Unmarshal([]byte(e.cli("session", "exec-status", "box")), &list); err != nil || len(list) != 4 || list[3].ID != id {
		t.Errorf("exec-status of every exec: %d execs, %v", len(list), err)
	}

	// The control: an exec in a session deleted meanwhile ends, and its
	// holder is gone with it.
	e.create("gone")
	e.cli("session", "exec", "gone", "--detach", "--", "sleep", "4244")
	deadline := time.Now().Add(5 * time.Second)
	for len(e2eProcesses("sleep", "4244")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the detached exec never ran")
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.cli("session", "rm", "gone")
	if p := e2eProcesses("sleep", "4244"); len(p) != 0 {
		t.Errorf("the exec of a deleted session still runs: %v", p)
	}
	if n := len(holderPids(e.d.StateDir)); n != 0 {
		t.Errorf("%d exec holders left after the session was deleted", n)
	}
	if _, err := os.Stat(filepath.Join(e.d.StateDir, "execs", "gone")); !os.IsNotExist(err) {
		t.Errorf("the deleted session's execs dir: %v, want it gone", err)
	}
}
