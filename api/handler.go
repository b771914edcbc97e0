package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"time"
)

// maxRequestBody bounds every request body; larger ones get 413.
const maxRequestBody = 1 << 20

// HandlerOptions are what the handler needs besides the Engine; every field
// may be left zero.
type HandlerOptions struct {
	Log     *slog.Logger // nil: discard
	Version string       // the daemon's version, for GET /v1/version
	Commit  string       // the commit it was built from ("": unknown)
	// CreateRefused, when set, hears of every create refused before it
	// reached the Engine (a body that does not decode), so the daemon's
	// metrics count every failed create.
	CreateRefused func(err error)
}

// server serves the /v1 routes over an Engine. It holds no state of its own.
type server struct {
	e    Engine
	log  *slog.Logger
	opts HandlerOptions
}

// NewHandler returns the HTTP handler of the /v1 API. It does not check
// credentials: Serve wraps it with the SO_PEERCRED check.
func NewHandler(e Engine, opts HandlerOptions) http.Handler {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	a := &server{e: e, log: opts.Log, opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc(Prefix+"/healthz", a.methods(map[string]http.HandlerFunc{"GET": a.healthz}))
	// The API serves only once reconcile is done, so answering is readiness.
	mux.HandleFunc(Prefix+"/readyz", a.methods(map[string]http.HandlerFunc{"GET": a.readyz}))
	mux.HandleFunc(Prefix+"/version", a.methods(map[string]http.HandlerFunc{"GET": a.version}))
	mux.HandleFunc(Prefix+"/openapi.json", a.methods(map[string]http.HandlerFunc{"GET": a.openapi}))
	mux.HandleFunc(Prefix+"/sessions", a.methods(map[string]http.HandlerFunc{
		"GET": a.list, "POST": a.create, "DELETE": a.deleteByLabel,
	}))
	mux.HandleFunc(Prefix+"/sessions/{name}", a.methods(map[string]http.HandlerFunc{
		"GET": a.inspect, "DELETE": a.delete,
	}))
	mux.HandleFunc(Prefix+"/sessions/{name}/policy", a.methods(map[string]http.HandlerFunc{"PUT": a.policyPut, "PATCH": a.policyPatch}))
	mux.HandleFunc(Prefix+"/sessions/{name}/exec", a.methods(map[string]http.HandlerFunc{"POST": a.exec}))
	mux.HandleFunc(Prefix+"/sessions/{name}/execs", a.methods(map[string]http.HandlerFunc{"GET": a.execList}))
	mux.HandleFunc(Prefix+"/sessions/{name}/execs/{id}", a.methods(map[string]http.HandlerFunc{"GET": a.execInspect, "DELETE": a.execKill}))
	mux.HandleFunc(Prefix+"/sessions/{name}/execs/{id}/output", a.methods(map[string]http.HandlerFunc{"GET": a.execOutput}))
	mux.HandleFunc(Prefix+"/sessions/{name}/events", a.methods(map[string]http.HandlerFunc{"GET": a.events}))
	mux.HandleFunc(Prefix+"/sessions/{name}/why", a.methods(map[string]http.HandlerFunc{"GET": a.why}))
	mux.HandleFunc(Prefix+"/sessions/{name}/report", a.methods(map[string]http.HandlerFunc{"GET": a.report}))
	mux.HandleFunc(Prefix+"/events", a.methods(map[string]http.HandlerFunc{"GET": a.allEvents}))
	mux.HandleFunc(Prefix+"/images", a.methods(map[string]http.HandlerFunc{"GET": a.imageList}))
	mux.HandleFunc(Prefix+"/images/{name}", a.methods(map[string]http.HandlerFunc{"POST": a.imageImport, "DELETE": a.imageRemove}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, CodeNoRoute, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
	})
	return &handler{Handler: mux, log: opts.Log}
}

// handler is the API's handler; it carries its logger so Serve logs
// refused callers to the same place.
type handler struct {
	http.Handler
	log *slog.Logger
}

func (h *handler) logger() *slog.Logger { return h.log }

// methods dispatches by method; others get 405 with an Allow header.
// HEAD is served like GET where GET exists.
func (a *server) methods(h map[string]http.HandlerFunc) http.HandlerFunc {
	allowed := make([]string, 0, len(h))
	for _, m := range []string{"GET", "POST", "DELETE"} {
		if h[m] != nil {
			allowed = append(allowed, m)
		}
	}
	allow := strings.Join(allowed, ", ")
	return func(w http.ResponseWriter, r *http.Request) {
		method := r.Method
		if method == http.MethodHead {
			method = http.MethodGet
		}
		if f := h[method]; f != nil {
			f(w, r)
			return
		}
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, CodeNoRoute, fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow))
	}
}

