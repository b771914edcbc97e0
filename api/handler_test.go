package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/api/apitest"
)

// do sends one request to h and returns status, body and headers.
func apiDo(t *testing.T, h http.Handler, method, path, body string) (int, string, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	return rr.Code, rr.Body.String(), rr.Header()
}

func errorJSON(code, msg string) string {
	b, _ := json.Marshal(api.ErrorBody{Error: msg, Code: code})
	return string(b) + "\n"
}

func TestAPIStatusCodes(t *testing.T) {
	f := apitest.New()
	h := api.NewHandler(f, api.HandlerOptions{Version: "9.9.9"})
	if code, body, _ := apiDo(t, h, "POST", "/v1/sessions", `{"name":"taken","network_only":true}`); code != 201 {
		t.Fatalf("seed create: %d %s", code, body)
	}
	f.Create(context.Background(), api.CreateRequest{Name: "noboxes", NetworkOnly: true})
	big := `{"name":"x","allow":["` + strings.Repeat("a", 1<<20) + `"]}`
	cases := []struct {
		method, path, body string
		status             int
		want               string // whole body; "" = only the status is checked
	}{
		{"POST", "/v1/sessions", `{"name":"bad-1","network_only":true}`, 400, errorJSON("bad_request", `allow entry "x y": not a name, wildcard or CIDR: bad request`)},
		{"POST", "/v1/sessions", `{"name":"taken","network_only":true}`, 409, errorJSON("name_taken", `session "taken" already exists: session name taken`)},
		{"POST", "/v1/sessions", `{"name":"full-1","network_only":true}`, 503, errorJSON("pool_exhausted", `address pool exhausted: no free /30 in 10.20.0.0/16`)},
		{"POST", "/v1/sessions", `{"name":"boom-1","network_only":true}`, 500, errorJSON("internal", `add veth enfboomh: file exists`)},
		{"POST", "/v1/sessions", `{"name":"x",`, 400, errorJSON("bad_request", `malformed JSON: unexpected EOF`)},
		{"POST", "/v1/sessions", `{"name":"x"}}`, 400, errorJSON("bad_request", `malformed JSON: trailing data after the JSON object`)},
		{"POST", "/v1/sessions", `{"name":"x"} {"name":"y"}`, 400, errorJSON("bad_request", `malformed JSON: trailing data after the JSON object`)},
		{"POST", "/v1/sessions", `not json`, 400, errorJSON("bad_request", `malformed JSON: invalid character 'o' in literal null (expecting 'u')`)},
		{"POST", "/v1/sessions", ``, 400, errorJSON("bad_request", `empty request body: want a JSON object`)},
		{"POST", "/v1/sessions", `[1]`, 400, errorJSON("bad_request", `request body: want a JSON object, got JSON array`)},
		{"POST", "/v1/sessions", `{"name":"x","bogus":1}`, 400, errorJSON("bad_request", `unknown field "bogus"`)},
		{"POST", "/v1/sessions", `{"name":"x","pids":"many"}`, 400, errorJSON("bad_request", `field "pids": want an integer, got JSON string`)},
		{"POST", "/v1/sessions", big, 413, errorJSON("too_large", `request body larger than 1048576 bytes`)},
		{"GET", "/v1/sessions/nope", "", 404, errorJSON("not_found", `session "nope": unknown session`)},
		{"DELETE", "/v1/sessions/nope", "", 404, errorJSON("not_found", `session "nope": unknown session`)},
		{"GET", "/v1/sessions/nope/events", "", 404, errorJSON("not_found", `session "nope": unknown session`)},
		{"GET", "/v1/sessions/taken/events?follow=maybe", "", 400, errorJSON("bad_request", `follow "maybe": want 1 or 0`)},
		{"POST", "/v1/sessions/nope/exec", `{"args":["id"]}`, 404, errorJSON("not_found", `session "nope": unknown session`)},
		{"POST", "/v1/sessions/noboxes/exec", `{"args":["id"]}`, 409, errorJSON("no_sandbox", `session "noboxes" was created with --network-only: session has no sandbox`)},
		{"POST", "/v1/sessions/taken/exec", `{"args":[]}`, 400, errorJSON("bad_request", `args: want the command and its arguments, e.g. ["sh", "-c", "id"]`)},
		{"POST", "/v1/sessions/taken/exec", `{"args":["id"],"timeout":"soon"}`, 400, errorJSON("bad_request", `timeout "soon": want a positive duration such as 30s`)},
		{"POST", "/v1/sessions/taken/exec", `{"args":["id"],"tty":true}`, 400, errorJSON("bad_request", `unknown field "tty"`)},
		{"GET", "/v1/sessions?label=novalue", "", 400, errorJSON("bad_request", `label "novalue": want KEY=VALUE with a non-empty KEY`)},
		{"GET", "/v1/sessions?label=a=1&label=b=2", "", 400, errorJSON("bad_request", `label: want one KEY=VALUE filter`)},
		{"DELETE", "/v1/sessions", "", 400, errorJSON("bad_request", `label: deleting sessions in bulk needs ?label=KEY=VALUE`)},
		{"PUT", "/v1/sessions", "", 405, errorJSON("no_route", `method PUT not allowed on /v1/sessions (allowed: GET, POST, DELETE)`)},
		{"POST", "/v1/sessions/taken", "", 405, errorJSON("no_route", `method POST not allowed on /v1/sessions/taken (allowed: GET, DELETE)`)},
		{"GET", "/v1/sessions/taken/exec", "", 405, errorJSON("no_route", `method GET not allowed on /v1/sessions/taken/exec (allowed: POST)`)},
		{"POST", "/v1/healthz", "", 405, ""},
		{"GET", "/v2/sessions", "", 404, errorJSON("no_route", `no route GET /v2/sessions`)},
		{"GET", "/v1/sessions/taken/bogus", "", 404, errorJSON("no_route", `no route GET /v1/sessions/taken/bogus`)},
		{"GET", "/v1/healthz", "", 200, `{"status":"ok"}` + "\n"},
		{"GET", "/v1/version", "", 200, `{"version":"9.9.9","go":"` + runtime.Version() + `","api":"v1"}` + "\n"},
		{"GET", "/v1/sessions/taken", "", 200, ""},
		{"HEAD", "/v1/sessions/taken", "", 200, ""},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path+" "+shorten(tc.body, 40), func(t *testing.T) {
			code, body, hdr := apiDo(t, h, tc.method, tc.path, tc.body)
			if code != tc.status {
				t.Errorf("status %d, want %d (%s)", code, tc.status, shorten(body, 200))
			}
			if tc.want != "" && body != tc.want {
				t.Errorf("body\n got %q\nwant %q", body, tc.want)
			}
			if code >= 400 && hdr.Get("Content-Type") != "application/json" {
				t.Errorf("content type %q", hdr.Get("Content-Type"))
			}
			if code == 405 && hdr.Get("Allow") == "" {
				t.Errorf("405 without Allow")
			}
		})
	}
	f.Unhealthy = errors.New("nftables table missing")
	if code, body, _ := apiDo(t, h, "GET", "/v1/healthz", ""); code != 503 || body != errorJSON("unavailable", "unhealthy: nftables table missing") {
		t.Fatalf("unhealthy: %d %s", code, body)
	}
}

