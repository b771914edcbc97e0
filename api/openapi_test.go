package api_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/api/apitest"
)

// The OpenAPI document (api/openapi.json) is checked against the handler
// three ways: the routes it lists are the ones the handler serves, its
// schemas have the fields and JSON types of the Go types, and recorded
// exchanges over every route, the error statuses included, validate against
// it (kin-openapi for requests and JSON responses, each NDJSON line against
// its schema).

// routes is every method and path the handler serves.
var routes = []string{
	"GET /v1/healthz",
	"GET /v1/readyz",
	"GET /v1/version",
	"GET /v1/openapi.json",
	"GET /v1/sessions",
	"POST /v1/sessions",
	"DELETE /v1/sessions",
	"GET /v1/sessions/{name}",
	"DELETE /v1/sessions/{name}",
	"PUT /v1/sessions/{name}/policy",
	"PATCH /v1/sessions/{name}/policy",
	"POST /v1/sessions/{name}/exec",
	"GET /v1/sessions/{name}/execs",
	"GET /v1/sessions/{name}/execs/{id}",
	"DELETE /v1/sessions/{name}/execs/{id}",
	"GET /v1/sessions/{name}/execs/{id}/output",
	"GET /v1/sessions/{name}/events",
	"GET /v1/events",
	"GET /v1/sessions/{name}/why",
	"GET /v1/sessions/{name}/report",
	"GET /v1/images",
	"POST /v1/images/{name}",
	"DELETE /v1/images/{name}",
}

func loadOpenAPI(t *testing.T) (*openapi3.T, routers.Router) {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.OpenAPI())
	if err != nil {
		t.Fatalf("load openapi.json: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi.json is not a valid OpenAPI document: %v", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("router of openapi.json: %v", err)
	}
	return doc, router
}

func documentedRoutes(doc *openapi3.T) []string {
	var out []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			out = append(out, method+" "+path)
		}
	}
	slices.Sort(out)
	return out
}

func TestOpenAPIServed(t *testing.T) {
	doc, _ := loadOpenAPI(t)
	if want := strings.TrimPrefix(api.Prefix, "/"); doc.Info.Version != want {
		t.Errorf("info.version %q, want the API version %q", doc.Info.Version, want)
	}
	file, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(file, api.OpenAPI()) {
		t.Fatal("api.OpenAPI() differs from openapi.json")
	}
	h := api.NewHandler(apitest.New(), api.HandlerOptions{})
	for _, method := range []string{"GET", "HEAD"} {
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, httptest.NewRequest(method, "http://enforcerd/v1/openapi.json", nil))
		if rr.Code != 200 || rr.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s /v1/openapi.json: %d %q", method, rr.Code, rr.Header().Get("Content-Type"))
		}
		if got := rr.Header().Get("Content-Length"); got != fmt.Sprint(len(file)) {
			t.Errorf("%s /v1/openapi.json: Content-Length %s, want %d", method, got, len(file))
		}
		if method == "GET" && !bytes.Equal(rr.Body.Bytes(), file) {
			t.Errorf("GET /v1/openapi.json does not return openapi.json byte for byte")
		}
	}
}

