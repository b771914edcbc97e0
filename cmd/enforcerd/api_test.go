package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeEngine is an in-memory Engine. Names steer failures: a create of
// "bad-*" is a bad request, "full-*" exhausts the pool, "boom-*" fails
// internally. execFn, when set, replaces the default exec.
type fakeEngine struct {
	mu       sync.Mutex
	sessions map[string]SessionInfo
	creates  []CreateRequest
	execs    []ExecRequest
	events   *EventLog
	execFn   func(ctx context.Context, name string, req ExecRequest, stdout, stderr io.Writer) (int, error)
	healthy  error
}

func newFakeEngine() *fakeEngine {
	return &fakeEngine{sessions: map[string]SessionInfo{}, events: NewEventLog(100)}
}

func (f *fakeEngine) Create(ctx context.Context, req CreateRequest) (SessionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creates = append(f.creates, req)
	switch {
	case strings.HasPrefix(req.Name, "bad-"):
		return SessionInfo{}, fmt.Errorf("allow entry %q: not a name, wildcard or CIDR: %w", "x y", ErrBadRequest)
	case strings.HasPrefix(req.Name, "full-"):
		return SessionInfo{}, fmt.Errorf("%w: no free /30 in 10.20.0.0/16", ErrPoolExhausted)
	case strings.HasPrefix(req.Name, "boom-"):
		return SessionInfo{}, errors.New("add veth enfboomh: file exists")
	}
	if _, ok := f.sessions[req.Name]; ok {
		return SessionInfo{}, fmt.Errorf("session %q already exists: %w", req.Name, ErrNameTaken)
	}
	labels := req.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	info := SessionInfo{
		Name: req.Name, Netns: "enf-" + req.Name, GuestIP: "10.20.0.2", GatewayIP: "10.20.0.1",
		HostVeth: "enf" + req.Name + "h", Egress: "allowlist", Policy: PolicyView{Allow: req.Allow},
		Sandbox: !req.NetworkOnly, Rootfs: req.Rootfs, Attested: []AttestedAddr{}, Labels: labels,
		Created: time.Date(2025, 1, 2, 3, 0, 0, 0, time.UTC),
	}
	f.sessions[req.Name] = info
	f.events.Record(Event{Session: req.Name, Kind: EventKindLifecycle, Action: "created"})
	return info, nil
}

func (f *fakeEngine) Delete(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sessions[name]; !ok {
		return fmt.Errorf("session %q: %w", name, ErrNotFound)
	}
	delete(f.sessions, name)
	f.events.Close(name)
	return nil
}

func (f *fakeEngine) DeleteByLabel(ctx context.Context, key, value string) ([]string, error) {
	var names []string
	for _, s := range f.List(key, value) {
		names = append(names, s.Name)
	}
	for _, n := range names {
		f.Delete(ctx, n)
	}
	return names, nil
}

