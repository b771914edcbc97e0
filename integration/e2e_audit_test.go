package integration

// The audit trail end to end: every change through the API is an event
// with its caller's uid (root and a socket-group member), the events of a
// live session survive restarts of the daemon (SIGTERM and kill -9), a
// removed session's stay readable, --since filters, a --follow exits 1
// when the daemon goes away, and a scope's userinfo is nowhere on disk.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// e2eAuditEvent is an event line with its caller.
type e2eAuditEvent struct {
	e2eEvent
	Caller *struct {
		UID uint32 `json:"uid"`
		GID uint32 `json:"gid"`
		PID int32  `json:"pid"`
	} `json:"caller"`
}

func (ev e2eAuditEvent) key() string {
	return fmt.Sprintf("%s %s %s %s", ev.Time.Format(time.RFC3339Nano), ev.Session, ev.Kind, ev.Action)
}

// e2eAuditEvents parses event lines, leaving out the summary lines (the
// counts that end a session's events as read, whose time is the read's:
// TestE2EEventsFlood reads them).
func e2eAuditEvents(t *testing.T, out string) []e2eAuditEvent {
	t.Helper()
	var evs []e2eAuditEvent
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var ev e2eAuditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event line %q: %v", sc.Text(), err)
		}
		if ev.Kind == "summary" {
			continue
		}
		evs = append(evs, ev)
	}
	return evs
}

// e2eFollower is a running `enforcerd ... --follow`.
type e2eFollower struct {
	cmd    *exec.Cmd
	stderr strings.Builder
	lines  chan string
	done   chan int
}

func (e *e2eEnv) follow(args ...string) *e2eFollower {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	e.t.Cleanup(cancel)
	f := &e2eFollower{lines: make(chan string, 1024), done: make(chan int, 1)}
	f.cmd = e.d.Command(ctx, args...)
	f.cmd.Stderr = &f.stderr
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := f.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			f.lines <- sc.Text()
		}
		err := f.cmd.Wait()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			code = -1
		}
		f.done <- code
	}()
	return f
}

// waitLine waits for a followed line containing want.
func (f *e2eFollower) waitLine(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case l := <-f.lines:
			if strings.Contains(l, want) {
				return
			}
		case <-deadline:
			t.Fatalf("%s: no line with %q", strings.Join(f.cmd.Args, " "), want)
		}
	}
}

// expectCut waits for the follower to end as it must when the daemon
// goes away: exit 1 and one line saying so.
func (f *e2eFollower) expectCut(t *testing.T, when string) {
	t.Helper()
	select {
	case code := <-f.done:
		msg := f.stderr.String()
		if code != 1 || !strings.Contains(msg, "the daemon went away while following") {
			t.Errorf("%s: %s: exit %d stderr %q, want exit 1 and the daemon went away", when, strings.Join(f.cmd.Args[1:], " "), code, msg)
		}
		e2eOneLine(t, when, msg)
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: %s still runs", when, strings.Join(f.cmd.Args[1:], " "))
	}
}