// ---- responses ------------------------------------------------------------

func writeJSONStatus(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString(`{"error":"encode response failed","code":"internal"}` + "\n")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// writeError writes a refusal: its status, its code (one of Codes) and
// its one-line message.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSONStatus(w, status, ErrorBody{Error: OneLine(msg), Code: code})
}

// writeRefusal writes a refusal of the handler's own (a body that does
// not decode) with the status and code of the sentinel err wraps.
func writeRefusal(w http.ResponseWriter, err error) {
	status, code := statusCodeOf(err)
	writeError(w, status, code, err.Error())
}

func (a *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status, code := statusCodeOf(err)
	if status >= 500 && status != StatusClientClosed {
		a.log.Error("api request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, status, code, err.Error())
}

// decodeBody decodes a JSON body strictly: one object, no unknown fields,
// at most maxRequestBody bytes. The error is the response to send: it
// wraps ErrTooLarge or ErrBadRequest (writeRefusal sends it).
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	err := decodeBodyErr(w, r, v)
	switch {
	case err == nil, errors.Is(err, ErrTooLarge):
		return err
	}
	return Classify(err, ErrBadRequest)
}

func decodeBodyErr(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, maxRequestBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// Anything but whitespace after the object is malformed.
		if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
			err = errors.New("trailing data after the JSON object")
			var mbe *http.MaxBytesError
			if errors.As(terr, &mbe) {
				err = terr
			}
		}
	}
	if err == nil {
		return nil
	}
	var (
		mbe *http.MaxBytesError
		se  *json.SyntaxError
		te  *json.UnmarshalTypeError
		ce  base64.CorruptInputError
	)
	switch {
	case errors.As(err, &mbe):
		return Classify(fmt.Errorf("request body larger than %d bytes", mbe.Limit), ErrTooLarge)
	case errors.Is(err, io.EOF):
		return errors.New("empty request body: want a JSON object")
	case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("malformed JSON: %v", err)
	case errors.As(err, &te):
		if te.Field == "" {
			return fmt.Errorf("request body: want a JSON object, got JSON %s", te.Value)
		}
		return fmt.Errorf("field %q: want %s, got JSON %s", te.Field, jsonKind(te.Type), te.Value)
	case errors.As(err, &ce):
		// encoding/json reports bad base64 without the field; stdin_b64 is
		// the API's only bytes field.
		return fmt.Errorf("field \"stdin_b64\": want standard padded base64, got %v", err)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Errorf("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return fmt.Errorf("malformed JSON: %v", err)
}

// jsonKind names a Go type as the JSON a client should send.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a base64 string" // encoding/json's form of []byte
		}
		return "an array of " + strings.TrimPrefix(strings.TrimPrefix(jsonKind(t.Elem()), "a "), "an ") + "s"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "another JSON type"
}

// labelFilter parses ?label=KEY=VALUE ("" when absent).
func labelFilter(r *http.Request) (key, value string, ok bool, err error) {
	vals, present := r.URL.Query()["label"]
	if !present {
		return "", "", false, nil
	}
	if len(vals) != 1 {
		return "", "", false, errors.New("label: want one KEY=VALUE filter")
	}
	key, value, err = ParseLabel(vals[0])
	if err != nil {
		return "", "", false, fmt.Errorf("label %q: %v", vals[0], err)
	}
	return key, value, true, nil
}

