package integration

// What a session holds is visible: inspect shows the
// sandbox's limits with their defaults, its capabilities, its root and its
// resolver; --network-only refuses what only a sandbox has, in the CLI and
// the API; and `session exec` of a command that never started exits as
// container runtimes do (127 not found, 126 cannot be run), saying when the
// pids limit is why.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// e2eHeld is what inspect says a session holds.
type e2eHeld struct {
	DNS         string   `json:"dns"`
	MemoryBytes *int64   `json:"memory_bytes"`
	Pids        *int64   `json:"pids"`
	CPUs        *float64 `json:"cpus"`
	NetRaw      *bool    `json:"net_raw"`
	Writable    *bool    `json:"writable"`
}

func (e *e2eEnv) held(name string) (e2eHeld, string) {
	e.t.Helper()
	out := e.cli("session", "inspect", name)
	var h e2eHeld
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		e.t.Fatalf("session inspect %s: %v\n%s", name, err, out)
	}
	return h, out
}

func TestE2EInspectShowsWhatASessionHolds(t *testing.T) {
	e := newE2E(t)
	dns := e2eAnycastDNS.Addr().String()
	e.create("plain", "--allow", "api.e2e.test")
	e.create("sized", "--allow", "api.e2e.test", "--memory", "256M", "--pids", "64", "--cpus", "0.5", "--net-raw", "--writable")
	e.createNetOnly("bare", "--egress", "public")
	e.createNetOnly("sealed")

	h, out := e.held("plain")
	if h.DNS != dns || h.MemoryBytes == nil || *h.MemoryBytes != 512<<20 || h.Pids == nil || *h.Pids != 1024 ||
		h.CPUs == nil || *h.CPUs != 1 || h.NetRaw == nil || *h.NetRaw || h.Writable == nil || *h.Writable {
		t.Errorf("inspect of a sandbox with the defaults: want dns %s, memory_bytes 536870912, pids 1024, cpus 1, net_raw false, writable false:\n%s", dns, out)
	}
	h, out = e.held("sized")
	if h.DNS != dns || h.MemoryBytes == nil || *h.MemoryBytes != 256<<20 || h.Pids == nil || *h.Pids != 64 ||
		h.CPUs == nil || *h.CPUs != 0.5 || h.NetRaw == nil || !*h.NetRaw || h.Writable == nil || !*h.Writable {
		t.Errorf("inspect of a sandbox with its limits given: want dns %s, memory_bytes 268435456, pids 64, cpus 0.5, net_raw true, writable true:\n%s", dns, out)
	}
	// create --json says the same as inspect.
	var created e2eHeld
	if err := json.Unmarshal([]byte(e.cli("session", "create", "again", "--rootfs", e.rootfs, "--pids", "99", "--json")), &created); err != nil ||
		created.Pids == nil || *created.Pids != 99 || created.MemoryBytes == nil || *created.MemoryBytes != 512<<20 || created.DNS != "" {
		t.Errorf("create --json: %+v %v, want pids 99, the default memory and no dns (egress none)", created, err)
	}
	h, out = e.held("bare")
	if h.DNS != dns || h.MemoryBytes != nil || h.Pids != nil || h.CPUs != nil || h.NetRaw != nil || h.Writable != nil {
		t.Errorf("inspect of a --network-only session: want dns %s and no sandbox fields:\n%s", dns, out)
	}
	if h, out = e.held("sealed"); h.DNS != "" {
		t.Errorf("inspect of a session without a NIC: want no dns:\n%s", out)
	}

	// --network-only refuses what only a sandbox has: one line naming it.
	for _, flags := range [][]string{{"--memory", "1G"}, {"--pids", "10"}, {"--cpus", "0.5"}, {"--net-raw"}, {"--writable"}} {
		msg := e.expectFail(2, append([]string{"session", "create", "x", "--network-only"}, flags...)...)
		if want := "enforcerd session create: " + flags[0] + " has no effect with --network-only: there is no sandbox; leave it out"; msg != want {
			t.Errorf("--network-only %s: %q, want %q", strings.Join(flags, " "), msg, want)
		}
	}
	// And the daemon refuses the same from an API caller: 400, the field named.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for field, req := range map[string]api.CreateRequest{
		"memory_bytes": {MemoryBytes: 1 << 30},
		"pids":         {Pids: 10},
		"cpus":         {CPUs: 0.5},
		"net_raw":      {NetRaw: true},
		"writable":     {Writable: true},
	} {
		req.Name, req.NetworkOnly = "x", true
		_, err := e.d.Client().Create(ctx, req)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || !errors.Is(err, api.ErrBadRequest) ||
			!strings.Contains(ae.Message, field+" (--") || !strings.Contains(ae.Message, "no effect with network_only") {
			t.Errorf("create network_only with %s: %v, want 400 naming the field", field, err)
		}
	}
	if names := e2eNames(e.list()); strings.Join(names, " ") != "again bare plain sealed sized" {
		t.Errorf("sessions after the refusals: %v", names)
	}
	e.expectConsistent("after the refusals")
}

