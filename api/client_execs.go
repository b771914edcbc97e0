package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// DefaultReconnect is how long Exec and Attach keep trying to resume a
// stream the daemon cut (a restart) before they give up.
const DefaultReconnect = 60 * time.Second

// ExecOptions tune Exec and Attach.
type ExecOptions struct {
	// Started, when set, is called with the exec's ID as soon as the
	// daemon has started it (before any output).
	Started func(id string)
	// Reconnect bounds the retries of a cut stream: 0 is DefaultReconnect,
	// a negative value never retries.
	Reconnect time.Duration
}

// Exec runs a command and copies its streamed output to stdout and
// stderr. It returns the command's exit status, or an *ExecError when the
// daemon ended the stream with an error frame (timeout: ExitTimeout).
//
// The command runs in a holder process of its own, so it survives a
// restart of the daemon; when the stream breaks Exec reconnects and
// resumes right after the last frame it wrote, so stdout and stderr get
// every byte once. Ending ctx stops the copy, not the command (KillExec
// kills it).
func (c *Client) Exec(ctx context.Context, name string, req ExecRequest, stdout, stderr io.Writer) (int, error) {
	return c.ExecWith(ctx, name, req, stdout, stderr, ExecOptions{})
}

// ExecWith is Exec with options.
func (c *Client) ExecWith(ctx context.Context, name string, req ExecRequest, stdout, stderr io.Writer, opts ExecOptions) (int, error) {
	req.Detach = false
	resp, err := c.request(ctx, http.MethodPost, sessionPath(name, "exec"), req)
	if err != nil {
		return 0, err
	}
	dec := json.NewDecoder(resp.Body)
	var first ExecFrame
	if err := dec.Decode(&first); err != nil || first.ExecID == "" {
		resp.Body.Close()
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if err == nil && IsExecFrameEnd(first) {
			return execEnd(first)
		}
		return 0, fmt.Errorf("read exec stream: no exec id: %v", err)
	}
	if opts.Started != nil {
		opts.Started(first.ExecID)
	}
	s := &execStream{c: c, name: name, id: first.ExecID, stdout: stdout, stderr: stderr}
	return s.run(ctx, dec, resp.Body, opts.Reconnect)
}

// Attach copies the output of a running or ended exec from offset on (0:
// from its start) and returns its exit status as Exec does, resuming the
// same way when the daemon restarts.
func (c *Client) Attach(ctx context.Context, name, id string, offset int64, stdout, stderr io.Writer, opts ExecOptions) (int, error) {
	s := &execStream{c: c, name: name, id: id, off: offset, stdout: stdout, stderr: stderr}
	return s.run(ctx, nil, nil, opts.Reconnect)
}

// Logs copies the output an exec has recorded so far and returns its
// status when it has ended (ended false: it still runs).
func (c *Client) Logs(ctx context.Context, name, id string, stdout, stderr io.Writer) (exit int, ended bool, err error) {
	s := &execStream{c: c, name: name, id: id, stdout: stdout, stderr: stderr}
	resp, err := c.request(ctx, http.MethodGet, s.outputPath(false), nil)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	exit, ended, err = s.copyFrames(json.NewDecoder(resp.Body))
	if errors.Is(err, errStreamCut) {
		return 0, false, nil // the recorded output ends here: the exec runs
	}
	return exit, ended, err
}

// ExecDetach starts a command and returns at once with its ExecInfo.
func (c *Client) ExecDetach(ctx context.Context, name string, req ExecRequest) (ExecInfo, error) {
	req.Detach = true
	var info ExecInfo
	err := c.call(ctx, http.MethodPost, sessionPath(name, "exec"), req, &info)
	return info, err
}

// Execs lists a session's execs.
func (c *Client) Execs(ctx context.Context, name string) ([]ExecInfo, error) {
	var out []ExecInfo
	err := c.call(ctx, http.MethodGet, sessionPath(name, "execs"), nil, &out)
	return out, err
}

// InspectExec is one exec of a session.
func (c *Client) InspectExec(ctx context.Context, name, id string) (ExecInfo, error) {
	var info ExecInfo
	err := c.call(ctx, http.MethodGet, sessionPath(name, "execs", url.PathEscape(id)), nil, &info)
	return info, err
}