// ---- handlers -------------------------------------------------------------

func (a *server) healthz(w http.ResponseWriter, r *http.Request) {
	if err := a.e.Healthy(); err != nil {
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "unhealthy: "+err.Error())
		return
	}
	writeJSONStatus(w, http.StatusOK, Status{Status: "ok"})
}

func (a *server) readyz(w http.ResponseWriter, r *http.Request) {
	writeJSONStatus(w, http.StatusOK, Status{Status: "ready"})
}

func (a *server) version(w http.ResponseWriter, r *http.Request) {
	writeJSONStatus(w, http.StatusOK, VersionInfo{Version: a.opts.Version, Commit: a.opts.Commit, Go: runtime.Version(), API: strings.TrimPrefix(Prefix, "/")})
}

func (a *server) create(w http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	if err := decodeBody(w, r, &req); err != nil {
		if a.opts.CreateRefused != nil {
			a.opts.CreateRefused(fmt.Errorf("%w: %v", ErrBadRequest, err))
		}
		writeRefusal(w, err)
		return
	}
	info, err := a.e.Create(r.Context(), req) // the engine records its metrics
	if err != nil {
		a.log.Info("create refused", "session", req.Name, "err", err)
		a.fail(w, r, err)
		return
	}
	writeJSONStatus(w, http.StatusCreated, info)
}