func TestE2EAuditTrail(t *testing.T) {
	dir, err := os.MkdirTemp("", "e2e-audit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	e := prepareE2E(t, dir, "--socket-group", fmt.Sprint(e2eSocketGroup))
	client := filepath.Join(dir, "enforcerd-client")
	e2eCopyFile(t, e.bin, client, 0o755)
	e.start()
	asMember := func(args ...string) string {
		t.Helper()
		out, errOut, code := e.asUser(client, e2eNobody, e2eSocketGroup, []uint32{}, args...)
		if code != 0 {
			t.Fatalf("uid %d: enforcerd %s: exit %d: %s%s", e2eNobody, strings.Join(args, " "), code, out, errOut)
		}
		return out
	}

	const secret = "s3cr3t-pw"
	e.create("aud", "--allow", "api.e2e.test", "--scope", "https://agent:"+secret+"@docs.e2e.test/v1", "--label", "audit=1")
	asMember("session", "create", "member", "--network-only", "--label", "audit=1")
	asMember("session", "exec", "aud", "--", "true")
	e.cli("session", "exec", "aud", "--", "true")
	if out, code := e.nslookup("aud", "api.e2e.test"); code != 0 {
		t.Fatalf("nslookup: exit %d\n%s", code, out)
	}
	mark := time.Now().UTC()
	time.Sleep(20 * time.Millisecond)
	asMember("session", "rm", "member")

	// The caller's uid is on every change.
	// aud: created, the member's exec, root's exec and nslookup (an exec).
	wantUID := map[string][]uint32{"aud": {0, e2eNobody, 0, 0}, "member": {e2eNobody, e2eNobody}}
	for name, want := range wantUID {
		var got []uint32
		// An exec's event is recorded when it ends: wait for them all.
		for deadline := time.Now().Add(10 * time.Second); ; {
			got = nil
			for _, ev := range e2eAuditEvents(t, e.cli("session", "events", name)) {
				if ev.Kind != "lifecycle" {
					continue
				}
				if ev.Caller == nil {
					t.Fatalf("%s: %s event without a caller: %+v", name, ev.Action, ev)
				}
				if ev.Detail["outcome"] != "ok" {
					t.Errorf("%s: %s outcome %v", name, ev.Action, ev.Detail["outcome"])
				}
				got = append(got, ev.Caller.UID)
			}
			if len(got) >= len(want) || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: callers %v, want %v (created, exec..., deleted)", name, got, want)
		}
	}
	// --since: only what came after the mark (the member's rm), and the
	// removed session is still readable.
	if evs := e2eAuditEvents(t, e.cli("session", "events", "member", "--since", mark.Format(time.RFC3339Nano))); len(evs) != 1 || evs[0].Action != "deleted" {
		t.Errorf("member --since the mark: %+v, want its deleted event only", evs)
	}
	if evs := e2eAuditEvents(t, e.cli("events", "--label", "audit=1")); len(evs) == 0 || evs[0].Session != "aud" {
		t.Errorf("events --label audit=1: %+v, want aud's (member is removed)", evs)
	}

	// The scope's userinfo is in no file of the state dir.
	_ = filepath.Walk(e.d.StateDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if data, _ := os.ReadFile(p); strings.Contains(string(data), secret) {
				t.Errorf("%s holds the scope's password", p)
			}
		}
		return nil
	})
	if log := e.d.Log(); strings.Contains(log, secret) {
		t.Error("the daemon's log holds the scope's password")
	}
	if out := e.cli("session", "events", "aud"); !strings.Contains(out, `"scope":["https://docs.e2e.test/v1"]`) {
		t.Errorf("aud's created event lacks the stripped scope:\n%s", out)
	}

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		all := e.follow("events", "--follow")
		one := e.follow("session", "events", "aud", "--follow")
		e.cli("session", "exec", "aud", "--", "true") // an event both see
		all.waitLine(t, `"action":"exec"`)
		one.waitLine(t, `"action":"exec"`)
		before := e2eAuditEvents(t, e.cli("session", "events", "aud"))

		if err := e.d.Signal(sig); err != nil {
			t.Fatalf("%s: %v", sig, err)
		}
		all.expectCut(t, "events --follow at "+sig.String())
		one.expectCut(t, "session events --follow at "+sig.String())
		e.start()

		after := e2eAuditEvents(t, e.cli("session", "events", "aud"))
		if len(after) < len(before)+1 {
			t.Fatalf("after %s: %d events, want the %d before and adopted", sig, len(after), len(before))
		}
		for i, ev := range before {
			if after[i].key() != ev.key() {
				t.Fatalf("after %s: event %d is %s, was %s: events lost", sig, i, after[i].key(), ev.key())
			}
		}
		if last := after[len(after)-1]; last.Action != "adopted" || last.Caller != nil {
			t.Errorf("after %s: last event %+v, want adopted (no caller)", sig, last)
		}
	}
	e.cli("session", "rm", "aud")
}
