package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/api/apitest"
)

// startAPI serves a fake engine on a unix socket in a temp dir, as the
// daemon does (same listener, same SO_PEERCRED check), and returns a CLI
// whose ENFORCERD_SOCKET points at it.
func startAPI(t *testing.T) (*apitest.Engine, *testCLI, string) {
	t.Helper()
	f := apitest.New()
	sock := apitest.Serve(t, f)
	c := newTestCLI(t)
	c.env["ENFORCERD_SOCKET"] = sock
	return f, c, sock
}

// expect runs the CLI and checks the exit status and that stderr is empty
// or exactly one line.
func (c *testCLI) expect(t *testing.T, want int, args ...string) (string, string) {
	t.Helper()
	code := c.run(args...)
	out, errOut := c.out.String(), c.errOut.String()
	if code != want {
		t.Fatalf("enforcerd %s: exit %d, want %d\nstdout %q\nstderr %q", strings.Join(args, " "), code, want, out, errOut)
	}
	if errOut != "" && (strings.Count(errOut, "\n") != 1 || !strings.HasSuffix(errOut, "\n")) {
		t.Fatalf("enforcerd %s: stderr is not one line: %q", strings.Join(args, " "), errOut)
	}
	return out, errOut
}

func TestEndToEndSessions(t *testing.T) {
	f, c, sock := startAPI(t)

	// create: interleaved and repeatable flags reach the engine as given.
	out, _ := c.expect(t, 0, "session", "create", "s1", "--allow", "a.test", "--rootfs", "rel/root",
		"--allow=*.b.test:443", "--scope", "https://c.test/x", "--pin", "--egress", "allowlist",
		"--lab-peer", "lab1", "--lab-peer", "lab2", "--net-raw", "--memory", "256M", "--pids", "64", "--cpus", "1.5",
		"--label", "run=7", "--label", "owner=me", "--writable")
	wd, _ := os.Getwd()
	want := api.CreateRequest{Name: "s1", Rootfs: filepath.Join(wd, "rel/root"), Writable: true, Egress: "allowlist",
		Allow: []string{"a.test", "*.b.test:443"}, Scope: []string{"https://c.test/x"}, Pin: true,
		LabPeers: []string{"lab1", "lab2"}, NetRaw: true, MemoryBytes: 256 << 20, Pids: 64, CPUs: 1.5,
		Labels: map[string]string{"run": "7", "owner": "me"}}
	if !reflect.DeepEqual(f.Creates()[0], want) {
		t.Fatalf("engine got\n %+v\nwant\n %+v", f.Creates()[0], want)
	}
	if out != "created s1: netns enf-s1, guest 10.20.0.2, gateway 10.20.0.1, egress allowlist, sandbox yes\n" {
		t.Fatalf("create output %q", out)
	}

	out, _ = c.expect(t, 0, "session", "create", "--json", "s2", "--network-only", "--label", "run=8")
	var info api.SessionInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.Name != "s2" || info.Sandbox {
		t.Fatalf("create --json: %q %v", out, err)
	}

	// refusals: exit 1 and the daemon's one line.
	_, errOut := c.expect(t, 1, "session", "create", "s1", "--network-only")
	if errOut != "enforcerd session create: session \"s1\" already exists: session name taken\n" {
		t.Fatalf("taken: %q", errOut)
	}
	_, errOut = c.expect(t, 1, "session", "create", "bad-1", "--network-only")
	if errOut != "enforcerd session create: allow entry \"x y\": not a name, wildcard or CIDR: bad request\n" {
		t.Fatalf("bad: %q", errOut)
	}
	c.expect(t, 1, "session", "create", "full-1", "--network-only")

	// ls, human and JSON, with and without a label.
	out, _ = c.expect(t, 0, "session", "ls")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") || !strings.HasPrefix(lines[1], "s1 ") ||
		!strings.Contains(lines[1], "owner=me,run=7") || !strings.Contains(lines[2], "s2 ") {
		t.Fatalf("ls:\n%s", out)
	}
	out, _ = c.expect(t, 0, "session", "ls", "--json", "--label", "run=8")
	var list []api.SessionInfo
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].Name != "s2" {
		t.Fatalf("ls --json --label: %q %v", out, err)
	}
	if out, _ = c.expect(t, 0, "session", "ls", "--json", "--label", "run=none"); out != "[]\n" {
		t.Fatalf("empty ls --json: %q", out)
	}

	// inspect prints JSON; unknown is exit 1.
	out, _ = c.expect(t, 0, "session", "inspect", "s1")
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "netns", "guest_ip", "gateway_ip", "host_veth", "egress", "policy", "attested", "counters", "labels"} {
		if _, ok := m[k]; !ok {
			t.Errorf("inspect lacks %q", k)
		}
	}
	_, errOut = c.expect(t, 1, "session", "inspect", "nope")
	if errOut != "enforcerd session inspect: session \"nope\": unknown session\n" {
		t.Fatalf("inspect unknown: %q", errOut)
	}

	// --socket flag and global --socket beat the environment.
	c.env["ENFORCERD_SOCKET"] = "/nonexistent.sock"
	c.expect(t, 0, "session", "ls", "--socket", sock)
	c.expect(t, 0, "--socket", sock, "session", "ls")
	c.env["ENFORCERD_SOCKET"] = sock

	// events.
	out, _ = c.expect(t, 0, "session", "events", "s1")
	if !strings.Contains(out, `"action":"created"`) || strings.Count(out, "\n") != 1 {
		t.Fatalf("events: %q", out)
	}
	c.expect(t, 1, "session", "events", "nope")
	// inspect and events print JSON anyway; --json is accepted on both.
	if js, _ := c.expect(t, 0, "session", "inspect", "--json", "s1"); !json.Valid([]byte(js)) {
		t.Fatalf("inspect --json: %q", js)
	}
	if ev, _ := c.expect(t, 0, "session", "events", "s1", "--json"); ev != out {
		t.Fatalf("events --json: %q, want %q", ev, out)
	}

	// rm: an unknown name is reported, the others still go.
	c.expect(t, 0, "session", "create", "s3", "--network-only")
	out, errOut = c.expect(t, 1, "session", "rm", "s1", "nope", "s3")
	if out != "s1\ns3\n" || errOut != "enforcerd session rm: session \"nope\": unknown session\n" {
		t.Fatalf("rm: stdout %q stderr %q", out, errOut)
	}
	if out, _ = c.expect(t, 0, "session", "rm", "--label", "run=8"); out != "s2\n" {
		t.Fatalf("rm --label: %q", out)
	}
	if out, _ = c.expect(t, 0, "session", "rm", "--label", "run=8"); out != "" {
		t.Fatalf("rm --label again: %q", out)
	}
	// rm --json: one object of the removed names, by name or by label, and
	// still the failures on stderr.
	c.expect(t, 0, "session", "create", "s4", "--network-only", "--label", "run=9")
	c.expect(t, 0, "session", "create", "s5", "--network-only", "--label", "run=9")
	c.expect(t, 0, "session", "create", "s6", "--network-only")
	out, errOut = c.expect(t, 1, "session", "rm", "--json", "s6", "nope")
	if out != "{\n  \"deleted\": [\n    \"s6\"\n  ]\n}\n" || errOut != "enforcerd session rm: session \"nope\": unknown session\n" {
		t.Fatalf("rm --json s6 nope: stdout %q stderr %q", out, errOut)
	}
	out, _ = c.expect(t, 0, "session", "rm", "--label", "run=9", "--json")
	var del api.DeleteResponse
	if err := json.Unmarshal([]byte(out), &del); err != nil || len(del.Deleted) != 2 {
		t.Fatalf("rm --label --json: %q %v", out, err)
	}
	if out, _ = c.expect(t, 0, "session", "rm", "--label", "run=9", "--json"); out != "{\n  \"deleted\": []\n}\n" {
		t.Fatalf("rm --label --json again: %q", out)
	}
	if out, _ = c.expect(t, 0, "session", "ls", "--json"); out != "[]\n" {
		t.Fatalf("after rm: %q", out)
	}
}

