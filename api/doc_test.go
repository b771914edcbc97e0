package api_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/api"
)

// TestDocsCoverClient: docs/api.md names every exported method of
// *api.Client (as "`Method(") and NewClient, every error code (as
// "`code`") and every exec frame field, so the page a Go programmer
// reads covers the whole client.
func TestDocsCoverClient(t *testing.T) {
	doc, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	page := string(doc)
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	methods := []string{"NewClient"}
	for _, f := range files {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) != 1 || !fn.Name.IsExported() {
				continue
			}
			if star, ok := fn.Recv.List[0].Type.(*ast.StarExpr); ok {
				if id, ok := star.X.(*ast.Ident); ok && id.Name == "Client" {
					methods = append(methods, fn.Name.Name)
				}
			}
		}
	}
	if len(methods) < 20 {
		t.Fatalf("found %d methods of *api.Client: %v; the parse is broken", len(methods), methods)
	}
	for _, m := range methods {
		if !strings.Contains(page, "`"+m+"(") {
			t.Errorf("docs/api.md does not document api.Client.%s (want \"`%s(\" in its table)", m, m)
		}
	}
	for _, code := range api.Codes() {
		if !strings.Contains(page, "`"+code+"`") {
			t.Errorf("docs/api.md does not document the error code %s", code)
		}
	}
	for _, field := range []string{"exec_id", "stream", "data", "data_b64", "offset", "exit", "error"} {
		if !strings.Contains(page, "`"+field+"`") {
			t.Errorf("docs/api.md does not document the exec frame field %s", field)
		}
	}
}
