package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/api"
)

// TestCLIImageUsageErrors: malformed image command lines exit 2 with one
// line, before any daemon is contacted.
func TestCLIImageUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"image"}, "enforcerd image: missing subcommand (import, ls or rm)"},
		{[]string{"image", "bogus"}, `enforcerd image: unknown subcommand "bogus" (import, ls or rm)`},
		{[]string{"image", "imprt"}, `enforcerd image: unknown subcommand "imprt"; did you mean "import"?`},
		{[]string{"image", "import"}, "enforcerd image import: missing image NAME and FILE"},
		{[]string{"image", "import", "box"}, `enforcerd image import: missing FILE after NAME "box" (a docker save archive, an OCI layout directory or its tar, - for stdin)`},
		{[]string{"image", "import", "box", "f", "g"}, `enforcerd image import: unexpected argument "g" after FILE "f"`},
		{[]string{"image", "import", "Box", "f"}, `enforcerd image import: image name "Box": want 1 to 63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit (e.g. python-3.12-slim)`},
		{[]string{"image", "ls", "x"}, `enforcerd image ls: unexpected argument "x"`},
		{[]string{"image", "rm"}, "enforcerd image rm: missing image NAME"},
		{[]string{"image", "rm", "a", "b"}, `enforcerd image rm: unexpected argument "b" after NAME "a"`},
		{[]string{"session", "create", "s1", "--image", "box", "--rootfs", "/r"}, `enforcerd session create: --image "box", --rootfs and --network-only exclude each other`},
		{[]string{"session", "create", "s1", "--image", "box", "--network-only"}, `enforcerd session create: --image "box", --rootfs and --network-only exclude each other`},
		{[]string{"session", "create", "s1", "--image="}, `enforcerd session create: invalid value "" for flag --image: want an image name (enforcerd image ls)`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			c := newTestCLI(t)
			c.env["ENFORCERD_SOCKET"] = filepath.Join(t.TempDir(), "nobody.sock")
			if code := c.run(tc.args...); code != ExitUsage {
				t.Errorf("exit %d, want 2 (stderr %q)", code, c.errOut.String())
			}
			if got := c.errOut.String(); got != tc.want+"\n" {
				t.Errorf("stderr\n got %q\nwant %q", got, tc.want+"\n")
			}
		})
	}
}

// TestEndToEndImages: import (a file, a layout directory, stdin), ls, a
// session from an image, rm refused while it is used, through the API.
func TestEndToEndImages(t *testing.T) {
	f, c, _ := startAPI(t)
	dir := t.TempDir()
	archive := filepath.Join(dir, "box.tar")
	if err := os.WriteFile(archive, []byte("archive"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ := c.expect(t, 0, "image", "import", "box", archive)
	if !strings.HasPrefix(out, "imported box: sha256:") {
		t.Errorf("import output %q", out)
	}
	layout := filepath.Join(dir, "layout")
	if err := os.MkdirAll(filepath.Join(layout, "blobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layout, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _ = c.expect(t, 0, "image", "import", "--json", "lay", layout)
	var info api.ImageInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.Name != "lay" || info.Source != "layout" {
		t.Errorf("import of a layout dir: %q %v", out, err)
	}
	c.Stdin = strings.NewReader("bad archive")
	_, errOut := c.expect(t, 1, "image", "import", "piped", "-")
	if errOut != `enforcerd image import: image "piped": stdin: not a tar archive: bad request`+"\n" {
		t.Errorf("import of a bad archive: %q", errOut)
	}
	_, errOut = c.expect(t, 1, "image", "import", "x", filepath.Join(dir, "missing.tar"))
	if errOut != `enforcerd image import: FILE "`+filepath.Join(dir, "missing.tar")+`": no such file or directory`+"\n" {
		t.Errorf("import of a missing file: %q", errOut)
	}

	c.expect(t, 0, "session", "create", "s1", "--image", "box")
	if got := f.Creates()[0]; got.Image != "box" || got.Rootfs != "" {
		t.Errorf("create request %+v; want image box, no rootfs", got)
	}
	out, _ = c.expect(t, 0, "image", "ls")
	if lines := strings.Split(out, "\n"); len(lines) < 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME DIGEST LAYERS SIZE USED BY AGE" ||
		strings.Join(strings.Fields(lines[1]), " ") != "box sha256:000000000000 1 7B s1 4m" {
		t.Errorf("ls output:\n%s", out)
	}
	_, errOut = c.expect(t, 1, "image", "rm", "box")
	if errOut != `enforcerd image rm: image "box": used by session s1; remove it first: image in use`+"\n" {
		t.Errorf("rm while used: %q", errOut)
	}
	c.expect(t, 0, "session", "rm", "s1")
	out, _ = c.expect(t, 0, "image", "rm", "--json", "box")
	if strings.Join(strings.Fields(out), "") != `{"deleted":["box"]}` {
		t.Errorf("rm --json: %q", out)
	}
	out, _ = c.expect(t, 0, "image", "ls", "--json")
	var list []api.ImageInfo
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].Name != "lay" {
		t.Errorf("ls --json after rm: %q %v", out, err)
	}
}