// KillExec kills a running exec's process group; it returns the exec
// once ended.
func (c *Client) KillExec(ctx context.Context, name, id string) (ExecInfo, error) {
	var info ExecInfo
	err := c.call(ctx, http.MethodDelete, sessionPath(name, "execs", url.PathEscape(id)), nil, &info)
	return info, err
}

// execStream copies one exec's frames, remembering the offset of the last
// frame written so that a resumed stream starts right after it.
type execStream struct {
	c              *Client
	name, id       string
	off            int64
	stdout, stderr io.Writer
}

func (s *execStream) outputPath(follow bool) string {
	q := url.Values{"offset": {fmt.Sprint(s.off)}}
	if follow {
		q.Set("follow", "1")
	}
	return sessionPath(s.name, "execs", url.PathEscape(s.id), "output") + "?" + q.Encode()
}

// run copies frames from dec (nil: open the output route first) until the
// last frame, reconnecting for up to reconnect after each cut.
func (s *execStream) run(ctx context.Context, dec *json.Decoder, body io.ReadCloser, reconnect time.Duration) (int, error) {
	if reconnect == 0 {
		reconnect = DefaultReconnect
	}
	cutAt := time.Now()
	backoff := 50 * time.Millisecond
	var lastErr error
	for {
		if dec == nil {
			resp, err := s.c.request(ctx, http.MethodGet, s.outputPath(true), nil)
			if err != nil {
				if ctx.Err() != nil {
					return 0, ctx.Err()
				}
				var ae *Error
				if errors.As(err, &ae) && ae.Status != http.StatusServiceUnavailable {
					return 0, err // the daemon answered: a refusal, not a restart
				}
				lastErr = err
				if reconnect < 0 || time.Since(cutAt) > reconnect {
					return 0, s.gaveUp(reconnect, lastErr)
				}
				select {
				case <-ctx.Done():
					return 0, ctx.Err()
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			body, dec = resp.Body, json.NewDecoder(resp.Body)
		}
		exit, ended, err := s.copyFrames(dec)
		body.Close()
		dec = nil
		if ended {
			return exit, err
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if !errors.Is(err, errStreamCut) {
			return 0, err
		}
		lastErr = errStreamCut
		if reconnect < 0 {
			return 0, s.gaveUp(reconnect, lastErr)
		}
		cutAt, backoff = time.Now(), 50*time.Millisecond
	}
}

func (s *execStream) gaveUp(reconnect time.Duration, err error) error {
	if reconnect < 0 {
		return fmt.Errorf("exec %s: %w; it may still run: enforcerd session logs %s %s", s.id, err, s.name, s.id)
	}
	return fmt.Errorf("exec %s: stream cut and not resumed within %s (%v); it may still run: enforcerd session logs %s %s",
		s.id, reconnect, err, s.name, s.id)
}

// copyFrames writes output frames until the last frame (ended, with its
// status) or the stream's end (errStreamCut).
func (s *execStream) copyFrames(dec *json.Decoder) (exit int, ended bool, err error) {
	for {
		var f ExecFrame
		if err := dec.Decode(&f); err != nil {
			return 0, false, errStreamCut // EOF, or a frame cut in the middle: resume before it
		}
		if IsExecFrameEnd(f) {
			exit, err := execEnd(f)
			return exit, true, err
		}
		if f.ExecID != "" && f.Stream == "" {
			continue
		}
		data := []byte(f.Data)
		if f.DataB64 != "" {
			if data, err = base64.StdEncoding.DecodeString(f.DataB64); err != nil {
				return 0, true, fmt.Errorf("read exec stream: bad data_b64: %w", err)
			}
		}
		w := s.stdout
		if f.Stream == "stderr" {
			w = s.stderr
		}
		if _, err := w.Write(data); err != nil {
			return 0, true, fmt.Errorf("write %s: %w", f.Stream, err)
		}
		s.off = f.Offset
	}
}

// execEnd is the status and error of a stream's last frame.
func execEnd(f ExecFrame) (int, error) {
	if f.Error != "" {
		exit := ExitEnforcerd
		if f.Exit != nil {
			exit = *f.Exit
		}
		return exit, &ExecError{Message: f.Error, Exit: exit}
	}
	return *f.Exit, nil
}