func shorten(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func TestAPICreateListDelete(t *testing.T) {
	f := apitest.New()
	h := api.NewHandler(f, api.HandlerOptions{})
	req := api.CreateRequest{Name: "s1", Rootfs: "/r", Allow: []string{"a.test"}, Labels: map[string]string{"run": "7"}}
	body, _ := json.Marshal(req)
	code, out, _ := apiDo(t, h, "POST", "/v1/sessions", string(body))
	if code != 201 {
		t.Fatalf("create: %d %s", code, out)
	}
	var info api.SessionInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.Name != "s1" || !info.Sandbox {
		t.Fatalf("create answer %s (%v)", out, err)
	}
	if !reflect.DeepEqual(f.Creates()[0], req) {
		t.Fatalf("engine got %+v", f.Creates()[0])
	}
	apiDo(t, h, "POST", "/v1/sessions", `{"name":"s2","network_only":true,"labels":{"run":"8"}}`)

	var list []api.SessionInfo
	_, out, _ = apiDo(t, h, "GET", "/v1/sessions", "")
	json.Unmarshal([]byte(out), &list)
	if len(list) != 2 {
		t.Fatalf("list %s", out)
	}
	_, out, _ = apiDo(t, h, "GET", "/v1/sessions?label=run%3D8", "")
	if list = nil; json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].Name != "s2" {
		t.Fatalf("list by label %s", out)
	}
	if _, out, _ = apiDo(t, h, "GET", "/v1/sessions?label=run=9", ""); out != "[]\n" {
		t.Fatalf("empty list %q", out)
	}
	if code, out, _ = apiDo(t, h, "DELETE", "/v1/sessions?label=run=8", ""); code != 200 || out != `{"deleted":["s2"]}`+"\n" {
		t.Fatalf("delete by label: %d %s", code, out)
	}
	if code, out, _ = apiDo(t, h, "DELETE", "/v1/sessions?label=run=8", ""); code != 200 || out != `{"deleted":[]}`+"\n" {
		t.Fatalf("delete by label again: %d %s", code, out)
	}
	if code, out, _ = apiDo(t, h, "DELETE", "/v1/sessions/s1", ""); code != 200 || out != `{"deleted":["s1"]}`+"\n" {
		t.Fatalf("delete: %d %s", code, out)
	}
}

