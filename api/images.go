package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"time"
)

// ImageInfo is an image of the daemon's image store, as GET /v1/images lists it and
// POST /v1/images/{name} returns it.
type ImageInfo struct {
	Name     string    `json:"name"`
	Digest   string    `json:"digest"` // the image manifest's digest
	Format   string    `json:"format"` // docker-archive or oci-archive
	Source   string    `json:"source"` // the file the importer named
	Imported time.Time `json:"imported"`
	Layers   int       `json:"layers"`
	// SizeBytes counts the regular files' content unpacked.
	SizeBytes int64 `json:"size_bytes"`
	// SkippedDevices counts the device nodes the import skipped.
	SkippedDevices int `json:"skipped_devices,omitempty"`
	// Rootfs is the unpacked root filesystem (what a session created with
	// the image mounts as its lower layer).
	Rootfs string `json:"rootfs"`
	// UsedBy names the sessions whose sandbox runs from the image (none: [];
	// the image can be removed).
	UsedBy []string `json:"used_by"`
	// From the image's config, for the operator: a session does not apply them.
	Architecture string   `json:"architecture,omitempty"`
	Env          []string `json:"env,omitempty"`
	WorkingDir   string   `json:"working_dir,omitempty"`
	Entrypoint   []string `json:"entrypoint,omitempty"`
	Cmd          []string `json:"cmd,omitempty"`
	User         string   `json:"user,omitempty"`
}

// ImageEngine is the part of the Engine that keeps the image store.
type ImageEngine interface {
	// ImportImage unpacks the archive (a docker save archive or a tar of
	// an OCI image layout) as the image name; source names the file.
	ImportImage(ctx context.Context, name, source string, archive io.Reader) (ImageInfo, error)
	ListImages() ([]ImageInfo, error)
	// RemoveImage removes an image no session uses (else ErrImageInUse).
	RemoveImage(ctx context.Context, name string) error
}

// ErrUnknownImage: no image of that name (404). ErrImageInUse: a session
// runs from the image (409).
var (
	ErrUnknownImage = errors.New("unknown image")
	ErrImageInUse   = errors.New("image in use")
)

func imagePath(name string) string { return Prefix + "/images/" + url.PathEscape(name) }

// ---- handler --------------------------------------------------------------

func (a *server) imageList(w http.ResponseWriter, r *http.Request) {
	list, err := a.e.ListImages()
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if list == nil {
		list = []ImageInfo{}
	}
	writeJSONStatus(w, http.StatusOK, list)
}

// imageImport reads the archive from the body, whatever its content type
// (no JSON body limit: the store bounds what an import may write).
func (a *server) imageImport(w http.ResponseWriter, r *http.Request) {
	info, err := a.e.ImportImage(r.Context(), r.PathValue("name"), r.URL.Query().Get("source"), r.Body)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSONStatus(w, http.StatusCreated, info)
}

func (a *server) imageRemove(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := a.e.RemoveImage(r.Context(), name); err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSONStatus(w, http.StatusOK, DeleteResponse{Deleted: []string{name}})
}

// ---- client ---------------------------------------------------------------

// ImportImage sends the archive read from r to the daemon, which unpacks it
// as the image name; source (a file name) is kept in the image's metadata.
func (c *Client) ImportImage(ctx context.Context, name, source string, r io.Reader) (ImageInfo, error) {
	var info ImageInfo
	path := imagePath(name)
	if source != "" {
		path += "?" + url.Values{"source": {source}}.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://enforcerd"+path, r)
	if err != nil {
		return info, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.do(ctx, req)
	if err != nil {
		return info, err
	}
	defer resp.Body.Close()
	return info, decodeJSON(resp, &info)
}

// Images lists the daemon's images.
func (c *Client) Images(ctx context.Context) ([]ImageInfo, error) {
	var out []ImageInfo
	err := c.call(ctx, http.MethodGet, Prefix+"/images", nil, &out)
	return out, err
}

// RemoveImage removes an image; a session using it makes it ErrImageInUse
// (409).
func (c *Client) RemoveImage(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, imagePath(name), nil, nil)
}
