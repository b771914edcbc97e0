package apitest

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// ImportImage keeps the image's name and size: an archive whose bytes
// start with "bad" is refused as a bad request; a name taken is ErrNameTaken.
func (f *Engine) ImportImage(ctx context.Context, name, source string, archive io.Reader) (api.ImageInfo, error) {
	data, err := io.ReadAll(archive)
	if err != nil {
		return api.ImageInfo{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.HasPrefix(string(data), "bad") {
		return api.ImageInfo{}, fmt.Errorf("image %q: %s: not a tar archive: %w", name, source, api.ErrBadRequest)
	}
	if f.images == nil {
		f.images = map[string]api.ImageInfo{}
	}
	if _, ok := f.images[name]; ok {
		return api.ImageInfo{}, fmt.Errorf("image %q: image name taken: %w", name, api.ErrNameTaken)
	}
	info := api.ImageInfo{
		Name: name, Digest: "sha256:" + strings.Repeat("0", 64), Format: "docker-archive", Source: source,
		Imported: time.Date(2025, 1, 2, 3, 0, 0, 0, time.UTC), Layers: 1, SizeBytes: int64(len(data)),
		Rootfs: "/var/lib/enforcerd/images/" + name + "/rootfs", UsedBy: []string{},
	}
	f.images[name] = info
	return info, nil
}

// ListImages lists the imported images; a session whose rootfs is an
// image's uses it.
func (f *Engine) ListImages() ([]api.ImageInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []api.ImageInfo{}
	for _, im := range f.images {
		im.UsedBy = f.imageUsersLocked(im)
		out = append(out, im)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (f *Engine) imageUsersLocked(im api.ImageInfo) []string {
	users := []string{}
	for _, s := range f.sessions {
		if s.Image == im.Name || s.Rootfs == im.Rootfs {
			users = append(users, s.Name)
		}
	}
	sort.Strings(users)
	return users
}

// RemoveImage refuses an image a session uses (ErrImageInUse).
func (f *Engine) RemoveImage(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	im, ok := f.images[name]
	if !ok {
		return fmt.Errorf("image %q: %w", name, api.ErrUnknownImage)
	}
	if users := f.imageUsersLocked(im); len(users) > 0 {
		return fmt.Errorf("image %q: used by session %s; remove it first: %w", name, strings.Join(users, ", "), api.ErrImageInUse)
	}
	delete(f.images, name)
	return nil
}