// TestOpenAPIRoutes holds the handler's routes, the list above and the
// document's paths to one set.
func TestOpenAPIRoutes(t *testing.T) {
	doc, _ := loadOpenAPI(t)
	want := slices.Sorted(slices.Values(routes))
	if got := documentedRoutes(doc); !slices.Equal(got, want) {
		t.Errorf("documented routes\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Every path the handler registers is a documented path. This reads
	// the source because a ServeMux does not list its patterns.
	src, err := os.ReadFile("handler.go")
	if err != nil {
		t.Fatal(err)
	}
	registered := regexp.MustCompile(`mux\.HandleFunc\(Prefix\+"([^"]*)"`).FindAllSubmatch(src, -1)
	if len(registered) == 0 {
		t.Fatal("found no mux.HandleFunc(Prefix+...) in handler.go")
	}
	for _, m := range registered {
		if p := api.Prefix + string(m[1]); doc.Paths.Find(p) == nil {
			t.Errorf("handler.go registers %s, which openapi.json does not describe", p)
		}
	}

	// The handler serves exactly the documented methods of each path:
	// each is routed (neither 405 nor "no route"), and any other method
	// gets 405 with an Allow header naming the documented ones.
	f := apitest.New()
	h := api.NewHandler(f, api.HandlerOptions{})
	if _, err := f.Create(context.Background(), api.CreateRequest{Name: "s1", Rootfs: "/images/a", Allow: []string{}}); err != nil {
		t.Fatal(err)
	}
	errSchema := doc.Components.Schemas["Error"].Value
	for path, item := range doc.Paths.Map() {
		concrete := strings.ReplaceAll(path, "{name}", "s1")
		var allowed []string
		for _, method := range []string{"GET", "POST", "DELETE"} {
			if item.GetOperation(method) != nil {
				allowed = append(allowed, method)
			}
		}
		for _, method := range []string{"GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS"} {
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, httptest.NewRequest(method, "http://enforcerd"+concrete+"?follow=0", nil))
			body := rr.Body.String()
			if item.GetOperation(method) != nil {
				if rr.Code == 405 || strings.Contains(body, "no route") {
					t.Errorf("%s %s is documented; the handler answered %d %s", method, concrete, rr.Code, body)
				}
				continue
			}
			if rr.Code != 405 || rr.Header().Get("Allow") != strings.Join(allowed, ", ") {
				t.Errorf("%s %s is not documented: got %d Allow %q, want 405 Allow %q", method, concrete, rr.Code, rr.Header().Get("Allow"), strings.Join(allowed, ", "))
			}
			validateJSONBody(t, errSchema, rr)
		}
		if _, err := f.Create(context.Background(), api.CreateRequest{Name: "s1", Rootfs: "/images/a", Allow: []string{}}); err != nil && !errors.Is(err, api.ErrNameTaken) {
			t.Fatal(err) // a DELETE above removed it
		}
	}
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, httptest.NewRequest("GET", "http://enforcerd/v1/nothing", nil))
	if rr.Code != 404 || doc.Paths.Find("/v1/nothing") != nil {
		t.Errorf("GET /v1/nothing: %d", rr.Code)
	}
	validateJSONBody(t, errSchema, rr)
}

func validateJSONBody(t *testing.T, schema *openapi3.Schema, rr *httptest.ResponseRecorder) {
	t.Helper()
	if ct := rr.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var v any
	if err := json.Unmarshal(rr.Body.Bytes(), &v); err != nil {
		t.Errorf("body %q: %v", rr.Body.String(), err)
		return
	}
	if err := schema.VisitJSON(v, openapi3.VisitAsResponse()); err != nil {
		t.Errorf("body %s: %v", rr.Body.String(), err)
	}
}

// schemaTypes are the Go types of the document's schemas.
var schemaTypes = map[string]reflect.Type{
	"Error":             reflect.TypeFor[api.ErrorBody](),
	"Status":            reflect.TypeFor[api.Status](),
	"VersionInfo":       reflect.TypeFor[api.VersionInfo](),
	"DeleteResponse":    reflect.TypeFor[api.DeleteResponse](),
	"CreateRequest":     reflect.TypeFor[api.CreateRequest](),
	"SessionInfo":       reflect.TypeFor[api.SessionInfo](),
	"VMView":            reflect.TypeFor[api.VMView](),
	"PolicyView":        reflect.TypeFor[api.PolicyView](),
	"PolicyUpdate":      reflect.TypeFor[api.PolicyUpdate](),
	"PolicyChange":      reflect.TypeFor[api.PolicyChange](),
	"GrantView":         reflect.TypeFor[api.GrantView](),
	"AttestedAddr":      reflect.TypeFor[api.AttestedAddr](),
	"Counters":          reflect.TypeFor[api.Counters](),
	"NameCheckView":     reflect.TypeFor[api.NameCheckView](),
	"ExecRequest":       reflect.TypeFor[api.ExecRequest](),
	"ExecFrame":         reflect.TypeFor[api.ExecFrame](),
	"ExecInfo":          reflect.TypeFor[api.ExecInfo](),
	"Event":             reflect.TypeFor[api.Event](),
	"Caller":            reflect.TypeFor[api.Caller](),
	"WhyAnswer":         reflect.TypeFor[api.WhyAnswer](),
	"WhyAddr":           reflect.TypeFor[api.WhyAddr](),
	"LedgerReport":      reflect.TypeFor[api.LedgerReport](),
	"LedgerDestination": reflect.TypeFor[api.LedgerDestination](),
	"ImageInfo":         reflect.TypeFor[api.ImageInfo](),
}

