package main

import (
	"bytes"
	"context"
	"encoding/base64"
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

// client speaks the /v1 API over the daemon's unix socket.
type client struct {
	socket string
	http   *http.Client
}

// newClient returns a client of the daemon listening on socket. Requests
// have no overall timeout (exec and events stream); the dial has one.
func newClient(socket string) *client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			d := net.Dialer{Timeout: 5 * time.Second}
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns:       4,
		IdleConnTimeout:    30 * time.Second,
		DisableCompression: true,
	}
	return &client{socket: socket, http: &http.Client{Transport: tr}}
}

// apiError is a refusal reported by the daemon: its status and its
// one-line {"error": "..."} message.
type apiError struct {
	Status  int
	Message string
}

func (e *apiError) Error() string { return e.Message }

// execFrameError is an error frame ending an exec stream; exit is the
// status the CLI exits with (124 timeout, 125 enforcerd failure).
type execFrameError struct {
	msg  string
	exit int
}

func (e *execFrameError) Error() string { return e.msg }

// execFrame is one NDJSON frame of an exec response. Output is in Data when
// it is valid UTF-8 and in DataB64 otherwise, so that no byte is lost.
type execFrame struct {
	Stream  string `json:"stream,omitempty"` // "stdout" or "stderr"
	Data    string `json:"data,omitempty"`
	DataB64 string `json:"data_b64,omitempty"`
	Exit    *int   `json:"exit,omitempty"`
	Error   string `json:"error,omitempty"`
}

// request sends one request; a non-2xx response becomes an *apiError.
// The caller closes the returned body.
func (c *client) request(ctx context.Context, method, path string, body any) (*http.Response, error) {
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
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(data, &e) == nil && e.Error != "" {
		return &apiError{Status: resp.StatusCode, Message: e.Error}
	}
	msg := strings.TrimSpace(string(data))
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	return &apiError{Status: resp.StatusCode, Message: fmt.Sprintf("daemon answered %d: %s", resp.StatusCode, msg)}
}

// call sends a request and decodes a JSON response into out (if non-nil).
func (c *client) call(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.request(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode response of %s %s: %w", method, path, err)
	}
	return nil
}

func sessionPath(name string, tail ...string) string {
	p := apiPrefix + "/sessions/" + url.PathEscape(name)
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

// deleteResponse is the body of both DELETE routes.
type deleteResponse struct {
	Deleted []string `json:"deleted"`
}

func (c *client) create(ctx context.Context, req CreateRequest) (SessionInfo, error) {
	var info SessionInfo
	err := c.call(ctx, http.MethodPost, apiPrefix+"/sessions", req, &info)
	return info, err
}

func (c *client) list(ctx context.Context, key, value string) ([]SessionInfo, error) {
	var out []SessionInfo
	err := c.call(ctx, http.MethodGet, apiPrefix+"/sessions"+labelQuery(key, value), nil, &out)
	return out, err
}

func (c *client) inspect(ctx context.Context, name string) (SessionInfo, error) {
	var info SessionInfo
	err := c.call(ctx, http.MethodGet, sessionPath(name), nil, &info)
	return info, err
}

func (c *client) remove(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, sessionPath(name), nil, nil)
}

func (c *client) removeByLabel(ctx context.Context, key, value string) ([]string, error) {
	var out deleteResponse
	err := c.call(ctx, http.MethodDelete, apiPrefix+"/sessions"+labelQuery(key, value), nil, &out)
	return out.Deleted, err
}

func (c *client) healthz(ctx context.Context) error {
	return c.call(ctx, http.MethodGet, apiPrefix+"/healthz", nil, nil)
}

// exec runs a command and copies its streamed output to stdout and stderr.
// It returns the command's exit status, or an *execFrameError when the
// daemon ended the stream with an error frame (timeout: exit 124).
func (c *client) exec(ctx context.Context, name string, req ExecRequest, stdout, stderr io.Writer) (int, error) {
	resp, err := c.request(ctx, http.MethodPost, sessionPath(name, "exec"), req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var f execFrame
		if err := dec.Decode(&f); err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				return 0, errors.New("exec stream ended without an exit status")
			}
			return 0, fmt.Errorf("read exec stream: %w", err)
		}
		switch {
		case f.Error != "":
			exit := exitEnforcerd
			if f.Exit != nil {
				exit = *f.Exit
			}
			return exit, &execFrameError{msg: f.Error, exit: exit}
		case f.Exit != nil:
			return *f.Exit, nil
		}
		data := []byte(f.Data)
		if f.DataB64 != "" {
			if data, err = base64.StdEncoding.DecodeString(f.DataB64); err != nil {
				return 0, fmt.Errorf("read exec stream: bad data_b64: %w", err)
			}
		}
		w := stdout
		if f.Stream == "stderr" {
			w = stderr
		}
		if _, err := w.Write(data); err != nil {
			return 0, fmt.Errorf("write %s: %w", f.Stream, err)
		}
	}
}

// events copies a session's NDJSON events to w line by line, until the
// daemon ends the stream (immediately without follow).
func (c *client) events(ctx context.Context, name string, follow bool, w io.Writer) error {
	path := sessionPath(name, "events")
	if follow {
		path += "?follow=1"
	}
	resp, err := c.request(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return fmt.Errorf("write events: %w", err)
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read events: %w", rerr)
		}
	}
}
