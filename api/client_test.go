package api_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/api/apitest"
)

// TestServeAPILifecycle: ready is called once listening; ctx end stops the
// server, ends follow streams and removes the socket.
func TestServeAPILifecycle(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "e.sock")
	f := apitest.New()
	f.Create(context.Background(), api.CreateRequest{Name: "s1", NetworkOnly: true})
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- api.ListenAndServe(ctx, api.ListenConfig{Socket: sock}, api.NewHandler(f, api.HandlerOptions{}), func() { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	cl := api.NewClient(sock)
	if err := cl.Healthz(context.Background()); err != nil {
		t.Fatal(err)
	}
	follow := make(chan error, 1)
	go func() {
		follow <- cl.EventsTo(context.Background(), "s1", api.EventsOptions{Follow: true}, &strings.Builder{})
	}()
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(7 * time.Second):
		t.Fatal("ListenAndServe did not return")
	}
	select {
	case err := <-follow:
		// The daemon went away mid-follow: an error, not a normal end.
		if !errors.Is(err, api.ErrStreamCut) {
			t.Fatalf("follow after the server stopped: %v, want ErrStreamCut", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("follow stream did not end")
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left: %v", err)
	}
}

// TestClientFollowEnds: a follow stream the daemon ends because the
// session went ends without error, and its end marker is not copied.
func TestClientFollowEnds(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "e.sock")
	f := apitest.New()
	f.Create(context.Background(), api.CreateRequest{Name: "s1", NetworkOnly: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	go func() {
		_ = api.ListenAndServe(ctx, api.ListenConfig{Socket: sock}, api.NewHandler(f, api.HandlerOptions{}), func() { close(ready) })
	}()
	<-ready
	cl := api.NewClient(sock)
	var out strings.Builder
	follow := make(chan error, 1)
	go func() { follow <- cl.EventsTo(ctx, "s1", api.EventsOptions{Follow: true}, &out) }()
	time.Sleep(100 * time.Millisecond)
	if err := f.Delete(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-follow:
		if err != nil {
			t.Fatalf("follow of a removed session: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("follow stream did not end")
	}
	if got := out.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, `"action":"created"`) || strings.Contains(got, `"end"`) {
		t.Fatalf("copied %q, want the created event only", got)
	}
}

// codeCase is one error code: the sentinel it stands for and its status.
type codeCase struct {
	code     string
	sentinel error
	status   int
}

var codeCases = []codeCase{
	{api.CodeBadRequest, api.ErrBadRequest, 400},
	{api.CodeForbidden, api.ErrForbidden, 403},
	{api.CodeNotFound, api.ErrNotFound, 404},
	{api.CodeUnknownExec, api.ErrUnknownExec, 404},
	{api.CodeUnknownImage, api.ErrUnknownImage, 404},
	{api.CodeNoRoute, api.ErrNoRoute, 404},
	{api.CodeNameTaken, api.ErrNameTaken, 409},
	{api.CodeBusy, api.ErrBusy, 409},
	{api.CodeStaleGeneration, api.ErrStaleGeneration, 409},
	{api.CodeLocked, api.ErrLocked, 409},
	{api.CodeNoSandbox, api.ErrNoSandbox, 409},
	{api.CodeImageInUse, api.ErrImageInUse, 409},
	{api.CodeOtherDaemon, api.ErrOtherDaemon, 409},
	{api.CodeTooLarge, api.ErrTooLarge, 413},
	{api.CodeInternal, api.ErrInternal, 500},
	{api.CodePoolExhausted, api.ErrPoolExhausted, 503},
	{api.CodeUnavailable, api.ErrUnavailable, 503},
	{api.CodeExecTimeout, api.ErrExecTimeout, 504},
}

// TestCodeCasesCoverCodes: the cases below test every code of the table.
func TestCodeCasesCoverCodes(t *testing.T) {
	var got []string
	for _, c := range codeCases {
		got = append(got, c.code)
	}
	if want := api.Codes(); !slices.Equal(got, want) {
		t.Errorf("code cases %v, want api.Codes() %v", got, want)
	}
}

// failingEngine is the in-memory engine whose Inspect of a name in errs
// fails with that error.
type failingEngine struct {
	*apitest.Engine
	errs map[string]error
}

func (e failingEngine) Inspect(name string) (api.SessionInfo, error) {
	if err, ok := e.errs[name]; ok {
		return api.SessionInfo{}, err
	}
	return e.Engine.Inspect(name)
}

// serveOnSocket serves h on a unix socket in a temporary directory (no
// credential check) and returns a client of it.
func serveOnSocket(t *testing.T, h http.Handler) *api.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "e.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return api.NewClient(sock)
}

// TestClientErrorCodes: an engine error wrapping each sentinel reaches a
// Go caller as an *api.Error with the sentinel's code and status, and
// errors.Is finds that sentinel and no other of the table (a stale
// generation is not a taken name).
func TestClientErrorCodes(t *testing.T) {
	errs := map[string]error{}
	for _, c := range codeCases {
		errs[strings.ReplaceAll(c.code, "_", "-")] = fmt.Errorf("session x: %w", c.sentinel)
	}
	errs["internal"] = errors.New("add veth enfxh: file exists") // no sentinel at all
	cl := serveOnSocket(t, api.NewHandler(failingEngine{apitest.New(), errs}, api.HandlerOptions{}))
	for _, c := range codeCases {
		_, err := cl.Inspect(context.Background(), strings.ReplaceAll(c.code, "_", "-"))
		checkCoded(t, c, err, true)
	}
	// The handler's own refusals carry their codes too.
	_, err := cl.Why(context.Background(), "s1", "")
	checkCoded(t, codeCases[0], err, true)
	_, err = cl.Create(context.Background(), api.CreateRequest{Name: "x", Allow: []string{strings.Repeat("a", 1<<20)}})
	checkCoded(t, codeCase{api.CodeTooLarge, api.ErrTooLarge, 413}, err, true)
}

// TestClientErrorWithoutCode: a daemon older than the codes sends a body
// without one; the client maps its status as before (409: ErrNameTaken).
// An unknown code falls back to the status too.
func TestClientErrorWithoutCode(t *testing.T) {
	cl := serveOnSocket(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The session name is STATUS or STATUS-CODE.
		st, code, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v1/sessions/"), "-")
		var status int
		fmt.Sscan(st, &status)
		body := `{"error":"old"}`
		if code != "" {
			body = `{"error":"new","code":"` + code + `"}`
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintln(w, body)
	}))
	for status, want := range map[int]error{400: api.ErrBadRequest, 404: api.ErrNotFound, 409: api.ErrNameTaken, 503: api.ErrPoolExhausted, 500: api.ErrInternal} {
		_, err := cl.Inspect(context.Background(), fmt.Sprint(status))
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status != status || ae.Code != "" || !errors.Is(err, want) {
			t.Errorf("%d without a code: %#v, want errors.Is %v", status, err, want)
		}
	}
	_, err := cl.Inspect(context.Background(), "409-from_the_future")
	if !errors.Is(err, api.ErrNameTaken) {
		t.Errorf("409 with an unknown code: %v, want ErrNameTaken by its status", err)
	}
	// Every code maps to its sentinel whatever the status says.
	for _, c := range codeCases {
		_, err := cl.Inspect(context.Background(), fmt.Sprintf("%d-%s", c.status, c.code))
		checkCoded(t, c, err, false)
	}
}

func checkCoded(t *testing.T, c codeCase, err error, ownMessage bool) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != c.code || ae.Status != c.status {
		t.Errorf("%s: %#v, want an *api.Error of code %s and status %d", c.code, err, c.code, c.status)
		return
	}
	if ownMessage && strings.Contains(ae.Message, "\n") {
		t.Errorf("%s: message %q is not one line", c.code, ae.Message)
	}
	for _, other := range codeCases {
		if is := errors.Is(err, other.sentinel); is != (other.sentinel == c.sentinel) {
			t.Errorf("%s: errors.Is(err, %v) = %v", c.code, other.sentinel, is)
		}
	}
}