// jsonField is one field as encoding/json writes it.
type jsonField struct {
	typ      reflect.Type
	optional bool // omitempty, or promoted from an embedded pointer
}

// jsonFields lists the fields encoding/json writes for struct type t,
// promoting the fields of untagged embedded structs as it does.
func jsonFields(t reflect.Type) map[string]jsonField {
	out := map[string]jsonField{}
	for f := range t.Fields() {
		tag, hasTag := f.Tag.Lookup("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && !hasTag {
			et, ptr := f.Type, false
			if et.Kind() == reflect.Pointer {
				et, ptr = et.Elem(), true
			}
			if et.Kind() == reflect.Struct {
				for n, sub := range jsonFields(et) {
					sub.optional = sub.optional || ptr
					out[n] = sub
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = jsonField{typ: f.Type, optional: slices.Contains(strings.Split(opts, ","), "omitempty")}
	}
	return out
}

// TestOpenAPISchemasMatchTypes holds every schema to its Go type: the
// same JSON field names, required exactly when encoding/json always
// writes the field, each of the JSON type encoding/json gives it.
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	doc, _ := loadOpenAPI(t)
	names := map[reflect.Type]string{}
	for name, typ := range schemaTypes {
		names[typ] = name
	}
	for name := range doc.Components.Schemas {
		if schemaTypes[name] == nil {
			t.Errorf("schema %s has no Go type in schemaTypes", name)
		}
	}
	for name, typ := range schemaTypes {
		ref := doc.Components.Schemas[name]
		if ref == nil {
			t.Errorf("openapi.json has no schema %s (Go type %s)", name, typ)
			continue
		}
		s := ref.Value
		if !s.Type.Is("object") {
			t.Errorf("%s: type %v, want object", name, s.Type.Slice())
		}
		fields := jsonFields(typ)
		for prop := range s.Properties {
			if _, ok := fields[prop]; !ok {
				t.Errorf("%s.%s is documented; %s has no such JSON field", name, prop, typ)
			}
		}
		var required []string
		for field, jf := range fields {
			if !jf.optional {
				required = append(required, field)
			}
			prop := s.Properties[field]
			if prop == nil {
				t.Errorf("%s: JSON field %q of %s is not documented", name, field, typ)
				continue
			}
			checkSchemaType(t, name+"."+field, prop, jf.typ, names)
		}
		slices.Sort(required)
		if got := slices.Sorted(slices.Values(s.Required)); !slices.Equal(got, required) {
			t.Errorf("%s: required %v, want the fields always written %v", name, got, required)
		}
	}
	// The handler refuses unknown fields; the request schemas say so.
	for _, name := range []string{"CreateRequest", "ExecRequest"} {
		if ap := doc.Components.Schemas[name].Value.AdditionalProperties; ap.Has == nil || *ap.Has {
			t.Errorf("%s: want additionalProperties false", name)
		}
	}
}

var timeType = reflect.TypeFor[time.Time]()

// checkSchemaType checks that the schema of a field is the JSON that
// encoding/json writes for Go type typ.
func checkSchemaType(t *testing.T, where string, ref *openapi3.SchemaRef, typ reflect.Type, names map[reflect.Type]string) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if name, ok := names[typ]; ok {
		if want := "#/components/schemas/" + name; ref.Ref != want {
			t.Errorf("%s: %q, want $ref %s", where, ref.Ref, want)
		}
		return
	}
	s := ref.Value
	want, format := "", ""
	switch {
	case typ == timeType:
		want, format = "string", "date-time"
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() == reflect.Uint8:
		want, format = "string", "byte"
	case typ.Kind() == reflect.String:
		want = "string"
	case typ.Kind() == reflect.Bool:
		want = "boolean"
	case typ.Kind() >= reflect.Int && typ.Kind() <= reflect.Uint64:
		want = "integer"
		if typ.Kind() >= reflect.Uint && (s.Min == nil || *s.Min != 0) {
			t.Errorf("%s: %s, want minimum 0", where, typ)
		}
	case typ.Kind() == reflect.Float32 || typ.Kind() == reflect.Float64:
		want = "number"
	case typ.Kind() == reflect.Slice:
		want = "array"
		if s.Items == nil {
			t.Errorf("%s: array without items", where)
		} else {
			checkSchemaType(t, where+"[]", s.Items, typ.Elem(), names)
		}
	case typ.Kind() == reflect.Map:
		want = "object"
		if typ.Elem().Kind() == reflect.Interface {
			if s.AdditionalProperties.Has == nil || !*s.AdditionalProperties.Has {
				t.Errorf("%s: want additionalProperties true", where)
			}
		} else if s.AdditionalProperties.Schema == nil {
			t.Errorf("%s: want additionalProperties with a schema", where)
		} else {
			checkSchemaType(t, where+"{}", s.AdditionalProperties.Schema, typ.Elem(), names)
		}
	default:
		t.Errorf("%s: Go type %s has no rule here", where, typ)
		return
	}
	if !s.Type.Is(want) {
		t.Errorf("%s: type %v, want %s (Go %s)", where, s.Type.Slice(), want, typ)
	}
	if format != "" && s.Format != format {
		t.Errorf("%s: format %q, want %q", where, s.Format, format)
	}
}

// exchange is one request to the handler and the answer expected.
type exchange struct {
	method, path, body string
	status             int
	// invalid: the request breaks the document (and the handler refuses
	// it too); ValidateRequest must say so.
	invalid bool
	// unhealthy: send it to a handler whose engine is unhealthy.
	unhealthy bool
	// check looks further at the body (NDJSON: its lines, decoded).
	check func(t *testing.T, body []byte)
	// contentType of the body when not JSON (an image archive).
	contentType string
}

// execFrames decodes an exec stream, without the exec_id line a POST's
// stream starts with.
func execFrames(t *testing.T, body []byte) []api.ExecFrame {
	t.Helper()
	var out []api.ExecFrame
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		var f api.ExecFrame
		if err := dec.Decode(&f); errors.Is(err, io.EOF) {
			if len(out) > 0 && out[0].ExecID != "" {
				out = out[1:]
			}
			return out
		} else if err != nil {
			t.Fatalf("exec stream %q: %v", body, err)
		}
		out = append(out, f)
	}
}