func (a *server) list(w http.ResponseWriter, r *http.Request) {
	key, value, _, err := labelFilter(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	list := a.e.List(key, value)
	if list == nil {
		list = []SessionInfo{}
	}
	writeJSONStatus(w, http.StatusOK, list)
}

func (a *server) inspect(w http.ResponseWriter, r *http.Request) {
	info, err := a.e.Inspect(r.PathValue("name"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSONStatus(w, http.StatusOK, info)
}

func (a *server) delete(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	q := r.URL.Query()
	var err error
	if q.Has("container_id") || q.Has("ifname") {
		// (only of that attachment: enforcerd-cni's DEL)
		err = a.e.DeleteAttachment(r.Context(), name, AttachmentRef{ContainerID: q.Get("container_id"), IfName: q.Get("ifname")})
	} else {
		err = a.e.Delete(r.Context(), name)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSONStatus(w, http.StatusOK, DeleteResponse{Deleted: []string{name}})
}

func (a *server) deleteByLabel(w http.ResponseWriter, r *http.Request) {
	key, value, ok, err := labelFilter(r)
	if err == nil && !ok {
		err = errors.New("label: deleting sessions in bulk needs ?label=KEY=VALUE")
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	names, err := a.e.DeleteByLabel(r.Context(), key, value)
	if names == nil {
		names = []string{}
	}
	if err != nil {
		// Report what went before the failure along with it.
		msg := err.Error()
		if len(names) > 0 {
			msg = fmt.Sprintf("%s (deleted before the failure: %s)", msg, strings.Join(names, ", "))
		}
		a.fail(w, r, &wrappedMsg{msg: msg, err: err})
		return
	}
	writeJSONStatus(w, http.StatusOK, DeleteResponse{Deleted: names})
}

// wrappedMsg replaces an error's text but keeps its chain for errors.Is.
type wrappedMsg struct {
	msg string
	err error
}

func (w *wrappedMsg) Error() string { return w.msg }
func (w *wrappedMsg) Unwrap() error { return w.err }

// eventQuery parses the query of both event routes: follow=1|0 and
// since=RFC3339.
func eventQuery(r *http.Request) (follow bool, since time.Time, err error) {
	q := r.URL.Query()
	switch v := q.Get("follow"); v {
	case "", "0", "false":
	case "1", "true":
		follow = true
	default:
		return false, since, fmt.Errorf("follow %q: want 1 or 0", v)
	}
	if v := q.Get("since"); v != "" {
		if since, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return false, since, fmt.Errorf("since %q: want an RFC 3339 time such as 2025-01-02T03:04:05Z", v)
		}
	}
	return follow, since, nil
}

func (a *server) events(w http.ResponseWriter, r *http.Request) {
	follow, since, err := eventQuery(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	name := r.PathValue("name")
	recorded, ch, err := a.e.Events(r.Context(), name, follow)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	streamEvents(w, r, name, recorded, ch, since)
}

func (a *server) allEvents(w http.ResponseWriter, r *http.Request) {
	follow, since, err := eventQuery(r)
	var key, value string
	if err == nil {
		key, value, _, err = labelFilter(r)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	recorded, ch, err := a.e.AllEvents(r.Context(), key, value, follow)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	streamEvents(w, r, "", recorded, ch, since)
}

// streamEvents writes the recorded events and then, when ch is not nil,
// the followed ones, those before since left out (follower markers always
// pass). When ch closes while the request lives, the daemon ended the
// session's stream: its last line is the end marker. A follow stream ends
// otherwise only with the request (the client left, or the daemon stops),
// so a client that reads EOF without the marker knows the daemon went.
func streamEvents(w http.ResponseWriter, r *http.Request, session string, recorded []Event, ch <-chan Event, since time.Time) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	keep := func(ev Event) bool { return since.IsZero() || !ev.Time.Before(since) || ev.Kind == EventKindMissed }
	for _, ev := range recorded {
		if keep(ev) && enc.Encode(ev) != nil {
			return
		}
	}
	_ = rc.Flush()
	if ch == nil {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-ch:
			if !ok {
				if r.Context().Err() == nil && session != "" {
					_ = enc.Encode(Event{Time: time.Now().UTC(), Session: session, Kind: EventKindEnd, Action: "removed"})
					_ = rc.Flush()
				}
				return
			}
			if !keep(ev) {
				continue
			}
			if enc.Encode(ev) != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// ---- exec -----------------------------------------------------------------

// frameWriter turns the engine's stdout and stderr writes into NDJSON exec
// frames, flushed as produced. The 200 header goes out with the first
// frame, so an error before any output can still get its own status.
// mu serialises the two streams and the final frame.
type frameWriter struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	enc     *json.Encoder
	started bool
	err     error // first write error: the client is gone
}

func newFrameWriter(w http.ResponseWriter) *frameWriter {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return &frameWriter{w: w, rc: http.NewResponseController(w), enc: enc}
}

func (f *frameWriter) frame(fr ExecFrame) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if !f.started {
		f.started = true
		f.w.Header().Set("Content-Type", "application/x-ndjson")
		f.w.WriteHeader(http.StatusOK)
	}
	if err := f.enc.Encode(fr); err != nil {
		f.err = err
		return err
	}
	if err := f.rc.Flush(); err != nil {
		f.err = err
		return err
	}
	return nil
}

func (f *frameWriter) hasStarted() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started
}

func (a *server) exec(w http.ResponseWriter, r *http.Request) {
	var req ExecRequest
	if err := decodeBody(w, r, &req); err != nil {
		writeRefusal(w, err)
		return
	}
	if len(req.Args) == 0 || req.Args[0] == "" {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "args: want the command and its arguments, e.g. [\"sh\", \"-c\", \"id\"]")
		return
	}
	if req.Timeout != "" {
		if d, err := time.ParseDuration(req.Timeout); err != nil || d <= 0 {
			writeError(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("timeout %q: want a positive duration such as 30s", req.Timeout))
			return
		}
	}
	name := r.PathValue("name")
	info, err := a.e.Exec(r.Context(), name, req)
	if err != nil {
		a.fail(w, r, err) // refused before anything ran: a plain JSON error
		return
	}
	if req.Detach {
		writeJSONStatus(w, http.StatusOK, info)
		return
	}
	fw := newFrameWriter(w)
	if fw.frame(ExecFrame{ExecID: info.ID}) != nil {
		return
	}
	a.streamExec(fw, r, name, info.ID, 0, true)
}