// readFrames decodes an exec response's NDJSON frames.
func readExecFrames(t *testing.T, r io.Reader) []api.ExecFrame {
	t.Helper()
	var out []api.ExecFrame
	dec := json.NewDecoder(r)
	for {
		var f api.ExecFrame
		if err := dec.Decode(&f); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatalf("frame: %v", err)
		}
		out = append(out, f)
	}
}

func intPtr(i int) *int { return &i }

// outputFrames checks that an exec stream starts with its exec_id frame
// and that the offsets grow, and returns the rest without the offsets.
func outputFrames(t *testing.T, frames []api.ExecFrame) []api.ExecFrame {
	t.Helper()
	if len(frames) == 0 || frames[0].ExecID == "" || frames[0].Stream != "" {
		t.Fatalf("first frame %+v: want the exec_id alone", frames)
	}
	var last int64
	out := frames[1:]
	for i := range out {
		if out[i].Stream != "" {
			if out[i].Offset <= last {
				t.Fatalf("frame %d: offset %d after %d", i, out[i].Offset, last)
			}
			last, out[i].Offset = out[i].Offset, 0
		}
	}
	return out
}

func TestAPIExecFrames(t *testing.T) {
	f := apitest.New()
	f.Create(context.Background(), api.CreateRequest{Name: "s1", Rootfs: "/r"})
	srv := httptest.NewServer(api.NewHandler(f, api.HandlerOptions{}))
	defer srv.Close()
	post := func(body string) *http.Response {
		resp, err := http.Post(srv.URL+"/v1/sessions/s1/exec", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	cases := []struct {
		name string
		fn   func(ctx context.Context, name string, req api.ExecRequest, stdout, stderr io.Writer) (int, error)
		want []api.ExecFrame
	}{
		{"output and exit", func(_ context.Context, _ string, _ api.ExecRequest, o, e io.Writer) (int, error) {
			io.WriteString(o, "hello\n")
			io.WriteString(e, "oops\n")
			o.Write(nil) // empty writes make no frame
			return 3, nil
		}, []api.ExecFrame{{Stream: "stdout", Data: "hello\n"}, {Stream: "stderr", Data: "oops\n"}, {Exit: intPtr(3)}}},
		{"binary", func(_ context.Context, _ string, _ api.ExecRequest, o, _ io.Writer) (int, error) {
			o.Write([]byte{0xff, 0x00, 'a'})
			return 0, nil
		}, []api.ExecFrame{{Stream: "stdout", DataB64: "/wBh"}, {Exit: intPtr(0)}}},
		{"timeout", func(_ context.Context, _ string, _ api.ExecRequest, o, _ io.Writer) (int, error) {
			io.WriteString(o, "partial")
			return 124, fmt.Errorf("exec in s1: %w after 1s", api.ErrExecTimeout)
		}, []api.ExecFrame{{Stream: "stdout", Data: "partial"}, {Error: "exec in s1: command timed out after 1s", Exit: intPtr(124)}}},
		{"timeout without output", func(context.Context, string, api.ExecRequest, io.Writer, io.Writer) (int, error) {
			return 124, fmt.Errorf("exec in s1: %w after 1s", api.ErrExecTimeout)
		}, []api.ExecFrame{{Error: "exec in s1: command timed out after 1s", Exit: intPtr(124)}}},
		{"failure after output", func(_ context.Context, _ string, _ api.ExecRequest, o, _ io.Writer) (int, error) {
			io.WriteString(o, "x")
			return 125, errors.New("exec in s1: wait: no child")
		}, []api.ExecFrame{{Stream: "stdout", Data: "x"}, {Error: "exec in s1: wait: no child", Exit: intPtr(125)}}},
		{"internal failure before output", func(context.Context, string, api.ExecRequest, io.Writer, io.Writer) (int, error) {
			return 125, errors.New("exec in s1: start: no such file")
		}, []api.ExecFrame{{Error: "exec in s1: start: no such file", Exit: intPtr(125)}}},
		// A command that never started carries its own status (not 125:
		// enforcerd did not fail), and the line says why.
		{"command not found", func(context.Context, string, api.ExecRequest, io.Writer, io.Writer) (int, error) {
			return 127, api.Classify(errors.New(`exec "nosuch" in s1: command not found: executable file not found in $PATH`), api.ErrNotStarted)
		}, []api.ExecFrame{{Error: `exec "nosuch" in s1: command not found: executable file not found in $PATH`, Exit: intPtr(127)}}},
		{"command cannot be run", func(context.Context, string, api.ExecRequest, io.Writer, io.Writer) (int, error) {
			return 126, api.Classify(errors.New(`exec "sh" in s1: pids limit reached (8 processes): procReady not received`), api.ErrNotStarted)
		}, []api.ExecFrame{{Error: `exec "sh" in s1: pids limit reached (8 processes): procReady not received`, Exit: intPtr(126)}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.ExecFn = tc.fn
			resp := post(`{"args":["sh","-c","x"],"env":["A=1"],"dir":"/tmp","user":"1000","stdin_b64":"aW4=","timeout":"1s"}`)
			defer resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
				t.Fatalf("status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			got := outputFrames(t, readExecFrames(t, resp.Body))
			if !reflect.DeepEqual(got, tc.want) {
				gj, _ := json.Marshal(got)
				wj, _ := json.Marshal(tc.want)
				t.Fatalf("frames\n got %s\nwant %s", gj, wj)
			}
		})
	}
	want := api.ExecRequest{Args: []string{"sh", "-c", "x"}, Env: []string{"A=1"}, Dir: "/tmp", User: "1000", Stdin: []byte("in"), Timeout: "1s"}
	if !reflect.DeepEqual(f.Execs()[0], want) {
		t.Fatalf("engine got %+v", f.Execs()[0])
	}
}

// TestAPIExecStdinContract: stdin travels as base64 (stdin_b64); the old
// JSON-string field and bad base64 are refused with one line naming them.
func TestAPIExecStdinContract(t *testing.T) {
	f := apitest.New()
	f.Create(context.Background(), api.CreateRequest{Name: "s1", Rootfs: "/r"})
	h := api.NewHandler(f, api.HandlerOptions{})
	for _, tc := range []struct{ body, want string }{
		{`{"args":["cat"],"stdin":"in"}`, `{"error":"unknown field \"stdin\""}`},
		{`{"args":["cat"],"stdin_b64":"not base64!"}`, `{"error":"field \"stdin_b64\": want standard padded base64, got illegal base64 data at input byte 3"}`},
		{`{"args":["cat"],"stdin_b64":7}`, `{"error":"field \"stdin_b64\": want a base64 string, got JSON number"}`},
	} {
		tc.want = strings.TrimSuffix(tc.want, "}") + `,"code":"bad_request"}`
		code, out, _ := apiDo(t, h, "POST", "/v1/sessions/s1/exec", tc.body)
		if code != 400 || out != tc.want+"\n" {
			t.Errorf("%s: %d %s, want 400 %s", tc.body, code, out, tc.want)
		}
	}
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	body, _ := json.Marshal(api.ExecRequest{Args: []string{"cat"}, Stdin: all})
	if !strings.Contains(string(body), `"stdin_b64":"AAECAwQF`) {
		t.Fatalf("request body %s: want stdin_b64 in standard base64", body)
	}
	if code, out, _ := apiDo(t, h, "POST", "/v1/sessions/s1/exec", string(body)); code != 200 || !bytes.Equal(f.Execs()[len(f.Execs())-1].Stdin, all) {
		t.Fatalf("binary stdin: %d %s, engine got %q", code, out, f.Execs()[len(f.Execs())-1].Stdin)
	}
}

// TestAPIExecStreams: a frame reaches the client while the command runs.
func TestAPIExecStreams(t *testing.T) {
	f := apitest.New()
	f.Create(context.Background(), api.CreateRequest{Name: "s1", Rootfs: "/r"})
	release := make(chan struct{})
	f.ExecFn = func(ctx context.Context, _ string, _ api.ExecRequest, o, _ io.Writer) (int, error) {
		io.WriteString(o, "first\n")
		select {
		case <-release:
		case <-ctx.Done():
			return 125, ctx.Err()
		}
		io.WriteString(o, "second\n")
		return 0, nil
	}
	srv := httptest.NewServer(api.NewHandler(f, api.HandlerOptions{}))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/sessions/s1/exec", "application/json", strings.NewReader(`{"args":["x"]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, `{"exec_id":"`) {
		t.Fatalf("id frame %q, %v", line, err)
	}
	line, err := br.ReadString('\n')
	if err != nil || line != `{"stream":"stdout","data":"first\n","offset":1}`+"\n" {
		t.Fatalf("first frame %q, %v", line, err)
	}
	close(release)
	rest := readExecFrames(t, br)
	if len(rest) != 2 || rest[0].Data != "second\n" || rest[1].Exit == nil || *rest[1].Exit != 0 {
		t.Fatalf("rest %+v", rest)
	}
}

func TestAPIEvents(t *testing.T) {
	f := apitest.New()
	h := api.NewHandler(f, api.HandlerOptions{})
	apiDo(t, h, "POST", "/v1/sessions", `{"name":"s1","network_only":true}`)
	f.Record(api.Event{Time: time.Unix(10, 0).UTC(), Session: "s1", Kind: "dns", Action: "allowed", Detail: map[string]any{"name": "a.test"}})
	code, body, hdr := apiDo(t, h, "GET", "/v1/sessions/s1/events", "")
	if code != 200 || hdr.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %s", code, hdr.Get("Content-Type"))
	}
	lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"action":"created"`) ||
		lines[1] != `{"time":"1970-01-01T00:00:10Z","session":"s1","kind":"dns","action":"allowed","detail":{"name":"a.test"}}` {
		t.Fatalf("events:\n%s", body)
	}

	// follow: recorded events, then new ones as they come, until the
	// session goes.
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/sessions/s1/events?follow=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 2; i++ {
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	f.Record(api.Event{Session: "s1", Kind: "dns", Action: "denied"})
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, `"action":"denied"`) {
		t.Fatalf("followed %q %v", line, err)
	}
	f.Delete(context.Background(), "s1")
	if rest, err := io.ReadAll(br); err != nil || !strings.HasPrefix(string(rest), "{") ||
		!strings.HasSuffix(string(rest), `"session":"s1","kind":"end","action":"removed"}`+"\n") {
		t.Fatalf("after delete: %q %v, want the end marker alone", rest, err)
	}
}

func TestAPIEventsSinceAndAll(t *testing.T) {
	f := apitest.New()
	h := api.NewHandler(f, api.HandlerOptions{})
	apiDo(t, h, "POST", "/v1/sessions", `{"name":"s1","network_only":true,"labels":{"run":"1"}}`)
	apiDo(t, h, "POST", "/v1/sessions", `{"name":"s2","network_only":true}`)
	f.Record(api.Event{Time: time.Unix(10, 0).UTC(), Session: "s1", Kind: "dns", Action: "old"})
	f.Record(api.Event{Time: time.Unix(20, 0).UTC(), Session: "s1", Kind: "dns", Action: "new"})
	f.Record(api.Event{Time: time.Unix(15, 0).UTC(), Session: "s2", Kind: "dns", Action: "other"})
	actions := func(path string) string {
		t.Helper()
		code, body, _ := apiDo(t, h, "GET", path, "")
		if code != 200 {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		var out []string
		for _, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
			var ev api.Event
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("GET %s: %q: %v", path, line, err)
			}
			if ev.Kind == "dns" { // the created events are of now
				out = append(out, ev.Session+":"+ev.Action)
			}
		}
		return strings.Join(out, " ")
	}
	if got := actions("/v1/sessions/s1/events?since=1970-01-01T00:00:15Z"); got != "s1:new" {
		t.Errorf("since: %s", got)
	}
	if got := actions("/v1/events?since=1970-01-01T00:00:12Z"); got != "s2:other s1:new" {
		t.Errorf("all since: %s", got)
	}
	if got := actions("/v1/events?label=run=1&since=1970-01-01T00:00:01Z"); got != "s1:old s1:new" {
		t.Errorf("all with label: %s", got)
	}
	for path, want := range map[string]string{
		"/v1/events?since=yesterday":         `since "yesterday": want an RFC 3339 time such as 2025-01-02T03:04:05Z`,
		"/v1/sessions/s1/events?since=12:00": `since "12:00": want an RFC 3339 time such as 2025-01-02T03:04:05Z`,
		"/v1/events?label=novalue":           `label "novalue": want KEY=VALUE`,
		"/v1/events?follow=2":                `follow "2": want 1 or 0`,
	} {
		code, body, _ := apiDo(t, h, "GET", path, "")
		var eb api.ErrorBody
		if err := json.Unmarshal([]byte(body), &eb); err != nil || code != 400 || !strings.HasPrefix(eb.Error, want) {
			t.Errorf("GET %s: %d %s, want 400 %q", path, code, body, want)
		}
	}
}

func TestStatusOf(t *testing.T) {
	cases := map[error]int{
		fmt.Errorf("x: %w", api.ErrBadRequest):          400,
		fmt.Errorf("x: %w", api.ErrNotFound):            404,
		fmt.Errorf("x: %w", api.ErrNameTaken):           409,
		fmt.Errorf("x: %w", api.ErrNoSandbox):           409,
		fmt.Errorf("x: %w", api.ErrPoolExhausted):       503,
		fmt.Errorf("x: %w", api.ErrStaleGeneration):     409,
		fmt.Errorf("x: %w", api.ErrLocked):              409,
		fmt.Errorf("x: %w", api.ErrBusy):                409,
		errors.Join(errors.New("a"), api.ErrBadRequest): 400,
		errors.New("other"):                             500,
	}
	for err, want := range cases {
		if got := api.StatusOf(err); got != want {
			t.Errorf("api.StatusOf(%v) = %d, want %d", err, got, want)
		}
	}
}

// TestAPIErrorCodes: an engine error wrapping each sentinel is answered
// with the sentinel's status and code and the error's own one line;
// an error without a sentinel is 500 "internal".
func TestAPIErrorCodes(t *testing.T) {
	errs := map[string]error{"plain": errors.New("add veth enfxh: file exists")}
	for _, c := range codeCases {
		errs[strings.ReplaceAll(c.code, "_", "-")] = fmt.Errorf("session %s: %w", c.code, c.sentinel)
	}
	h := api.NewHandler(failingEngine{apitest.New(), errs}, api.HandlerOptions{})
	for _, c := range codeCases {
		code, body, _ := apiDo(t, h, "GET", "/v1/sessions/"+strings.ReplaceAll(c.code, "_", "-"), "")
		if want := errorJSON(c.code, fmt.Sprintf("session %s: %v", c.code, c.sentinel)); code != c.status || body != want {
			t.Errorf("%s: %d %s, want %d %s", c.code, code, body, c.status, want)
		}
		if got := api.CodeOf(errs[strings.ReplaceAll(c.code, "_", "-")]); got != c.code {
			t.Errorf("api.CodeOf(%v) = %q, want %q", c.sentinel, got, c.code)
		}
	}
	if code, body, _ := apiDo(t, h, "GET", "/v1/sessions/plain", ""); code != 500 || body != errorJSON("internal", "add veth enfxh: file exists") {
		t.Errorf("an error without a sentinel: %d %s", code, body)
	}
	if api.CodeOf(nil) != "" {
		t.Errorf("api.CodeOf(nil) = %q, want \"\"", api.CodeOf(nil))
	}
}