// wantFinal checks that an exec stream has n output frames and ends with
// one final frame of exit status exit, with an error when withError.
func wantFinal(n, exit int, withError bool) func(t *testing.T, body []byte) {
	return func(t *testing.T, body []byte) {
		t.Helper()
		frames := execFrames(t, body)
		if len(frames) != n+1 {
			t.Fatalf("%d frames, want %d output frames and the final: %s", len(frames), n, body)
		}
		last := frames[n]
		if last.Exit == nil || *last.Exit != exit || (last.Error != "") != withError {
			t.Errorf("final frame %+v, want exit %d (error: %v)", last, exit, withError)
		}
	}
}

func wantBody(want string) func(t *testing.T, body []byte) {
	return func(t *testing.T, body []byte) {
		t.Helper()
		if string(body) != want {
			t.Errorf("body %s, want %s", body, want)
		}
	}
}

func TestOpenAPIExchanges(t *testing.T) {
	doc, router := loadOpenAPI(t)
	f := apitest.New()
	f.ExecFn = func(ctx context.Context, name string, req api.ExecRequest, stdout, stderr io.Writer) (int, error) {
		switch req.Args[0] {
		case "both":
			fmt.Fprint(stdout, "hello\n")
			fmt.Fprint(stderr, "not utf-8: \xff\xfe\n")
			return 3, nil
		case "sleep":
			return api.ExitTimeout, fmt.Errorf("exec in %s: %w after %s", name, api.ErrExecTimeout, req.Timeout)
		case "missing":
			return api.ExitNotFound, api.Classify(errors.New(`exec "missing": executable file not found in $PATH`), api.ErrNotStarted)
		case "crash":
			fmt.Fprint(stdout, "partial\n")
			return api.ExitEnforcerd, errors.New("runc exec: container gone")
		}
		fmt.Fprintf(stdout, "ran %s, stdin %q\n", strings.Join(req.Args, " "), req.Stdin)
		return 0, nil
	}
	h := api.NewHandler(f, api.HandlerOptions{Version: "1.2.3", Commit: "0123456789ab"})
	sick := apitest.New()
	sick.Unhealthy = errors.New("table inet enforcerd is missing")
	hSick := api.NewHandler(sick, api.HandlerOptions{})

	big := `{"name":"big","rootfs":"/images/a","allow":["` + strings.Repeat("a", 1<<20) + `"]}`
	cases := []exchange{
		{method: "GET", path: "/v1/healthz", status: 200, check: wantBody(`{"status":"ok"}` + "\n")},
		{method: "GET", path: "/v1/healthz", status: 503, unhealthy: true},
		{method: "GET", path: "/v1/readyz", status: 200},
		{method: "GET", path: "/v1/version", status: 200, check: wantBody(`{"version":"1.2.3","commit":"0123456789ab","go":"` + runtime.Version() + `","api":"v1"}` + "\n")},
		{method: "GET", path: "/v1/openapi.json", status: 200},
		{method: "GET", path: "/v1/sessions", status: 200, check: wantBody("[]\n")},

		{method: "POST", path: "/v1/sessions", status: 201, body: `{"name":"box","rootfs":"/images/a","allow":["example.com:443","10.0.0.0/8"],"scope":["https://api.example.com"],"egress":"allowlist","memory_bytes":268435456,"pids":64,"cpus":0.5,"net_raw":true,"writable":true,"labels":{"run":"1"}}`},
		{method: "POST", path: "/v1/sessions", status: 201, body: `{"name":"net","network_only":true,"allow":[],"lab":true,"labels":{"run":"1"}}`},
		{method: "POST", path: "/v1/sessions", status: 201, body: `{"name":"plain","network_only":true,"allow":["example.com"],"pin":true,"lab_peers":["net"]}`},
		{method: "POST", path: "/v1/sessions", status: 409, body: `{"name":"box","rootfs":"/images/a"}`},
		{method: "POST", path: "/v1/sessions", status: 400, body: `{"name":"bad-1","network_only":true}`},
		{method: "POST", path: "/v1/sessions", status: 503, body: `{"name":"full-x","network_only":true}`},
		{method: "POST", path: "/v1/sessions", status: 500, body: `{"name":"boom-x","network_only":true}`},
		{method: "POST", path: "/v1/sessions", status: 413, body: big},
		{method: "POST", path: "/v1/sessions", status: 400, invalid: true, body: `{"name":"x",`},
		{method: "POST", path: "/v1/sessions", status: 400, invalid: true, body: ``},
		{method: "POST", path: "/v1/sessions", status: 400, invalid: true, body: `[1]`},
		{method: "POST", path: "/v1/sessions", status: 400, invalid: true, body: `{"name":"x","bogus":1}`},
		{method: "POST", path: "/v1/sessions", status: 400, invalid: true, body: `{"name":"x","pids":"many"}`},

		{method: "GET", path: "/v1/sessions", status: 200},
		{method: "GET", path: "/v1/sessions?label=run=1", status: 200},
		{method: "GET", path: "/v1/sessions?label=novalue", status: 400},
		{method: "GET", path: "/v1/sessions/box", status: 200},
		{method: "GET", path: "/v1/sessions/net", status: 200},
		{method: "GET", path: "/v1/sessions/nope", status: 404},

		{method: "PATCH", path: "/v1/sessions/box/policy", status: 200, body: `{"generation":1,"allow":["b.example.com:443/tcp"],"scope":["https://c.example.com"],"lab_peers":["net"],"revoke":["10.0.0.0/8"],"revoke_lab_peers":["x"],"keep_established":true}`},
		{method: "PUT", path: "/v1/sessions/box/policy", status: 200, body: `{"generation":2,"egress":"allowlist","allow":["example.com:443"]}`},
		{method: "PATCH", path: "/v1/sessions/box/policy", status: 409, body: `{"generation":1,"allow":["d.example.com"]}`},
		{method: "PUT", path: "/v1/sessions/nope/policy", status: 404, body: `{}`},
		{method: "PATCH", path: "/v1/sessions/box/policy", status: 200, body: `{"deny":["x.example.com","198.51.100.0/24:443/tcp"],"revoke_deny":["y.example.com"],"on_deny":"reject"}`},
		{method: "PATCH", path: "/v1/sessions/box/policy", status: 400, invalid: true, body: `{"denied":["x.example.com"]}`},

		{method: "POST", path: "/v1/sessions/box/exec", status: 200, body: `{"args":["both"]}`, check: func(t *testing.T, body []byte) {
			frames := execFrames(t, body)
			wantFinal(2, 3, false)(t, body)
			if frames[0].Stream != "stdout" || frames[0].Data != "hello\n" || frames[1].Stream != "stderr" || frames[1].DataB64 == "" {
				t.Errorf("output frames %+v, want stdout data and stderr data_b64", frames[:2])
			}
		}},
		{method: "POST", path: "/v1/sessions/box/exec", status: 200, body: `{"args":["cat"],"env":["A=1"],"dir":"/tmp","user":"nobody","stdin_b64":"aGkK"}`, check: wantFinal(1, 0, false)},
		{method: "POST", path: "/v1/sessions/box/exec", status: 200, body: `{"args":["sleep","9"],"timeout":"1s"}`, check: wantFinal(0, api.ExitTimeout, true)},
		{method: "POST", path: "/v1/sessions/box/exec", status: 200, body: `{"args":["missing"]}`, check: wantFinal(0, api.ExitNotFound, true)},
		{method: "POST", path: "/v1/sessions/box/exec", status: 200, body: `{"args":["crash"]}`, check: wantFinal(1, api.ExitEnforcerd, true)},
		{method: "POST", path: "/v1/sessions/nope/exec", status: 404, body: `{"args":["id"]}`},
		{method: "POST", path: "/v1/sessions/box/exec", status: 200, body: `{"args":["true"],"detach":true}`},
		{method: "GET", path: "/v1/sessions/box/execs", status: 200},
		{method: "GET", path: "/v1/sessions/nope/execs", status: 404},
		{method: "GET", path: "/v1/sessions/box/execs/0000000000000001", status: 200},
		{method: "GET", path: "/v1/sessions/box/execs/00000000000000ff", status: 404},
		{method: "GET", path: "/v1/sessions/box/execs/0000000000000001/output?offset=1&follow=1", status: 200, check: wantFinal(1, 3, false)},
		{method: "GET", path: "/v1/sessions/box/execs/0000000000000001/output?offset=x", status: 400, invalid: true},
		{method: "GET", path: "/v1/sessions/box/execs/0000000000000001/output?offset=99", status: 400},
		{method: "DELETE", path: "/v1/sessions/box/execs/0000000000000001", status: 200},
		{method: "POST", path: "/v1/sessions/net/exec", status: 409, body: `{"args":["id"]}`},
		{method: "POST", path: "/v1/sessions/box/exec", status: 400, body: `{"args":["id"],"timeout":"soon"}`},
		{method: "POST", path: "/v1/sessions/box/exec", status: 400, invalid: true, body: `{"args":[]}`},
		{method: "POST", path: "/v1/sessions/box/exec", status: 400, invalid: true, body: `{"args":["id"],"tty":true}`},
		{method: "POST", path: "/v1/sessions/box/exec", status: 400, invalid: true, body: `{"args":["id"],"stdin_b64":"!!"}`},
		{method: "POST", path: "/v1/sessions/box/exec", status: 413, body: `{"args":["` + strings.Repeat("a", 1<<20) + `"]}`},

		{method: "GET", path: "/v1/sessions/box/events", status: 200, check: func(t *testing.T, body []byte) {
			if n := bytes.Count(body, []byte("\n")); n != 3 {
				t.Errorf("%d events, want 3: %s", n, body)
			}
		}},
		{method: "GET", path: "/v1/sessions/box/events?follow=0", status: 200},
		{method: "GET", path: "/v1/sessions/nope/events", status: 404},
		{method: "GET", path: "/v1/sessions/box/events?follow=maybe", status: 400, invalid: true},
		{method: "GET", path: "/v1/sessions/box/events?since=2025-01-02T03:00:00Z", status: 200},
		{method: "GET", path: "/v1/sessions/box/events?since=noon", status: 400, invalid: true},
		{method: "GET", path: "/v1/events", status: 200, check: func(t *testing.T, body []byte) {
			if !bytes.Contains(body, []byte(`"caller":{"uid":1000,"gid":1001,"pid":42}`)) {
				t.Errorf("no caller in %s", body)
			}
		}},
		{method: "GET", path: "/v1/events?label=run=1&since=2025-01-02T03:00:00Z", status: 200},
		{method: "GET", path: "/v1/events?label=novalue", status: 400},
		{method: "GET", path: "/v1/events?since=noon", status: 400, invalid: true},
		{method: "GET", path: "/v1/sessions/box/why?dest=api.example.com", status: 200},
		{method: "GET", path: "/v1/sessions/nope/why?dest=api.example.com", status: 404},
		{method: "GET", path: "/v1/sessions/box/why", status: 400, invalid: true},
		{method: "GET", path: "/v1/sessions/box/report", status: 200},
		{method: "GET", path: "/v1/sessions/nope/report", status: 404},

		{method: "GET", path: "/v1/images", status: 200, check: wantBody("[]\n")},
		{method: "POST", path: "/v1/images/img1?source=img1.tar", status: 201, body: "archive bytes", contentType: "application/octet-stream"},
		{method: "POST", path: "/v1/images/img1", status: 409, body: "archive bytes", contentType: "application/octet-stream"},
		{method: "POST", path: "/v1/images/img2", status: 400, body: "bad archive", contentType: "application/octet-stream"},
		{method: "POST", path: "/v1/sessions", status: 201, body: `{"name":"imgbox","image":"img1","allow":[],"labels":{"run":"1"}}`},
		{method: "GET", path: "/v1/images", status: 200, check: func(t *testing.T, body []byte) {
			if !bytes.Contains(body, []byte(`"used_by":["imgbox"]`)) {
				t.Errorf("img1 not used by imgbox: %s", body)
			}
		}},
		{method: "DELETE", path: "/v1/images/img1", status: 409},
		{method: "DELETE", path: "/v1/images/nope", status: 404},

		{method: "DELETE", path: "/v1/sessions", status: 400, invalid: true},
		{method: "DELETE", path: "/v1/sessions?label=novalue", status: 400},
		{method: "DELETE", path: "/v1/sessions?label=run=1", status: 200, check: wantBody(`{"deleted":["box","imgbox","net"]}` + "\n")},
		{method: "DELETE", path: "/v1/images/img1", status: 200, check: wantBody(`{"deleted":["img1"]}` + "\n")},
		{method: "DELETE", path: "/v1/sessions?label=run=1", status: 200, check: wantBody(`{"deleted":[]}` + "\n")},
		{method: "DELETE", path: "/v1/sessions/plain", status: 200, check: wantBody(`{"deleted":["plain"]}` + "\n")},
		{method: "DELETE", path: "/v1/sessions/plain", status: 404},
	}
	seen := map[string]bool{}
	for i, tc := range cases {
		if i == 1 {
			// Events of each kind for the events route.
			f.Record(api.Event{Time: time.Date(2025, 1, 2, 3, 0, 0, 123e6, time.UTC), Session: "box", Kind: api.EventKindDNS, Action: "allowed",
				Detail: map[string]any{"name": "example.com.", "type": "A", "addrs": []string{"198.18.1.10"}, "upstream": "192.0.2.53:53", "upstream_ms": 1.5}})
		}
		if tc.path == "/v1/sessions/box/events" {
			f.Record(api.Event{Time: time.Now().UTC(), Session: "box", Kind: api.EventKindMissed, Detail: map[string]any{"count": 2}})
		}
		t.Run(fmt.Sprintf("%02d %s %s %d", i, tc.method, tc.path, tc.status), func(t *testing.T) {
			hh := h
			if tc.unhealthy {
				hh = hSick
			}
			route := runExchange(t, doc, router, hh, tc)
			if route != "" {
				seen[route] = true
			}
		})
	}
	for _, r := range routes {
		if !seen[r] {
			t.Errorf("no exchange covers %s", r)
		}
	}
}

