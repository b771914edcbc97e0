package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultSocket is where the daemon listens unless configured otherwise.
const DefaultSocket = "/run/enforcerd/enforcerd.sock"

// Client speaks the /v1 API over the daemon's unix socket. It is safe for
// concurrent use.
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client of the daemon listening on socket ("" is
// DefaultSocket). Requests have no overall timeout (exec and events
// stream; give the context one); the dial has one.
func NewClient(socket string) *Client {
	if socket == "" {
		socket = DefaultSocket
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			d := net.Dialer{Timeout: 5 * time.Second}
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns:       4,
		IdleConnTimeout:    30 * time.Second,
		DisableCompression: true,
	}
	return &Client{socket: socket, http: &http.Client{Transport: tr}}
}

// Error is a refusal reported by the daemon: its HTTP status, its
// one-line message and its code ({"error": "...", "code": "..."}).
// errors.Is finds the sentinel the code stands for (ErrStaleGeneration
// for "stale_generation", and so on); a daemon older than the codes sends
// none, and then the sentinel is that of the status (409: ErrNameTaken).
type Error struct {
	Status  int
	Message string
	Code    string // one of Codes, or "" from an older daemon
}

func (e *Error) Error() string { return e.Message }

// Unwrap is the sentinel of the code, else of the status, if any.
func (e *Error) Unwrap() error { return sentinelOf(e.Code, e.Status) }

// ExecError is an error frame ending an exec stream: the command did not
// end by itself (Exit is ExitTimeout) or enforcerd failed (ExitEnforcerd),
// or it never started (ExitNotFound, ExitNotExec).
type ExecError struct {
	Message string
	Exit    int
}

func (e *ExecError) Error() string { return e.Message }

// Unwrap is ErrExecTimeout for a timeout.
func (e *ExecError) Unwrap() error {
	if e.Exit == ExitTimeout {
		return ErrExecTimeout
	}
	return nil
}

// request sends one request; a non-2xx response becomes an *Error.
// The caller closes the returned body.
func (c *Client) request(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://enforcerd"+path, rd)
	if err != nil {
		return nil, fmt.Errorf("build request %s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return c.do(ctx, req)
}

// do sends a built request; a non-2xx response becomes an *Error. The
// caller closes the returned body.
func (c *Client) do(ctx context.Context, req *http.Request) (*http.Response, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("cannot reach enforcerd at %s: %v (is the daemon running? set --socket or ENFORCERD_SOCKET)", c.socket, unwrapURLError(err))
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeAPIError(resp)
	}
	return resp, nil
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func decodeAPIError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e ErrorBody
	if json.Unmarshal(data, &e) == nil && e.Error != "" {
		return &Error{Status: resp.StatusCode, Message: e.Error, Code: e.Code}
	}
	msg := strings.TrimSpace(string(data))
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	return &Error{Status: resp.StatusCode, Message: fmt.Sprintf("daemon answered %d: %s", resp.StatusCode, msg)}
}

// call sends a request and decodes a JSON response into out (if non-nil).
func (c *Client) call(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.request(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeJSON(resp, out)
}

// decodeJSON decodes a response's JSON body into out (if non-nil).
func decodeJSON(resp *http.Response, out any) error {
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode response of %s %s: %w", resp.Request.Method, resp.Request.URL.Path, err)
	}
	return nil
}

func sessionPath(name string, tail ...string) string {
	p := Prefix + "/sessions/" + url.PathEscape(name)
	for _, t := range tail {
		p += "/" + t
	}
	return p
}

func labelQuery(key, value string) string {
	if key == "" {
		return ""
	}
	return "?" + url.Values{"label": {key + "=" + value}}.Encode()
}

// Create creates a session.
func (c *Client) Create(ctx context.Context, req CreateRequest) (SessionInfo, error) {
	var info SessionInfo
	err := c.call(ctx, http.MethodPost, Prefix+"/sessions", req, &info)
	return info, err
}

// List returns the sessions, only those carrying the label when key is set.
func (c *Client) List(ctx context.Context, key, value string) ([]SessionInfo, error) {
	var out []SessionInfo
	err := c.call(ctx, http.MethodGet, Prefix+"/sessions"+labelQuery(key, value), nil, &out)
	return out, err
}

// Inspect returns one session with its attested set and counters.
func (c *Client) Inspect(ctx context.Context, name string) (SessionInfo, error) {
	var info SessionInfo
	err := c.call(ctx, http.MethodGet, sessionPath(name), nil, &info)
	return info, err
}

// Remove deletes one session.
func (c *Client) Remove(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, sessionPath(name), nil, nil)
}

// AttachmentRef names an attachment: the container and its interface,
// as a session made with netns_path records them (ContainerID, IfName).
type AttachmentRef struct {
	ContainerID string
	IfName      string
}

// RemoveAttachment deletes one session if it is at's: one request, no
// inspect before (what enforcerd-cni's DEL sends). A session of that name
// that is another attachment's is left alone: an error wrapping
// ErrNameTaken.
func (c *Client) RemoveAttachment(ctx context.Context, name string, at AttachmentRef) error {
	q := url.Values{"container_id": {at.ContainerID}, "ifname": {at.IfName}}
	return c.call(ctx, http.MethodDelete, sessionPath(name)+"?"+q.Encode(), nil, nil)
}

// RemoveByLabel deletes every session carrying the label and returns
// their names (those deleted before a failure, with the error).
func (c *Client) RemoveByLabel(ctx context.Context, key, value string) ([]string, error) {
	var out DeleteResponse
	err := c.call(ctx, http.MethodDelete, Prefix+"/sessions"+labelQuery(key, value), nil, &out)
	return out.Deleted, err
}

// Healthz is nil when the daemon enforces what it says; an unhealthy
// daemon's error wraps ErrUnavailable.
func (c *Client) Healthz(ctx context.Context) error {
	err := c.call(ctx, http.MethodGet, Prefix+"/healthz", nil, nil)
	var ae *Error
	if errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// Ready is nil once the daemon has reconciled and serves.
func (c *Client) Ready(ctx context.Context) error {
	return c.call(ctx, http.MethodGet, Prefix+"/readyz", nil, nil)
}

// Version is the daemon's version and API version.
func (c *Client) Version(ctx context.Context) (VersionInfo, error) {
	var v VersionInfo
	err := c.call(ctx, http.MethodGet, Prefix+"/version", nil, &v)
	return v, err
}
