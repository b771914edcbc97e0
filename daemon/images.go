package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/container"

	"github.com/enforcerd/enforcerd/container/rules"
)

// ImageStoreDir is the image store's directory under the state dir
// (/var/lib/enforcerd/images by default). Open makes it and adds it to the
// image directories, so an imported image is always granted.
const ImageStoreDir = "images"

// The daemon is the image store's only writer: imports, removals and the
// creates that resolve an image all pass through it, so "in use" is decided
// under the one lock (mu) that also publishes sessions. A removal checks
// the sessions and the creates in flight (creating) and renames the image
// away under mu; a create records its rootfs in creating under mu and
// checks it still exists. Either the removal comes first and the create
// fails, or the create does and the removal is refused.

var errNoImageStore = errors.New("this daemon has no image store")

// ImportImage unpacks an image archive into the store (container.ImageStore.Import).
func (e *Engine) ImportImage(ctx context.Context, name, source string, archive io.Reader) (api.ImageInfo, error) {
	if e.images == nil {
		return api.ImageInfo{}, errNoImageStore
	}
	if err := rules.ValidateImageName(name); err != nil {
		return api.ImageInfo{}, badRequest(err)
	}
	if len(source) > 256 || strings.ContainsAny(source, "\n\r") {
		return api.ImageInfo{}, badRequest(fmt.Errorf("source %q: want a file name of at most 256 characters on one line", source))
	}
	meta, err := e.images.Import(name, source, archive)
	if err != nil {
		switch {
		case errors.Is(err, container.ErrImageExists):
			err = api.Classify(err, api.ErrNameTaken)
		case ctx.Err() != nil:
			err = fmt.Errorf("%w: %w", err, ctx.Err())
		default:
			// What the archive holds is the caller's: a refused entry, a
			// format not recognised, a limit reached.
			err = badRequest(err)
		}
		e.log.Warn("image import refused", "image", name, "source", source, "caller", callerUID(ctx), "err", err)
		return api.ImageInfo{}, err
	}
	e.log.Info("image imported", "image", name, "source", source, "digest", meta.Digest, "format", meta.Format,
		"layers", meta.Layers, "size_bytes", meta.SizeBytes, "skipped_devices", meta.SkippedDevices, "caller", callerUID(ctx))
	return e.imageInfo(meta, []string{}), nil
}

func callerUID(ctx context.Context) any {
	if c, ok := api.CallerFrom(ctx); ok {
		return c.UID
	}
	return "self"
}

// ListImages lists the store's images with the sessions using each.
func (e *Engine) ListImages() ([]api.ImageInfo, error) {
	if e.images == nil {
		return []api.ImageInfo{}, nil
	}
	metas, err := e.images.List()
	if err != nil {
		return nil, err
	}
	out := make([]api.ImageInfo, 0, len(metas))
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range metas {
		out = append(out, e.imageInfo(m, e.imageUsersLocked(m.Name)))
	}
	return out, nil
}

// RemoveImage removes an image no session uses and no create in flight
// names; the refusal names the sessions.
func (e *Engine) RemoveImage(ctx context.Context, name string) error {
	if e.images == nil {
		return errNoImageStore
	}
	if err := rules.ValidateImageName(name); err != nil {
		return badRequest(err)
	}
	e.mu.Lock()
	users := e.imageUsersLocked(name)
	if len(users) > 0 {
		e.mu.Unlock()
		return fmt.Errorf("image %q: used by session %s; remove the session first: %w", name, strings.Join(users, ", "), api.ErrImageInUse)
	}
	trash, err := e.images.Detach(name)
	e.mu.Unlock()
	if errors.Is(err, container.ErrUnknownImage) {
		return api.Classify(err, api.ErrUnknownImage)
	}
	if err != nil {
		return err
	}
	if err := e.images.Purge(trash); err != nil {
		// The image is out of the store already; the next start removes
		// what is left of it.
		e.log.Error("remove image", "image", name, "err", err)
	}
	e.log.Info("image removed", "image", name, "caller", callerUID(ctx))
	return nil
}

// imageRootfs resolves a create's image to its rootfs (the grant is
// checked after, as for any rootfs).
func (e *Engine) imageRootfs(name string) (string, error) {
	if e.images == nil {
		return "", badRequest(fmt.Errorf("image %q: %w", name, errNoImageStore))
	}
	if _, err := e.images.Get(name); err != nil {
		return "", badRequest(err)
	}
	return e.images.Rootfs(name), nil
}

// imageUsersLocked names the sessions (and creates in flight) whose
// sandbox runs from the image: their rootfs is inside the image's
// directory, however they named it (--image or --rootfs). e.mu held.
func (e *Engine) imageUsersLocked(name string) []string {
	dirs := []string{filepath.Join(e.images.Dir, name)}
	if real, err := filepath.EvalSymlinks(dirs[0]); err == nil && real != dirs[0] {
		dirs = append(dirs, real)
	}
	inside := func(rootfs string) bool {
		for _, d := range dirs {
			if rootfs == d || strings.HasPrefix(rootfs, d+"/") {
				return true
			}
		}
		return false
	}
	users := []string{}
	for n, s := range e.sessions {
		if s.rec.Sandbox && inside(s.rec.Request.Rootfs) {
			users = append(users, n)
		}
	}
	for n, rootfs := range e.creating {
		if inside(rootfs) {
			users = append(users, n)
		}
	}
	sort.Strings(users)
	return users
}

// claimRootfs records a create's rootfs as in use, once it is reserved: a
// removal that came first has taken the image away, and the create fails.
func (e *Engine) claimRootfs(name, rootfs string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := filepath.EvalSymlinks(rootfs); err != nil {
		return badRequest(fmt.Errorf("rootfs %q: removed while the session was being created", rootfs))
	}
	e.creating[name] = rootfs
	return nil
}

func (e *Engine) imageInfo(m container.ImageMeta, users []string) api.ImageInfo {
	return api.ImageInfo{
		Name: m.Name, Digest: m.Digest, Format: m.Format, Source: m.Source, Imported: m.Imported,
		Layers: m.Layers, SizeBytes: m.SizeBytes, SkippedDevices: m.SkippedDevices,
		Rootfs: e.images.Rootfs(m.Name), UsedBy: users,
		Architecture: m.Architecture, Env: m.Env, WorkingDir: m.WorkingDir,
		Entrypoint: m.Entrypoint, Cmd: m.Cmd, User: m.User,
	}
}
