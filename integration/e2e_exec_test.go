package integration

// `enforcerd session exec` end to end: exit status, streams, timeout,
// environment, working directory, user, stdin, and the refusals.

import (
	"bufio"
	"context"
	"strings"
	"testing"
	"time"
)

func TestE2EExecStatusAndStreams(t *testing.T) {
	e := newE2E(t)
	e.create("box")
	e.createNetOnly("bare", "--egress", "public")

	for _, tc := range []struct {
		args           []string
		stdout, stderr string
		code           int
	}{
		{[]string{"sh", "-c", "exit 7"}, "", "", 7},
		{[]string{"true"}, "", "", 0},
		{[]string{"false"}, "", "", 1},
		{[]string{"sh", "-c", "echo out; echo err >&2; exit 3"}, "out\n", "err\n", 3},
		{[]string{"printf", `\377\000\001x`}, "\xff\x00\x01x", "", 0}, // bytes that are not UTF-8 survive
		{[]string{"sh", "-c", "kill -KILL $$"}, "", "", 137},          // killed by a signal: 128 + 9
	} {
		out, errOut, code := e.run(append([]string{"session", "exec", "box", "--"}, tc.args...)...)
		if code != tc.code || out != tc.stdout || errOut != tc.stderr {
			t.Errorf("exec %q: exit %d stdout %q stderr %q, want exit %d stdout %q stderr %q",
				tc.args, code, out, errOut, tc.code, tc.stdout, tc.stderr)
		}
	}

	// --env, --workdir, --user.
	if out := e.cli("session", "exec", "box", "--env", "FOO=bar baz", "--env", "EMPTY=", "--", "sh", "-c", `echo "$FOO|$EMPTY|${UNSET-unset}"`); out != "bar baz||unset\n" {
		t.Errorf("exec --env: %q", out)
	}
	if out := e.cli("session", "exec", "box", "--workdir", "/tmp", "--", "pwd"); out != "/tmp\n" {
		t.Errorf("exec --workdir /tmp: pwd %q", out)
	}
	if out := e.cli("session", "exec", "box", "--user", "65534", "--", "id", "-u"); out != "65534\n" {
		t.Errorf("exec --user 65534: id -u %q", out)
	}

	// --stdin sends this program's standard input to the command.
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	cmd := e.d.Command(ctx, "session", "exec", "box", "--stdin", "--", "sh", "-c", "wc -l; echo done")
	cmd.Stdin = strings.NewReader("one\ntwo\nthree\n")
	if out, err := cmd.Output(); err != nil || strings.Fields(string(out))[0] != "3" || !strings.HasSuffix(string(out), "done\n") {
		t.Errorf("exec --stdin: %q %v", out, err)
	}

	// Refusals: one line, exit 125 (enforcerd did not run the command).
	msg := e.expectFail(125, "session", "exec", "bare", "--", "true")
	if !strings.Contains(msg, "--network-only") || !strings.Contains(msg, e.d.Prefix+"-bare") {
		t.Errorf("exec in a --network-only session: %q, want it to say --network-only and name the netns", msg)
	}
	if msg := e.expectFail(125, "session", "exec", "nosuch", "--", "true"); !strings.Contains(msg, `"nosuch"`) || !strings.Contains(msg, "unknown session") {
		t.Errorf("exec in an unknown session: %q", msg)
	}
	// A working directory the sandbox lacks: the command cannot be run
	// (126, as container runtimes say it), and the line names it.
	if msg := e.expectFail(126, "session", "exec", "box", "--workdir", "/nonexistent", "--", "true"); !strings.Contains(msg, `"/nonexistent"`) || !strings.Contains(msg, "no such file or directory") {
		t.Errorf("exec --workdir /nonexistent: %q, want it named with the reason", msg)
	}
	// A command that does not exist: 125 (or a shell's 127), one line naming it.
	if out, errOut, code := e.run("session", "exec", "box", "--", "/nonexistent/cmd"); (code != 125 && code != 127) || out != "" || !strings.Contains(errOut, "/nonexistent/cmd") {
		t.Errorf("exec of a missing command: exit %d stdout %q stderr %q, want 125 or 127 and one line naming it", code, out, errOut)
	} else {
		e2eOneLine(t, "exec of a missing command", errOut)
	}
	// The caller's mistakes are not the daemon's errors: nothing above is
	// logged at ERROR (journalctl -p err stays quiet).
	for _, line := range strings.Split(e.d.Log(), "\n") {
		if strings.Contains(line, "level=ERROR") {
			t.Errorf("a refused exec was logged at ERROR: %s", line)
		}
	}
	// The sandbox is still usable after all that.
	if out := e.cli("session", "exec", "box", "--", "echo", "still here"); out != "still here\n" {
		t.Errorf("exec after the refusals: %q", out)
	}
	e.expectConsistent("after execs")
}

// Output is streamed as it is produced, not collected until the end.
func TestE2EExecStreaming(t *testing.T) {
	e := newE2E(t)
	e.create("box")
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	cmd := e.d.Command(ctx, "session", "exec", "box", "--", "sh", "-c", "echo first; sleep 2; echo second")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	type line struct {
		text string
		at   time.Time
	}
	lines := make(chan line)
	go func() {
		r := bufio.NewReader(stdout)
		for {
			s, err := r.ReadString('\n')
			if s != "" {
				lines <- line{s, time.Now()}
			}
			if err != nil {
				close(lines)
				return
			}
		}
	}()
	var got []line
	for l := range lines {
		got = append(got, l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exec: %v", err)
	}
	if len(got) != 2 || got[0].text != "first\n" || got[1].text != "second\n" {
		t.Fatalf("exec output %v, want first and second", got)
	}
	// "first" reached the CLI's stdout while the command still ran.
	if gap := got[1].at.Sub(got[0].at); gap < 1500*time.Millisecond {
		t.Errorf("first line arrived only %v before the second (the command sleeps 2s between them): output is not streamed", gap)
	}
}

// --timeout kills the command's whole process group and exits 124.
func TestE2EExecTimeout(t *testing.T) {
	e := newE2E(t)
	e.create("box")
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	cmd := e.d.Command(ctx, "session", "exec", "box", "--timeout", "2s", "--", "sh", "-c", "sleep 4242 & sleep 4243; echo never")
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Both processes run (the control: the check below sees them).
	deadline := time.Now().Add(5 * time.Second)
	for len(e2eProcesses("sleep", "4242")) == 0 || len(e2eProcesses("sleep", "4243")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the command's processes never appeared")
		}
		time.Sleep(20 * time.Millisecond)
	}
	err := cmd.Wait()
	took := time.Since(start)
	if code := cmd.ProcessState.ExitCode(); code != 124 {
		t.Fatalf("exec --timeout 2s: exit %d (%v), want 124\nstdout %q\nstderr %q", code, err, out.String(), errOut.String())
	}
	if took < 2*time.Second || took > 10*time.Second {
		t.Errorf("exec --timeout 2s ended after %v", took)
	}
	e2eOneLine(t, "exec --timeout", errOut.String())
	if !strings.Contains(errOut.String(), "timed out") || strings.Contains(out.String(), "never") {
		t.Errorf("exec --timeout: stdout %q stderr %q", out.String(), errOut.String())
	}
	deadline = time.Now().Add(3 * time.Second)
	for {
		left := append(e2eProcesses("sleep", "4242"), e2eProcesses("sleep", "4243")...)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of the timed-out command still run: %v", left)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The session is unharmed.
	if got := e.mustSh("box", "echo ok"); got != "ok\n" {
		t.Errorf("exec after the timeout: %q", got)
	}
}
