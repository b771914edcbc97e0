package api

import (
	"bytes"
	_ "embed" // the OpenAPI document
	"fmt"
	"net/http"
)

// openAPIDocument is the OpenAPI 3 description of every /v1 route,
// request, response, exec frame and event. openapi_test.go drives the
// handler with it, so a route or field it does not describe fails a test.
//
//go:embed openapi.json
var openAPIDocument []byte

// OpenAPI returns the OpenAPI 3 document of /v1 (JSON), as GET
// /v1/openapi.json serves it.
func OpenAPI() []byte { return bytes.Clone(openAPIDocument) }

// openapi serves the document byte for byte.
func (a *server) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(openAPIDocument)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openAPIDocument)
}
