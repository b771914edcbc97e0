package integration

// Bad input through the CLI and the raw API: each gets its exact one-line
// error and status, and leaves nothing behind.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

func TestE2EBadInputCLI(t *testing.T) {
	// A small pool (three session slots; the last /30 is the DNS
	// address's) so that exhausting it is cheap.
	e := newE2E(t, "--pool", "10.20.0.0/28")
	e.createNetOnly("taken", "--allow", "api.e2e.test")
	e.createNetOnly("lab", "--lab")
	before := e.expectConsistent("before the bad inputs")
	long := strings.Repeat("a", 33)
	const nameWant = "want 1 to 32 characters of a-z, 0-9 and '-', starting with a letter or digit"

	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		// Malformed command lines: exit 2.
		{[]string{}, 2, "enforcerd: missing command (run 'enforcerd help')"},
		{[]string{"bogus"}, 2, `enforcerd: unknown command "bogus" (run 'enforcerd help')`},
		{[]string{"session"}, 2, "enforcerd session: missing subcommand (create, fork, exec, exec-status, logs, ls, inspect, update, rm, events, why or report)"},
		{[]string{"session", "frobnicate"}, 2, `enforcerd session: unknown subcommand "frobnicate" (create, fork, exec, exec-status, logs, ls, inspect, update, rm, events, why or report)`},
		{[]string{"session", "create"}, 2, "enforcerd session create: missing session NAME"},
		{[]string{"session", "create", "x"}, 2, "enforcerd session create: missing --image IMAGE, --rootfs DIR, --network-only or --vm"},
		{[]string{"session", "create", "x", "y", "--network-only"}, 2, `enforcerd session create: unexpected argument "y" after NAME "x"`},
		{[]string{"session", "create", "x", "--network-only", "--rootfs", "/r"}, 2, `enforcerd session create: --rootfs "/r" and --network-only exclude each other`},
		{[]string{"session", "create", "x", "--network-only", "--bogus"}, 2, "enforcerd session create: unknown flag: --bogus"},
		{[]string{"session", "create", "x", "--network-only", "--allow"}, 2, "enforcerd session create: flag needs an argument: --allow"},
		{[]string{"session", "create", "x", "--network-only", "--egress", "open"}, 2, `enforcerd session create: invalid value "open" for flag --egress: want none, allowlist, public`},
		{[]string{"session", "create", "x", "--network-only", "--memory", "lots"}, 2, `enforcerd session create: invalid value "lots" for flag --memory: want a size such as 512M, 2G or 1048576`},
		{[]string{"session", "create", "x", "--network-only", "--pids", "0"}, 2, `enforcerd session create: invalid value "0" for flag --pids: want at least 4; leave it out for the default 1024`},
		{[]string{"session", "create", "x", "--rootfs", "/r", "--cpus", "0"}, 2, fmt.Sprintf(`enforcerd session create: invalid value "0" for flag --cpus: want 0.01 to %d (the CPUs of this machine); leave it out for the default 1`, runtime.NumCPU())},
		{[]string{"session", "create", "x", "--network-only", "--label", "novalue"}, 2, `enforcerd session create: invalid value "novalue" for flag --label: want KEY=VALUE with a non-empty KEY`},
		{[]string{"session", "create", "x", "--network-only", "--label", "k=1", "--label", "k=2"}, 2, `enforcerd session create: invalid value "k=2" for flag --label: key "k" given twice`},
		{[]string{"session", "rm"}, 2, "enforcerd session rm: missing session NAME or --label KEY=VALUE"},
		{[]string{"session", "rm", "taken", "--label", "a=b"}, 2, `enforcerd session rm: NAME "taken" and --label exclude each other`},
		{[]string{"session", "inspect"}, 2, "enforcerd session inspect: missing session NAME"},
		{[]string{"session", "inspect", "a", "b"}, 2, `enforcerd session inspect: unexpected argument "b" after NAME "a"`},
		{[]string{"session", "ls", "extra"}, 2, `enforcerd session ls: unexpected argument "extra" (filter with --label KEY=VALUE)`},
		{[]string{"session", "ls", "--label", "a=1", "--label", "b=2"}, 2, `enforcerd session ls: invalid value "b=2" for flag --label: given twice; only one KEY=VALUE filter is accepted`},
		{[]string{"session", "exec", "taken"}, 2, `enforcerd session exec: missing command after NAME "taken" (enforcerd session exec NAME -- CMD [ARG]...)`},
		{[]string{"session", "exec", "taken", "--timeout", "-1s", "--", "true"}, 2, `enforcerd session exec: invalid value "-1s" for flag --timeout: want a positive duration such as 30s`},
		{[]string{"session", "exec", "taken", "--timeout", "soon", "--", "true"}, 2, `enforcerd session exec: invalid value "soon" for flag --timeout: want a positive duration such as 30s`},
		{[]string{"session", "exec", "taken", "--env", "=x", "--", "true"}, 2, `enforcerd session exec: invalid value "=x" for flag --env: want KEY=VALUE with a non-empty KEY`},
		{[]string{"version", "extra"}, 2, `enforcerd version: unexpected argument "extra"`},

		// Refusals by the daemon: exit 1.
		{[]string{"session", "create", "Bad_Name", "--network-only"}, 1, `enforcerd session create: invalid session name "Bad_Name": character 'B' not allowed; ` + nameWant},
		{[]string{"session", "create", long, "--network-only"}, 1, `enforcerd session create: invalid session name "` + long + `": 33 characters; ` + nameWant},
		{[]string{"session", "create", "taken", "--network-only"}, 1, `enforcerd session create: session "taken" already exists: session name taken`},
		{[]string{"session", "create", "taken", "--rootfs", e.rootfs}, 1, `enforcerd session create: session "taken" already exists: session name taken`},
		{[]string{"session", "create", "x", "--rootfs", "/nonexistent"}, 1, `enforcerd session create: rootfs "/nonexistent": not inside an image directory (` + strings.Join(append([]string{filepath.Join(e.d.StateDir, "images")}, e.d.ImagesDirs...), ", ") + `); want an image imported (enforcerd image import) or a directory under serve's --images-dir`},
		{[]string{"session", "create", "x", "--rootfs", filepath.Dir(e.rootfs)}, 1, `enforcerd session create: rootfs "` + filepath.Dir(e.rootfs) + `": is the image directory ` + filepath.Dir(e.rootfs) + ` itself; want an image inside it`},
		{[]string{"session", "create", "x", "--network-only", "--allow", "exa mple.com"}, 1, `enforcerd session create: allow entry "exa mple.com": bad character ' ' in label "exa mple"; labels use a-z, 0-9 and '-'`},
		{[]string{"session", "create", "x", "--network-only", "--allow", "https://api.e2e.test/"}, 1, `enforcerd session create: allow entry "https://api.e2e.test/": a URL is not an allow entry; want its host, or list the URL as a scope`},
		{[]string{"session", "create", "x", "--network-only", "--allow", "169.254.169.254"}, 1, `enforcerd session create: allow entry "169.254.169.254": 169.254.169.254 is inside special-purpose range 169.254.0.0/16 (link-local); only public unicast IPv4 is accepted`},
		{[]string{"session", "create", "x", "--network-only", "--allow", "10.20.0.0/24"}, 1, `enforcerd session create: allow entry "10.20.0.0/24": 10.20.0.0/24 is inside special-purpose range 10.0.0.0/8 (private-use); only public unicast IPv4 is accepted`},
		{[]string{"session", "create", "x", "--network-only", "--allow", "api.e2e.test:99999"}, 1, `enforcerd session create: allow entry "api.e2e.test:99999": port 99999 is out of range; want 1 to 65535`},
		{[]string{"session", "create", "x", "--network-only", "--allow", "*.e2e.test/udp"}, 1, `enforcerd session create: allow entry "*.e2e.test/udp": protocol "udp" needs a port, as in HOST:PORT/udp`},
		{[]string{"session", "create", "x", "--network-only", "--allow", "2001:db8::1"}, 1, `enforcerd session create: allow entry "2001:db8::1": IPv6 is not supported`},
		{[]string{"session", "create", "x", "--network-only", "--scope", "https://*.e2e.test/"}, 1, `enforcerd session create: scope "https://*.e2e.test/": a scope names one host; wildcards belong in allow entries`},
		{[]string{"session", "create", "x", "--network-only", "--scope", "https:///path"}, 1, `enforcerd session create: scope "https:///path": no host`},
		{[]string{"session", "create", "x", "--network-only", "--egress", "public", "--pin"}, 1, "enforcerd session create: --pin needs egress allowlist, not public"},
		{[]string{"session", "create", "x", "--network-only", "--allow", "*.e2e.test", "--pin"}, 1, `enforcerd session create: --pin: wildcard "*.e2e.test" cannot be resolved once; name each host`},
		{[]string{"session", "create", "x", "--network-only", "--egress", "none", "--allow", "api.e2e.test"}, 1, "enforcerd session create: egress none takes no allow entries (got 1); use allowlist or public"},
		{[]string{"session", "create", "x", "--network-only", "--egress", "none", "--lab"}, 1, "enforcerd session create: --lab needs a network: a lab target cannot have egress none"},
		{[]string{"session", "create", "x", "--network-only", "--lab-peer", "nosuch"}, 1, `enforcerd session create: lab peer "nosuch": no such session`},
		{[]string{"session", "create", "x", "--network-only", "--lab-peer", "taken"}, 1, `enforcerd session create: lab peer "taken": not a lab target (create it with --lab)`},
		{[]string{"session", "rm", "nosuch"}, 1, `enforcerd session rm: session "nosuch": unknown session`},
		{[]string{"session", "inspect", "nosuch"}, 1, `enforcerd session inspect: session "nosuch": unknown session`},
		{[]string{"session", "events", "nosuch"}, 1, `enforcerd session events: session "nosuch": unknown session`},
	} {
		if msg := e.expectFail(tc.code, tc.args...); msg != tc.msg {
			t.Errorf("enforcerd %s:\n got  %q\n want %q", strings.Join(tc.args, " "), msg, tc.msg)
		}
		e.expectObjects(t, "after enforcerd "+strings.Join(tc.args, " "), e.expected(before))
	}

	// rm of a known and an unknown name: the known one goes, exit 1.
	e.createNetOnly("gone")
	out, errOut, code := e.run("session", "rm", "nosuch", "gone")
	if code != 1 || out != "gone\n" || errOut != "enforcerd session rm: session \"nosuch\": unknown session\n" {
		t.Errorf("rm nosuch gone: exit %d stdout %q stderr %q", code, out, errOut)
	}

	// The pool: three slots, two taken; the third is the last.
	e.createNetOnly("third", "--egress", "public")
	msg := e.expectFail(1, "session", "create", "fourth", "--network-only", "--egress", "public")
	if msg != "enforcerd session create: address pool 10.20.0.0/28 exhausted: all 3 session slots in use" {
		t.Errorf("create in a full pool: %q, want it to say the address pool is exhausted", msg)
	}
	// A session without a NIC needs no slot.
	e.createNetOnly("sealed")
	e.expectConsistent("after the pool filled up")
}

