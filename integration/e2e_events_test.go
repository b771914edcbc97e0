package integration

// `session events` (NDJSON of DNS decisions and lifecycle, with --follow)
// and labels (create --label, ls --label, rm --label) end to end.

import (
	"bufio"
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// e2eEvent is one line of `session events`.
type e2eEvent struct {
	Time    time.Time      `json:"time"`
	Session string         `json:"session"`
	Kind    string         `json:"kind"`
	Action  string         `json:"action"`
	Detail  map[string]any `json:"detail"`
}

func (ev e2eEvent) is(kind, action, name string) bool {
	if ev.Kind != kind || ev.Action != action {
		return false
	}
	return name == "" || ev.Detail["name"] == name
}

// e2eParseEvents parses NDJSON strictly: every line one event of session.
func e2eParseEvents(t *testing.T, session, out string) []e2eEvent {
	t.Helper()
	var evs []e2eEvent
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		var ev e2eEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("events: line %q is not JSON: %v", line, err)
		}
		if ev.Session != session || ev.Kind == "" || ev.Time.IsZero() {
			t.Errorf("events: line %q lacks session %q, kind or time", line, session)
		}
		evs = append(evs, ev)
	}
	return evs
}

func e2eHasEvent(evs []e2eEvent, kind, action, name string) bool {
	return slices.ContainsFunc(evs, func(ev e2eEvent) bool { return ev.is(kind, action, name) })
}

func TestE2EEvents(t *testing.T) {
	e := newE2E(t)
	e.create("ev", "--allow", "api.e2e.test")
	if out, code := e.nslookup("ev", "api.e2e.test"); code != 0 {
		t.Fatalf("nslookup api.e2e.test: exit %d\n%s", code, out)
	}
	if out, code := e.nslookup("ev", "other.e2e.test"); code == 0 {
		t.Fatalf("nslookup other.e2e.test succeeded\n%s", out)
	}

	evs := e2eParseEvents(t, "ev", e.cli("session", "events", "ev"))
	if len(evs) == 0 || !evs[0].is("lifecycle", "created", "") {
		t.Errorf("events: first is %+v, want the lifecycle event created", evs)
	}
	if !e2eHasEvent(evs, "dns", "allowed", "api.e2e.test.") {
		t.Errorf("events: no dns allowed decision for api.e2e.test.: %+v", evs)
	}
	for _, ev := range evs {
		if ev.is("dns", "allowed", "api.e2e.test.") && !reflect.DeepEqual(ev.Detail["addrs"], []any{"198.18.1.10"}) {
			t.Errorf("events: allowed api.e2e.test. with addrs %v, want [198.18.1.10]", ev.Detail["addrs"])
		}
	}
	if !e2eHasEvent(evs, "dns", "denied", "other.e2e.test.") {
		t.Errorf("events: no dns denied decision for other.e2e.test.: %+v", evs)
	}
	if !e2eHasEvent(evs, "lifecycle", "exec", "") {
		t.Errorf("events: no lifecycle event for the execs: %+v", evs)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Time.Before(evs[i-1].Time) {
			t.Errorf("events out of order: %v before %v", evs[i-1].Time, evs[i].Time)
		}
	}

	// --follow prints what is recorded, then new decisions as they happen,
	// and ends when the session is removed.
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	cmd := e.d.Command(ctx, "session", "events", "ev", "--follow")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(what string, match func(e2eEvent) bool) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case line, ok := <-lines:
				if !ok {
					t.Fatalf("events --follow ended before %s (stderr %q)", what, stderr.String())
				}
				if ev := e2eParseEvents(t, "ev", line); len(ev) == 1 && match(ev[0]) {
					return
				}
			case <-timeout:
				t.Fatalf("events --follow: no %s within 10s", what)
			}
		}
	}
	next("recorded denied other.e2e.test.", func(ev e2eEvent) bool { return ev.is("dns", "denied", "other.e2e.test.") })
	if rcode, _ := e2eLookup(t, e.nsPath("ev"), "docs.e2e.test"); rcode == 0 {
		t.Errorf("docs.e2e.test was answered")
	}
	next("new denied docs.e2e.test.", func(ev e2eEvent) bool { return ev.is("dns", "denied", "docs.e2e.test.") })
	if rcode, addrs := e2eLookup(t, e.nsPath("ev"), "api.e2e.test"); rcode != 0 || len(addrs) == 0 {
		t.Errorf("api.e2e.test: rcode %d %v", rcode, addrs)
	}
	next("new allowed api.e2e.test.", func(ev e2eEvent) bool { return ev.is("dns", "allowed", "api.e2e.test.") })

	e.cli("session", "rm", "ev")
	next("lifecycle deleted", func(ev e2eEvent) bool { return ev.is("lifecycle", "deleted", "") })
	done := make(chan error, 1)
	go func() {
		for range lines {
		}
		done <- cmd.Wait()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("events --follow after the session was removed: %v (stderr %q)", err, stderr.String())
		}
	case <-time.After(5 * time.Second):
		t.Errorf("events --follow still runs 5s after the session was removed")
		cmd.Process.Kill()
	}
	// Removed: its events stay readable for the daemon's retention; a name
	// never used has none.
	// They end with the counts of its guest-driven events.
	if evs := e2eParseEvents(t, "ev", e.cli("session", "events", "ev")); len(evs) < 2 || !evs[len(evs)-2].is("lifecycle", "deleted", "") ||
		!evs[len(evs)-1].is("summary", "counts", "") || evs[len(evs)-1].Detail["dns_denied"] == nil || evs[len(evs)-1].Detail["dns_allowed"] == nil {
		t.Errorf("events of the removed session: %+v, want them ending with deleted and the counts (denied and allowed)", evs)
	}
	e.expectFail(1, "session", "events", "never")
}