// runExchange validates the request against the document, serves it, and
// validates the response. It returns the route it matched.
func runExchange(t *testing.T, doc *openapi3.T, router routers.Router, h http.Handler, tc exchange) string {
	newReq := func() *http.Request {
		var body io.Reader
		if tc.body != "" {
			body = strings.NewReader(tc.body)
		}
		r := httptest.NewRequest(tc.method, "http://enforcerd"+tc.path, body)
		// As Serve would: the caller from the connection's credentials.
		r = r.WithContext(api.WithCaller(r.Context(), api.Caller{UID: 1000, GID: 1001, PID: 42}))
		if tc.method == "POST" || tc.body != "" {
			r.Header.Set("Content-Type", cmp.Or(tc.contentType, "application/json"))
		}
		return r
	}
	req := newReq()
	route, params, err := router.FindRoute(req)
	if err != nil {
		t.Fatalf("openapi.json has no route for it: %v", err)
	}
	opts := &openapi3filter.Options{IncludeResponseStatus: true}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	err = openapi3filter.ValidateRequest(context.Background(), in)
	switch {
	case tc.invalid && err == nil:
		t.Errorf("the document accepts a request the handler refuses")
	case !tc.invalid && err != nil:
		t.Errorf("request: %v", err)
	}

	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, newReq())
	res := rr.Result()
	body := rr.Body.Bytes()
	if res.StatusCode != tc.status {
		t.Fatalf("status %d, want %d: %s", res.StatusCode, tc.status, body)
	}
	if route.Operation.Responses.Status(res.StatusCode) == nil {
		t.Errorf("status %d is not documented for %s %s", res.StatusCode, tc.method, route.Path)
	}
	ct := res.Header.Get("Content-Type")
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: res.StatusCode, Header: res.Header, Options: opts}
	if ct == "application/x-ndjson" {
		// kin-openapi decodes no NDJSON: the status and content type are
		// checked here, each line against the media type's schema.
		out.Options = &openapi3filter.Options{IncludeResponseStatus: true, ExcludeResponseBody: true}
		if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
			t.Errorf("response: %v", err)
		}
		mt := route.Operation.Responses.Status(res.StatusCode).Value.Content.Get(ct)
		if mt == nil || mt.Schema == nil {
			t.Fatalf("status %d of %s %s has no %s schema", res.StatusCode, tc.method, route.Path, ct)
		}
		validateNDJSON(t, mt.Schema.Value, body)
	} else {
		out.SetBodyBytes(body)
		if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
			t.Errorf("response: %v", err)
		}
	}
	if tc.check != nil {
		tc.check(t, body)
	}
	return tc.method + " " + route.Path
}