func TestE2EBadInputAPI(t *testing.T) {
	e := newE2E(t, "--pool", "10.20.0.0/28")
	e.createNetOnly("taken", "--allow", "api.e2e.test")
	e.createNetOnly("lab", "--lab")
	e.createNetOnly("third", "--egress", "public")
	before := e.expectConsistent("before the bad requests")

	huge := `{"name":"big","network_only":true,"labels":{"k":"` + strings.Repeat("a", 2<<20) + `"}}`
	for _, tc := range []struct {
		method, path, body string
		status             int
		msg                string // "" = check only the status and the shape
	}{
		{"POST", "/v1/sessions", `{`, 400, "malformed JSON: unexpected EOF"},
		{"POST", "/v1/sessions", `{"name": "x", "network_only": true,}`, 400, "malformed JSON: invalid character '}' looking for beginning of object key string"},
		{"POST", "/v1/sessions", ``, 400, "empty request body: want a JSON object"},
		{"POST", "/v1/sessions", `[]`, 400, ""},
		{"POST", "/v1/sessions", `{"name": 1}`, 400, `field "name": want a string, got JSON number`},
		{"POST", "/v1/sessions", `{"name": "x", "network_only": true, "bogus": 1}`, 400, `unknown field "bogus"`},
		{"POST", "/v1/sessions", `{"name": "x", "network_only": true} {"name": "y"}`, 400, "malformed JSON: trailing data after the JSON object"},
		{"POST", "/v1/sessions", huge, 413, "request body larger than 1048576 bytes"},
		{"POST", "/v1/sessions", `{"name": "-x", "network_only": true}`, 400, `invalid session name "-x": starts with '-'; want 1 to 32 characters of a-z, 0-9 and '-', starting with a letter or digit`},
		{"POST", "/v1/sessions", `{"name": "x"}`, 400, "want exactly one of --rootfs DIR, --image NAME or --network-only"},
		{"POST", "/v1/sessions", `{"name": "x", "rootfs": "relative/dir"}`, 400, `rootfs "relative/dir": want an absolute directory`},
		{"POST", "/v1/sessions", `{"name": "x", "network_only": true, "allow": ["api.e2e.test"], "egress": "open"}`, 400, ""},
		{"POST", "/v1/sessions", `{"name": "x", "network_only": true, "labels": {"a=b": "c"}}`, 400, `label key "a=b": must be non-empty without '=' or ','`},
		{"POST", "/v1/sessions", `{"name": "x", "network_only": true, "allow": ["nov4.e2e.test"], "pin": true}`, 400, "--pin: host nov4.e2e.test has no public IPv4 address; refusing to create the session"},
		{"POST", "/v1/sessions", `{"name": "taken", "network_only": true}`, 409, `session "taken" already exists: session name taken`},
		{"POST", "/v1/sessions", `{"name": "x", "network_only": true, "egress": "public"}`, 503, ""},
		// A limit the container layer refuses is a 400 before any network
		// is built (the pool is full: building one first would give 503).
		{"POST", "/v1/sessions", `{"name": "x", "rootfs": "` + e.rootfs + `", "memory_bytes": 1048576}`, 400, "memory 1048576 bytes: want at least 4 MiB (4194304 bytes); leave it out for the default 512 MiB"},
		{"POST", "/v1/sessions", `{"name": "x", "rootfs": "` + e.rootfs + `", "pids": 2}`, 400, "pids 2: want at least 4; leave it out for the default 1024"},
		{"POST", "/v1/sessions", `{"name": "x", "rootfs": "` + e.rootfs + `", "cpus": 0.001}`, 400, fmt.Sprintf("cpus 0.001: want 0.01 to %d (the CPUs of this machine); leave it out for the default 1", runtime.NumCPU())},
		{"GET", "/v1/sessions/nosuch", ``, 404, `session "nosuch": unknown session`},
		{"DELETE", "/v1/sessions/nosuch", ``, 404, `session "nosuch": unknown session`},
		{"GET", "/v1/sessions/nosuch/events", ``, 404, `session "nosuch": unknown session`},
		{"POST", "/v1/sessions/nosuch/exec", `{"args": ["true"]}`, 404, `session "nosuch": unknown session`},
		{"POST", "/v1/sessions/taken/exec", `{"args": ["true"]}`, 409, ""},
		{"POST", "/v1/sessions/taken/exec", `{"args": []}`, 400, `args: want the command and its arguments, e.g. ["sh", "-c", "id"]`},
		{"POST", "/v1/sessions/taken/exec", `{"args": ["true"], "timeout": "soon"}`, 400, `timeout "soon": want a positive duration such as 30s`},
		{"POST", "/v1/sessions/taken/exec", `{"args": ["true"], "tty": true}`, 400, `unknown field "tty"`},
		{"GET", "/v1/sessions/taken/events?follow=maybe", ``, 400, `follow "maybe": want 1 or 0`},
		{"GET", "/v1/sessions?label=novalue", ``, 400, `label "novalue": want KEY=VALUE with a non-empty KEY`},
		{"DELETE", "/v1/sessions", ``, 400, "label: deleting sessions in bulk needs ?label=KEY=VALUE"},
		{"PUT", "/v1/sessions", `{}`, 405, "method PUT not allowed on /v1/sessions (allowed: GET, POST, DELETE)"},
		{"GET", "/v2/sessions", ``, 404, "no route GET /v2/sessions"},
	} {
		what := tc.method + " " + tc.path + " " + e2eShort(tc.body)
		status, header, body := rawRequest(t, e.d.Socket, tc.method, tc.path, tc.body)
		var eb struct {
			Error string `json:"error"`
			Code  string `json:"code"`
		}
		// The code a program branches on: one per status here, but for
		// 404 (a session, or no route) and 409 (a taken name, no sandbox).
		code := map[int]string{400: api.CodeBadRequest, 404: api.CodeNotFound, 405: api.CodeNoRoute, 409: api.CodeNameTaken, 413: api.CodeTooLarge, 503: api.CodePoolExhausted}[tc.status]
		switch {
		case strings.HasPrefix(tc.path, "/v2/"):
			code = api.CodeNoRoute
		case strings.HasSuffix(tc.path, "/exec") && tc.status == 409:
			code = api.CodeNoSandbox
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		switch {
		case status != tc.status:
			t.Errorf("%s: status %d, want %d (body %s)", what, status, tc.status, body)
		case header.Get("Content-Type") != "application/json":
			t.Errorf("%s: content type %q", what, header.Get("Content-Type"))
		case dec.Decode(&eb) != nil || eb.Error == "" || strings.Contains(eb.Error, "\n") || bytes.Count(body, []byte("\n")) != 1:
			t.Errorf("%s: body %q is not one line of {\"error\": \"...\", \"code\": \"...\"}", what, body)
		case eb.Code != code:
			t.Errorf("%s: code %q, want %q", what, eb.Code, code)
		case tc.msg != "" && eb.Error != tc.msg:
			t.Errorf("%s:\n got  %q\n want %q", what, eb.Error, tc.msg)
		case strings.Contains(eb.Error, "main.") || strings.Contains(eb.Error, "json: "):
			t.Errorf("%s: error %q speaks of the daemon's Go internals, not of the request", what, eb.Error)
		}
		e.expectObjects(t, "after "+what, e.expected(before))
	}

	// Positive controls on the same socket, through the API client: health,
	// a create, an inspect and a delete; a second delete is ErrNotFound.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := e.d.Client()
	if err := c.Healthz(ctx); err != nil {
		t.Errorf("healthz: %v", err)
	}
	if info, err := c.Create(ctx, api.CreateRequest{Name: "raw", NetworkOnly: true}); err != nil || info.Name != "raw" {
		t.Errorf("create raw: %+v, %v", info, err)
	}
	if info, err := c.Inspect(ctx, "raw"); err != nil || info.Name != "raw" {
		t.Errorf("inspect raw: %+v, %v", info, err)
	}
	if err := c.Remove(ctx, "raw"); err != nil {
		t.Errorf("remove raw: %v", err)
	}
	if err := c.Remove(ctx, "raw"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("remove raw again: %v, want api.ErrNotFound", err)
	}
	e.expectObjects(t, "after the raw create and delete", e.expected(before))
}

func e2eShort(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}