// session update's summary shows every part of the policy an update can
// change: allow, deny, on-deny and name-check (and lab peers where there are any), in
// text and in --json (the session, whose policy has deny and on_deny).
func TestEndToEndUpdateSummary(t *testing.T) {
	_, c, _ := startAPI(t)
	c.expect(t, 0, "session", "create", "u1", "--network-only", "--allow", "a.test")
	out, _ := c.expect(t, 0, "session", "update", "u1", "--allow", "b.test:443")
	if out != "updated u1: policy generation 2, egress allowlist, allow a.test,b.test:443, deny -, on-deny reject, name-check tls, quic refuse\n" {
		t.Errorf("update --allow: %q", out)
	}
	out, _ = c.expect(t, 0, "session", "update", "u1", "--deny", "bad.test", "--deny", "198.51.100.0/24", "--on-deny", "reject")
	if out != "updated u1: policy generation 3, egress allowlist, allow a.test,b.test:443, deny bad.test,198.51.100.0/24, on-deny reject, name-check tls, quic refuse\n" {
		t.Errorf("update --deny --on-deny: %q", out)
	}
	out, _ = c.expect(t, 0, "session", "update", "u1", "--revoke-deny", "bad.test", "--json")
	var got struct {
		Policy struct {
			Deny   []string `json:"deny"`
			OnDeny string   `json:"on_deny"`
		} `json:"policy"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || !reflect.DeepEqual(got.Policy.Deny, []string{"198.51.100.0/24"}) || got.Policy.OnDeny != "reject" {
		t.Errorf("update --revoke-deny --json: %v\n%s", err, out)
	}
}

// session exec --detach --json prints the exec as exec-status does, and
// exec-status accepts --json (its only format).
func TestEndToEndExecJSON(t *testing.T) {
	f, c, _ := startAPI(t)
	c.expect(t, 0, "session", "create", "box", "--rootfs", "/r")
	f.ExecFn = func(context.Context, string, api.ExecRequest, io.Writer, io.Writer) (int, error) { return 0, nil }
	out, _ := c.expect(t, 0, "session", "exec", "box", "--detach", "--json", "--", "true")
	var started api.ExecInfo
	if err := json.Unmarshal([]byte(out), &started); err != nil || started.ID == "" || started.Session != "box" || !reflect.DeepEqual(started.Args, []string{"true"}) {
		t.Fatalf("exec --detach --json: %v\n%s", err, out)
	}
	out, _ = c.expect(t, 0, "session", "exec-status", "box", started.ID, "--json")
	var status api.ExecInfo
	if err := json.Unmarshal([]byte(out), &status); err != nil || status.ID != started.ID {
		t.Fatalf("exec-status --json: %v\n%s", err, out)
	}
	if plain, _ := c.expect(t, 0, "session", "exec-status", "box", started.ID); !json.Valid([]byte(plain)) {
		t.Fatalf("exec-status: %q", plain)
	}
}

func TestEndToEndExec(t *testing.T) {
	f, c, _ := startAPI(t)
	c.expect(t, 0, "session", "create", "box", "--rootfs", "/r")
	c.expect(t, 0, "session", "create", "net", "--network-only")

	f.ExecFn = func(_ context.Context, _ string, req api.ExecRequest, o, e io.Writer) (int, error) {
		fmt.Fprintf(o, "args=%q env=%q dir=%s user=%s stdin=%q\n", req.Args, req.Env, req.Dir, req.User, req.Stdin)
		io.WriteString(e, "warning\n")
		o.Write([]byte{0xff, '\n'})
		return 3, nil
	}
	c.Stdin = strings.NewReader("input")
	if code := c.run("session", "exec", "box", "--env", "A=1", "--workdir", "/tmp", "--user", "nobody", "--stdin",
		"--timeout", "5s", "--", "sh", "-c", "echo --json"); code != 3 {
		t.Fatalf("exit %d, stderr %q", code, c.errOut.String())
	}
	if got := c.out.String(); got != "args=[\"sh\" \"-c\" \"echo --json\"] env=[\"A=1\"] dir=/tmp user=nobody stdin=\"input\"\n\xff\n" {
		t.Fatalf("stdout %q", got)
	}
	if got := c.errOut.String(); got != "warning\n" {
		t.Fatalf("stderr %q", got)
	}
	if f.Execs()[0].Timeout != "5s" {
		t.Fatalf("exec request %+v", f.Execs()[0])
	}

	// Without "--": the command starts at the first non-flag after NAME.
	f.ExecFn = nil
	if out, _ := c.expect(t, 0, "session", "exec", "box", "ls", "-la"); out != "ran ls -la\n" {
		t.Fatalf("no --: %q", out)
	}

	// Timeout: 124 and one line.
	f.ExecFn = func(_ context.Context, _ string, _ api.ExecRequest, o, _ io.Writer) (int, error) {
		io.WriteString(o, "partial\n")
		return 124, fmt.Errorf("exec in box: %w after 1s", api.ErrExecTimeout)
	}
	out, errOut := c.expect(t, api.ExitTimeout, "session", "exec", "box", "--timeout", "1s", "--", "sleep", "9")
	if out != "partial\n" || errOut != "enforcerd session exec: exec in box: command timed out after 1s\n" {
		t.Fatalf("timeout: %q %q", out, errOut)
	}

	// enforcerd failures: 125 with one line.
	_, errOut = c.expect(t, api.ExitEnforcerd, "session", "exec", "nope", "--", "id")
	if errOut != "enforcerd session exec: session \"nope\": unknown session\n" {
		t.Fatalf("unknown: %q", errOut)
	}
	_, errOut = c.expect(t, api.ExitEnforcerd, "session", "exec", "net", "--", "id")
	if errOut != "enforcerd session exec: session \"net\" was created with --network-only: session has no sandbox\n" {
		t.Fatalf("network-only: %q", errOut)
	}
	f.ExecFn = func(context.Context, string, api.ExecRequest, io.Writer, io.Writer) (int, error) {
		return 125, fmt.Errorf("exec in box: start: permission denied")
	}
	_, errOut = c.expect(t, api.ExitEnforcerd, "session", "exec", "box", "--", "id")
	if errOut != "enforcerd session exec: exec in box: start: permission denied\n" {
		t.Fatalf("failure: %q", errOut)
	}
	// Binary stdin reaches the engine byte for byte (a JSON string would
	// turn the invalid UTF-8 into U+FFFD).
	var all []byte
	for b := range 256 {
		all = append(all, byte(b))
	}
	all = append(all, 0xc3, 0x28, 0xed, 0xa0, 0x80)
	f.ExecFn = func(_ context.Context, _ string, req api.ExecRequest, _, _ io.Writer) (int, error) {
		if !bytes.Equal(req.Stdin, all) {
			return 1, fmt.Errorf("stdin: got %q", req.Stdin)
		}
		return 0, nil
	}
	c.Stdin = bytes.NewReader(all)
	c.expect(t, 0, "session", "exec", "box", "--stdin", "--", "cat")
	c.Stdin = strings.NewReader(strings.Repeat("x", maxExecStdin+1))
	_, errOut = c.expect(t, ExitUsage, "session", "exec", "box", "--stdin", "--", "cat")
	if errOut != fmt.Sprintf("enforcerd session exec: --stdin: input larger than %d bytes\n", maxExecStdin) {
		t.Fatalf("big stdin: %q", errOut)
	}
}

func TestEndToEndEventsFollow(t *testing.T) {
	f, c, _ := startAPI(t)
	c.expect(t, 0, "session", "create", "s1", "--network-only")
	done := make(chan int, 1)
	var out strings.Builder
	pr, pw := io.Pipe()
	c.Stdout = pw
	copied := make(chan struct{})
	go func() {
		io.Copy(&out, pr)
		close(copied)
	}()
	go func() { done <- c.Run([]string{"session", "events", "s1", "--follow"}) }()
	time.Sleep(200 * time.Millisecond)
	f.Record(api.Event{Session: "s1", Kind: "dns", Action: "allowed"})
	time.Sleep(100 * time.Millisecond)
	f.Delete(context.Background(), "s1") // closes the follow stream
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d: %s", code, c.errOut.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("events --follow did not end with the session")
	}
	pw.Close()
	<-copied
	if got := out.String(); strings.Count(got, "\n") != 2 || !strings.Contains(got, `"action":"allowed"`) {
		t.Fatalf("followed:\n%s", got)
	}
}

// TestEndToEndNoDaemon: a missing daemon is exit 1 (125 for exec), one line.
func TestEndToEndNoDaemon(t *testing.T) {
	c := newTestCLI(t)
	sock := filepath.Join(t.TempDir(), "none.sock")
	c.env["ENFORCERD_SOCKET"] = sock
	_, errOut := c.expect(t, 1, "session", "ls")
	want := "enforcerd session ls: cannot reach enforcerd at " + sock + ": dial unix " + sock +
		": connect: no such file or directory (is the daemon running? set --socket or ENFORCERD_SOCKET)\n"
	if errOut != want {
		t.Fatalf("stderr\n got %q\nwant %q", errOut, want)
	}
	c.expect(t, api.ExitEnforcerd, "session", "exec", "s1", "--", "id")
	_, errOut = c.expect(t, 1, "session", "rm", "a", "b")
	if !strings.HasPrefix(errOut, "enforcerd session rm: cannot reach enforcerd") {
		t.Fatalf("rm: %q", errOut)
	}
}

// TestEndToEndErrorCodes: a refusal prints its one line on stderr as
// always; with --json stdout also gets {"error": LINE, "code": CODE}, the
// API's code, so a script can tell a stale generation from a locked
// session or a taken name. Without --json stdout stays empty.
func TestEndToEndErrorCodes(t *testing.T) {
	f, c, _ := startAPI(t)
	f.Create(context.Background(), api.CreateRequest{Name: "s1", NetworkOnly: true})
	f.Create(context.Background(), api.CreateRequest{Name: "locked-1", NetworkOnly: true})
	for _, tc := range []struct {
		code string
		args []string
	}{
		{api.CodeStaleGeneration, []string{"session", "update", "s1", "--generation", "7", "--allow", "a.test"}},
		{api.CodeLocked, []string{"session", "update", "locked-1", "--allow", "a.test"}},
		{api.CodeNameTaken, []string{"session", "create", "s1", "--network-only"}},
		{api.CodeNotFound, []string{"session", "inspect", "nope"}},
		{api.CodeBadRequest, []string{"session", "create", "bad-1", "--network-only"}},
	} {
		out, errOut := c.expect(t, 1, tc.args...)
		if out != "" || !strings.HasPrefix(errOut, "enforcerd session ") {
			t.Errorf("%v: stdout %q stderr %q, want one line on stderr only", tc.args, out, errOut)
		}
		out, errOut2 := c.expect(t, 1, append(tc.args, "--json")...)
		var body api.ErrorBody
		if err := json.Unmarshal([]byte(out), &body); err != nil || strings.Count(out, "\n") != 1 {
			t.Errorf("%v --json: stdout %q: %v", tc.args, out, err)
			continue
		}
		if body.Code != tc.code || body.Error+"\n" != errOut2 || errOut2 != errOut {
			t.Errorf("%v --json: %+v (stderr %q), want code %s and the line of stderr", tc.args, body, errOut2, tc.code)
		}
	}
}