func TestE2EExecNotStarted(t *testing.T) {
	e := newE2E(t)
	e.create("box")
	e.mustSh("box", "printf 'garbage\\n' > /tmp/noexec; chmod -x /tmp/noexec")

	for _, tc := range []struct {
		command string
		code    int
		says    string
	}{
		{"nosuchcmd", 127, "command not found"},
		{"/nonexistent/cmd", 127, "command not found"},
		{"/etc/passwd/x", 127, "command not found"}, // a path through a file
		{"/etc/passwd", 126, "command cannot be run"},
		{"/tmp/noexec", 126, "command cannot be run"},
		{"/tmp", 126, "command cannot be run"},
	} {
		out, errOut, code := e.run("session", "exec", "box", "--", tc.command)
		if code != tc.code || out != "" || !strings.Contains(errOut, `"`+tc.command+`"`) || !strings.Contains(errOut, tc.says) {
			t.Errorf("exec %s: exit %d stdout %q stderr %q, want exit %d and one line naming it and saying %q", tc.command, code, out, errOut, tc.code, tc.says)
			continue
		}
		e2eOneLine(t, "exec "+tc.command, errOut)
	}
	// A working directory that does not exist: the command cannot be run
	// (126, as TestE2EExecStatusAndStreams checks with its message).
	e.expectFail(126, "session", "exec", "box", "--workdir", "/nonexistent", "--", "true")

	// The pids limit: fill it, then a command either cannot start (126)
	// or starts and cannot fork (its own status); either way the last line
	// says the pids limit was why.
	e.create("small", "--pids", "8")
	e.sh("small", "for i in 1 2 3 4 5 6 7 8 9 10; do sleep 300 & done; wait") // fills the cgroup; its fork fails
	var last string
	for i := 0; i < 20; i++ {
		out, errOut, code := e.run("session", "exec", "small", "--", "sh", "-c", "sleep 1 & wait")
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		said := strings.Contains(lines[len(lines)-1], "pids limit reached")
		if code == 126 && said && out == "" {
			e2eOneLine(t, "exec at the pids limit", errOut)
			last = ""
			break
		}
		if code != 0 && code != 126 && said && strings.Contains(errOut, "can't fork") {
			last = "" // it started, its fork failed, and the line says why
			break
		}
		last = errOut
		t.Logf("exec at the pids limit, attempt %d: exit %d stderr %q", i+1, code, errOut)
	}
	if last != "" {
		t.Errorf("exec at the pids limit: last stderr %q, want a last line saying pids limit reached", last)
	}
	// Below the limit again, the sandbox works.
	e.cli("session", "rm", "small")
	if out := e.cli("session", "exec", "box", "--", "echo", "ok"); out != "ok\n" {
		t.Errorf("exec after: %q", out)
	}
}