func TestE2ELabels(t *testing.T) {
	e := newE2E(t)
	e.createNetOnly("a", "--label", "run=1", "--label", "team=x")
	e.createNetOnly("b", "--label", "run=1", "--allow", "api.e2e.test")
	e.create("c", "--label", "run=1", "--egress", "public") // with a sandbox
	e.createNetOnly("d", "--label", "run=2")
	e.createNetOnly("f")

	if got := e2eNames(e.list("run=1")); !reflect.DeepEqual(got, []string{"a", "b", "c"}) {
		t.Errorf("ls --label run=1: %v, want [a b c]", got)
	}
	if got := e2eNames(e.list("team=x")); !reflect.DeepEqual(got, []string{"a"}) {
		t.Errorf("ls --label team=x: %v, want [a]", got)
	}
	if got := e2eNames(e.list("run=")); len(got) != 0 {
		t.Errorf("ls --label run= (empty value): %v, want none", got)
	}
	if got := e.cli("session", "ls", "--json", "--label", "nosuch=1"); strings.TrimSpace(got) != "[]" {
		t.Errorf("ls --json --label nosuch=1: %q, want []", got)
	}
	if got := e.inspect("a").Labels; !reflect.DeepEqual(got, map[string]string{"run": "1", "team": "x"}) {
		t.Errorf("inspect a: labels %v", got)
	}
	if got := e.inspect("f").Labels; len(got) != 0 {
		t.Errorf("inspect f: labels %v, want none", got)
	}
	table := e.cli("session", "ls", "--label", "run=2")
	if rows := strings.Split(strings.TrimSpace(table), "\n"); len(rows) != 2 || !strings.HasPrefix(rows[1], "d ") || !strings.Contains(rows[1], "run=2") {
		t.Errorf("ls --label run=2:\n%s", table)
	}

	out := e.cli("session", "rm", "--label", "run=1")
	if got := strings.Fields(out); !reflect.DeepEqual(got, []string{"a", "b", "c"}) {
		t.Errorf("rm --label run=1 printed %q, want a b c", out)
	}
	list := e.expectConsistent("after rm --label run=1")
	if got := e2eNames(list); !reflect.DeepEqual(got, []string{"d", "f"}) {
		t.Errorf("after rm --label run=1: %v, want [d f]", got)
	}
	if out := e.cli("session", "rm", "--label", "run=1"); out != "" {
		t.Errorf("rm --label run=1 again printed %q, want nothing", out)
	}
	if got := e2eNames(e.list()); !reflect.DeepEqual(got, []string{"d", "f"}) {
		t.Errorf("after a second rm --label run=1: %v, want [d f]", got)
	}
}