func (f *fakeEngine) List(key, value string) []SessionInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []SessionInfo
	for _, s := range f.sessions {
		if v, ok := s.Labels[key]; key == "" || (ok && v == value) {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (f *fakeEngine) Inspect(name string) (SessionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sessions[name]
	if !ok {
		return s, fmt.Errorf("session %q: %w", name, ErrNotFound)
	}
	return s, nil
}

func (f *fakeEngine) Exec(ctx context.Context, name string, req ExecRequest, stdout, stderr io.Writer) (int, error) {
	f.mu.Lock()
	s, ok := f.sessions[name]
	f.execs = append(f.execs, req)
	fn := f.execFn
	f.mu.Unlock()
	if !ok {
		return 125, fmt.Errorf("session %q: %w", name, ErrNotFound)
	}
	if !s.Sandbox {
		return 125, fmt.Errorf("session %q was created with --network-only: %w", name, ErrNoSandbox)
	}
	if fn != nil {
		return fn(ctx, name, req, stdout, stderr)
	}
	fmt.Fprintf(stdout, "ran %s\n", strings.Join(req.Args, " "))
	return 0, nil
}

func (f *fakeEngine) Events(ctx context.Context, name string, follow bool) ([]Event, <-chan Event, error) {
	if _, err := f.Inspect(name); err != nil {
		return nil, nil, err
	}
	return f.events.Read(ctx, name, follow)
}

func (f *fakeEngine) Healthy() error { return f.healthy }

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

func errorJSON(msg string) string {
	b, _ := json.Marshal(errorBody{Error: msg})
	return string(b) + "\n"
}

func TestAPIStatusCodes(t *testing.T) {
	f := newFakeEngine()
	h := newAPIHandler(f, nil, nil)
	if code, body, _ := apiDo(t, h, "POST", "/v1/sessions", `{"name":"taken","network_only":true}`); code != 201 {
		t.Fatalf("seed create: %d %s", code, body)
	}
	f.sessions["noboxes"] = SessionInfo{Name: "noboxes", Sandbox: false}
	big := `{"name":"x","allow":["` + strings.Repeat("a", maxRequestBody) + `"]}`
	cases := []struct {
		method, path, body string
		status             int
		want               string // whole body; "" = only the status is checked
	}{
		{"POST", "/v1/sessions", `{"name":"bad-1","network_only":true}`, 400, errorJSON(`allow entry "x y": not a name, wildcard or CIDR: bad request`)},
		{"POST", "/v1/sessions", `{"name":"taken","network_only":true}`, 409, errorJSON(`session "taken" already exists: session name taken`)},
		{"POST", "/v1/sessions", `{"name":"full-1","network_only":true}`, 503, errorJSON(`address pool exhausted: no free /30 in 10.20.0.0/16`)},
		{"POST", "/v1/sessions", `{"name":"boom-1","network_only":true}`, 500, errorJSON(`add veth enfboomh: file exists`)},
		{"POST", "/v1/sessions", `{"name":"x",`, 400, errorJSON(`malformed JSON: unexpected EOF`)},
		{"POST", "/v1/sessions", `{"name":"x"}}`, 400, errorJSON(`malformed JSON: trailing data after the JSON object`)},
		{"POST", "/v1/sessions", `{"name":"x"} {"name":"y"}`, 400, errorJSON(`malformed JSON: trailing data after the JSON object`)},
		{"POST", "/v1/sessions", `not json`, 400, errorJSON(`malformed JSON: invalid character 'o' in literal null (expecting 'u')`)},
		{"POST", "/v1/sessions", ``, 400, errorJSON(`empty request body: want a JSON object`)},
		{"POST", "/v1/sessions", `[1]`, 400, errorJSON(`request body: want a JSON object, got JSON array`)},
		{"POST", "/v1/sessions", `{"name":"x","bogus":1}`, 400, errorJSON(`unknown field "bogus"`)},
		{"POST", "/v1/sessions", `{"name":"x","pids":"many"}`, 400, errorJSON(`field "pids": want an integer, got JSON string`)},
		{"POST", "/v1/sessions", big, 413, errorJSON(`request body larger than 1048576 bytes`)},
		{"GET", "/v1/sessions/nope", "", 404, errorJSON(`session "nope": unknown session`)},
		{"DELETE", "/v1/sessions/nope", "", 404, errorJSON(`session "nope": unknown session`)},
		{"GET", "/v1/sessions/nope/events", "", 404, errorJSON(`session "nope": unknown session`)},
		{"GET", "/v1/sessions/taken/events?follow=maybe", "", 400, errorJSON(`follow "maybe": want 1 or 0`)},
		{"POST", "/v1/sessions/nope/exec", `{"args":["id"]}`, 404, errorJSON(`session "nope": unknown session`)},
		{"POST", "/v1/sessions/noboxes/exec", `{"args":["id"]}`, 409, errorJSON(`session "noboxes" was created with --network-only: session has no sandbox`)},
		{"POST", "/v1/sessions/taken/exec", `{"args":[]}`, 400, errorJSON(`args: want the command and its arguments, e.g. ["sh", "-c", "id"]`)},
		{"POST", "/v1/sessions/taken/exec", `{"args":["id"],"timeout":"soon"}`, 400, errorJSON(`timeout "soon": want a positive duration such as 30s`)},
		{"POST", "/v1/sessions/taken/exec", `{"args":["id"],"tty":true}`, 400, errorJSON(`unknown field "tty"`)},
		{"GET", "/v1/sessions?label=novalue", "", 400, errorJSON(`label "novalue": want KEY=VALUE with a non-empty KEY`)},
		{"GET", "/v1/sessions?label=a=1&label=b=2", "", 400, errorJSON(`label: give one KEY=VALUE filter`)},
		{"DELETE", "/v1/sessions", "", 400, errorJSON(`label: deleting sessions in bulk needs ?label=KEY=VALUE`)},
		{"PUT", "/v1/sessions", "", 405, errorJSON(`method PUT not allowed on /v1/sessions (allowed: GET, POST, DELETE)`)},
		{"POST", "/v1/sessions/taken", "", 405, errorJSON(`method POST not allowed on /v1/sessions/taken (allowed: GET, DELETE)`)},
		{"GET", "/v1/sessions/taken/exec", "", 405, errorJSON(`method GET not allowed on /v1/sessions/taken/exec (allowed: POST)`)},
		{"POST", "/v1/healthz", "", 405, ""},
		{"GET", "/v2/sessions", "", 404, errorJSON(`no route GET /v2/sessions`)},
		{"GET", "/v1/sessions/taken/bogus", "", 404, errorJSON(`no route GET /v1/sessions/taken/bogus`)},
		{"GET", "/v1/healthz", "", 200, `{"status":"ok"}` + "\n"},
		{"GET", "/v1/version", "", 200, `{"api":"v1","version":"` + version + `"}` + "\n"},
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
	f.healthy = errors.New("nftables table missing")
	if code, body, _ := apiDo(t, h, "GET", "/v1/healthz", ""); code != 503 || body != errorJSON("unhealthy: nftables table missing") {
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
	f := newFakeEngine()
	h := newAPIHandler(f, nil, NewMetrics())
	req := CreateRequest{Name: "s1", Rootfs: "/r", Allow: []string{"a.test"}, Labels: map[string]string{"run": "7"}}
	body, _ := json.Marshal(req)
	code, out, _ := apiDo(t, h, "POST", "/v1/sessions", string(body))
	if code != 201 {
		t.Fatalf("create: %d %s", code, out)
	}
	var info SessionInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.Name != "s1" || !info.Sandbox {
		t.Fatalf("create answer %s (%v)", out, err)
	}
	if !reflect.DeepEqual(f.creates[0], req) {
		t.Fatalf("engine got %+v", f.creates[0])
	}
	apiDo(t, h, "POST", "/v1/sessions", `{"name":"s2","network_only":true,"labels":{"run":"8"}}`)

	var list []SessionInfo
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
func readExecFrames(t *testing.T, r io.Reader) []execFrame {
	t.Helper()
	var out []execFrame
	dec := json.NewDecoder(r)
	for {
		var f execFrame
		if err := dec.Decode(&f); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatalf("frame: %v", err)
		}
		out = append(out, f)
	}
}

func intPtr(i int) *int { return &i }

func TestAPIExecFrames(t *testing.T) {
	f := newFakeEngine()
	f.sessions["s1"] = SessionInfo{Name: "s1", Sandbox: true}
	srv := httptest.NewServer(newAPIHandler(f, nil, nil))
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
		fn   func(ctx context.Context, name string, req ExecRequest, stdout, stderr io.Writer) (int, error)
		want []execFrame
	}{
		{"output and exit", func(_ context.Context, _ string, _ ExecRequest, o, e io.Writer) (int, error) {
			io.WriteString(o, "hello\n")
			io.WriteString(e, "oops\n")
			o.Write(nil) // empty writes make no frame
			return 3, nil
		}, []execFrame{{Stream: "stdout", Data: "hello\n"}, {Stream: "stderr", Data: "oops\n"}, {Exit: intPtr(3)}}},
		{"binary", func(_ context.Context, _ string, _ ExecRequest, o, _ io.Writer) (int, error) {
			o.Write([]byte{0xff, 0x00, 'a'})
			return 0, nil
		}, []execFrame{{Stream: "stdout", DataB64: "/wBh"}, {Exit: intPtr(0)}}},
		{"timeout", func(_ context.Context, _ string, _ ExecRequest, o, _ io.Writer) (int, error) {
			io.WriteString(o, "partial")
			return 124, fmt.Errorf("exec in s1: %w after 1s", ErrExecTimeout)
		}, []execFrame{{Stream: "stdout", Data: "partial"}, {Error: "exec in s1: command timed out after 1s", Exit: intPtr(124)}}},
		{"timeout without output", func(context.Context, string, ExecRequest, io.Writer, io.Writer) (int, error) {
			return 124, fmt.Errorf("exec in s1: %w after 1s", ErrExecTimeout)
		}, []execFrame{{Error: "exec in s1: command timed out after 1s", Exit: intPtr(124)}}},
		{"failure after output", func(_ context.Context, _ string, _ ExecRequest, o, _ io.Writer) (int, error) {
			io.WriteString(o, "x")
			return 125, errors.New("exec in s1: wait: no child")
		}, []execFrame{{Stream: "stdout", Data: "x"}, {Error: "exec in s1: wait: no child", Exit: intPtr(125)}}},
		{"internal failure before output", func(context.Context, string, ExecRequest, io.Writer, io.Writer) (int, error) {
			return 125, errors.New("exec in s1: start: no such file")
		}, []execFrame{{Error: "exec in s1: start: no such file", Exit: intPtr(125)}}},
		// A command that never started carries its own status (not 125:
		// enforcerd did not fail), and the line says why.
		{"command not found", func(context.Context, string, ExecRequest, io.Writer, io.Writer) (int, error) {
			return 127, classify(errors.New(`exec "nosuch" in s1: command not found: executable file not found in $PATH`), ErrNotStarted)
		}, []execFrame{{Error: `exec "nosuch" in s1: command not found: executable file not found in $PATH`, Exit: intPtr(127)}}},
		{"command cannot be run", func(context.Context, string, ExecRequest, io.Writer, io.Writer) (int, error) {
			return 126, classify(errors.New(`exec "sh" in s1: pids limit reached (8 processes): procReady not received`), ErrNotStarted)
		}, []execFrame{{Error: `exec "sh" in s1: pids limit reached (8 processes): procReady not received`, Exit: intPtr(126)}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.execFn = tc.fn
			resp := post(`{"args":["sh","-c","x"],"env":["A=1"],"dir":"/tmp","user":"1000","stdin_b64":"aW4=","timeout":"1s"}`)
			defer resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
				t.Fatalf("status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			got := readExecFrames(t, resp.Body)
			if !reflect.DeepEqual(got, tc.want) {
				gj, _ := json.Marshal(got)
				wj, _ := json.Marshal(tc.want)
				t.Fatalf("frames\n got %s\nwant %s", gj, wj)
			}
		})
	}
	want := ExecRequest{Args: []string{"sh", "-c", "x"}, Env: []string{"A=1"}, Dir: "/tmp", User: "1000", Stdin: []byte("in"), Timeout: "1s"}
	if !reflect.DeepEqual(f.execs[0], want) {
		t.Fatalf("engine got %+v", f.execs[0])
	}
}

// TestAPIExecStdinContract: stdin travels as base64 (stdin_b64); the old
// JSON-string field and bad base64 are refused with one line naming them.
func TestAPIExecStdinContract(t *testing.T) {
	f := newFakeEngine()
	f.sessions["s1"] = SessionInfo{Name: "s1", Sandbox: true}
	h := newAPIHandler(f, nil, nil)
	for _, tc := range []struct{ body, want string }{
		{`{"args":["cat"],"stdin":"in"}`, `{"error":"unknown field \"stdin\""}`},
		{`{"args":["cat"],"stdin_b64":"not base64!"}`, `{"error":"field \"stdin_b64\": want standard padded base64, got illegal base64 data at input byte 3"}`},
		{`{"args":["cat"],"stdin_b64":7}`, `{"error":"field \"stdin_b64\": want a base64 string, got JSON number"}`},
	} {
		code, out, _ := apiDo(t, h, "POST", "/v1/sessions/s1/exec", tc.body)
		if code != 400 || out != tc.want+"\n" {
			t.Errorf("%s: %d %s, want 400 %s", tc.body, code, out, tc.want)
		}
	}
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	body, _ := json.Marshal(ExecRequest{Args: []string{"cat"}, Stdin: all})
	if !strings.Contains(string(body), `"stdin_b64":"AAECAwQF`) {
		t.Fatalf("request body %s: want stdin_b64 in standard base64", body)
	}
	if code, out, _ := apiDo(t, h, "POST", "/v1/sessions/s1/exec", string(body)); code != 200 || !bytes.Equal(f.execs[len(f.execs)-1].Stdin, all) {
		t.Fatalf("binary stdin: %d %s, engine got %q", code, out, f.execs[len(f.execs)-1].Stdin)
	}
}

// TestAPIExecStreams: a frame reaches the client while the command runs.
func TestAPIExecStreams(t *testing.T) {
	f := newFakeEngine()
	f.sessions["s1"] = SessionInfo{Name: "s1", Sandbox: true}
	release := make(chan struct{})
	f.execFn = func(ctx context.Context, _ string, _ ExecRequest, o, _ io.Writer) (int, error) {
		io.WriteString(o, "first\n")
		select {
		case <-release:
		case <-ctx.Done():
			return 125, ctx.Err()
		}
		io.WriteString(o, "second\n")
		return 0, nil
	}
	srv := httptest.NewServer(newAPIHandler(f, nil, nil))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/sessions/s1/exec", "application/json", strings.NewReader(`{"args":["x"]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != `{"stream":"stdout","data":"first\n"}`+"\n" {
		t.Fatalf("first frame %q, %v", line, err)
	}
	close(release)
	rest := readExecFrames(t, br)
	if len(rest) != 2 || rest[0].Data != "second\n" || rest[1].Exit == nil || *rest[1].Exit != 0 {
		t.Fatalf("rest %+v", rest)
	}
}

func TestAPIEvents(t *testing.T) {
	f := newFakeEngine()
	h := newAPIHandler(f, nil, nil)
	apiDo(t, h, "POST", "/v1/sessions", `{"name":"s1","network_only":true}`)
	f.events.Record(Event{Time: time.Unix(10, 0).UTC(), Session: "s1", Kind: "dns", Action: "allowed", Detail: map[string]any{"name": "a.test"}})
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
	f.events.Record(Event{Session: "s1", Kind: "dns", Action: "denied"})
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, `"action":"denied"`) {
		t.Fatalf("followed %q %v", line, err)
	}
	f.Delete(context.Background(), "s1")
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		t.Fatalf("after delete: %q %v", rest, err)
	}
}

func TestStatusOf(t *testing.T) {
	cases := map[error]int{
		fmt.Errorf("x: %w", ErrBadRequest):          400,
		fmt.Errorf("x: %w", ErrNotFound):            404,
		fmt.Errorf("x: %w", ErrNameTaken):           409,
		fmt.Errorf("x: %w", ErrNoSandbox):           409,
		fmt.Errorf("x: %w", ErrPoolExhausted):       503,
		errors.Join(errors.New("a"), ErrBadRequest): 400,
		errors.New("other"):                         500,
	}
	for err, want := range cases {
		if got := statusOf(err); got != want {
			t.Errorf("statusOf(%v) = %d, want %d", err, got, want)
		}
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