func validateNDJSON(t *testing.T, schema *openapi3.Schema, body []byte) {
	t.Helper()
	if len(body) > 0 && body[len(body)-1] != '\n' {
		t.Errorf("NDJSON stream does not end with a newline: %q", body)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var v any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Errorf("line %s: %v", sc.Bytes(), err)
			continue
		}
		if err := schema.VisitJSON(v, openapi3.VisitAsResponse()); err != nil {
			t.Errorf("line %s: %v", sc.Bytes(), err)
		}
	}
	if err := sc.Err(); err != nil {
		t.Error(err)
	}
}

// TestOpenAPIErrorCodes: the Error schema's code enum is the codes of
// errors.go's table, in its order, each once.
func TestOpenAPIErrorCodes(t *testing.T) {
	doc, _ := loadOpenAPI(t)
	code := doc.Components.Schemas["Error"].Value.Properties["code"].Value
	var got []string
	for _, v := range code.Enum {
		got = append(got, fmt.Sprint(v))
	}
	if want := api.Codes(); !slices.Equal(got, want) {
		t.Errorf("Error.code enum %v, want api.Codes() %v", got, want)
	}
	for _, c := range api.Codes() {
		if !strings.Contains(code.Description, c+" (") {
			t.Errorf("Error.code's description does not explain %s", c)
		}
	}
}
