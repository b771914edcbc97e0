package daemon

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/container"
)

// imageDaemon is a daemon with an image store holding the image "box" (made
// by hand: the import itself is the container package's, tested there).
func imageDaemon(t *testing.T) *Engine {
	t.Helper()
	if os.Geteuid() != 0 {
		// make unit runs this package as root first, then again as uid
		// 65534 (scripts/nonroot-tests.sh, which says so in
		// ENFORCERD_NONROOT_RERUN): the rerun leaves out what only root can
		// set up; anywhere else under CI=true a missing root fails.
		if os.Getenv("CI") == "true" && os.Getenv("ENFORCERD_NONROOT_RERUN") != "1" {
			t.Fatal("needs root: an image directory must be root's")
		}
		t.Skip("needs root: an image directory must be root's (tested in the root run)")
	}
	store, err := container.OpenImageStore(filepath.Join(t.TempDir(), ImageStoreDir), container.UnpackLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(store.Rootfs("box"), "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(store.Dir, "box", "image.json"), []byte(`{"name":"box","digest":"sha256:00"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return New(Config{ImagesDirs: []string{store.Dir}}, Parts{Images: store, Log: slog.New(slog.DiscardHandler)})
}

// TestImageInUseDecidedWithCreates: an image is in use from the moment a
// create of it is reserved until that session is removed; a removal that
// comes first makes the create fail instead.
func TestImageInUseDecidedWithCreates(t *testing.T) {
	e := imageDaemon(t)
	ctx := context.Background()
	req := api.CreateRequest{Name: "s1", Image: "box"}
	if err := e.validateRequest(&req); err != nil {
		t.Fatal(err)
	}
	real, _ := filepath.EvalSymlinks(e.images.Rootfs("box"))
	if req.Rootfs != real {
		t.Fatalf("--image box resolved to %q; want %q", req.Rootfs, real)
	}

	// A create in flight (reserved, not yet published) uses the image.
	if _, err := e.reserve("s1", false); err != nil {
		t.Fatal(err)
	}
	if err := e.claimRootfs("s1", req.Rootfs); err != nil {
		t.Fatal(err)
	}
	err := e.RemoveImage(ctx, "box")
	if err == nil || err.Error() != `image "box": used by session s1; remove the session first: image in use` || !errors.Is(err, api.ErrImageInUse) {
		t.Errorf("remove during a create: %v; want in use, naming s1", err)
	}
	// Published, it still does; list says so.
	e.mu.Lock()
	e.sessions["s1"] = &liveSession{rec: SessionRecord{Name: "s1", Sandbox: true, Request: req}}
	e.mu.Unlock()
	e.release("s1")
	list, err := e.ListImages()
	if err != nil || len(list) != 1 || strings.Join(list[0].UsedBy, ",") != "s1" {
		t.Errorf("ListImages = %+v, %v; want box used by s1", list, err)
	}
	if err := e.RemoveImage(ctx, "box"); !errors.Is(err, api.ErrImageInUse) {
		t.Errorf("remove while s1 runs: %v; want in use", err)
	}
	// A session that named the image by its path (--rootfs) uses it too.
	e.mu.Lock()
	delete(e.sessions, "s1")
	e.sessions["byPath"] = &liveSession{rec: SessionRecord{Sandbox: true, Request: api.CreateRequest{Rootfs: real}}}
	e.mu.Unlock()
	if err := e.RemoveImage(ctx, "box"); err == nil || !strings.Contains(err.Error(), "used by session byPath") {
		t.Errorf("remove while a --rootfs session runs from it: %v", err)
	}
	e.mu.Lock()
	delete(e.sessions, "byPath")
	e.mu.Unlock()

	// Unused: removed; a create that resolved it before the removal fails
	// at its claim, and a new one is refused naming the image.
	if err := e.RemoveImage(ctx, "box"); err != nil {
		t.Fatalf("remove of an unused image: %v", err)
	}
	if entries, _ := os.ReadDir(e.images.Dir); len(entries) != 0 {
		t.Errorf("store holds %d entries after remove; want none", len(entries))
	}
	if err := e.claimRootfs("s2", real); err == nil || !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), "removed while the session was being created") {
		t.Errorf("claim after the removal: %v; want refused", err)
	}
	req = api.CreateRequest{Name: "s3", Image: "box"}
	if err := e.validateRequest(&req); err == nil || err.Error() != `image "box": unknown image (import it with: enforcerd image import box FILE)` || !errors.Is(err, api.ErrBadRequest) {
		t.Errorf("create from a removed image: %v", err)
	}
	if err := e.RemoveImage(ctx, "box"); !errors.Is(err, api.ErrUnknownImage) {
		t.Errorf("remove twice: %v; want unknown image", err)
	}
}

// TestValidateRequestImageExclusive: image excludes rootfs, network_only
// and attach mode, each refusal one line naming the image.
func TestValidateRequestImageExclusive(t *testing.T) {
	e := imageDaemon(t)
	for _, tc := range []struct {
		req  api.CreateRequest
		want string
	}{
		{api.CreateRequest{Name: "s1", Image: "box", Rootfs: "/x"}, `image "box": want exactly one of --rootfs DIR, --image NAME or --network-only`},
		{api.CreateRequest{Name: "s1", Image: "box", NetworkOnly: true}, `image "box": want exactly one of --rootfs DIR, --image NAME or --network-only`},
		{api.CreateRequest{Name: "s1", Image: "box", NetnsPath: "/run/netns/x"}, `netns_path "/run/netns/x": a session attached to a netns has no sandbox; leave out rootfs and image`},
		{api.CreateRequest{Name: "s1", Image: "Box"}, `image name "Box": want 1 to 63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit (e.g. python-3.12-slim)`},
	} {
		req := tc.req
		if err := e.validateRequest(&req); err == nil || err.Error() != tc.want || !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("%+v: %v; want a bad request %q", tc.req, err, tc.want)
		}
	}
}
