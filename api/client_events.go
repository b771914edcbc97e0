package api

// The client of the event streams: a session's (GET
// /v1/sessions/{name}/events) and every session's (GET /v1/events).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// EventsOptions select the events of a stream.
type EventsOptions struct {
	Follow bool      // keep the stream open for new events
	Since  time.Time // leave out events before it; zero: every recorded one
	// LabelKey and LabelValue keep only the sessions carrying the label
	// (AllEvents; "" = every session).
	LabelKey, LabelValue string
}

func (o EventsOptions) query(all bool) string {
	q := url.Values{}
	if o.Follow {
		q.Set("follow", "1")
	}
	if !o.Since.IsZero() {
		q.Set("since", o.Since.UTC().Format(time.RFC3339Nano))
	}
	if all && o.LabelKey != "" {
		q.Set("label", o.LabelKey+"="+o.LabelValue)
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// ErrStreamCut is the error of a follow stream that ended without the
// daemon's end marker: the daemon stopped or died while it was followed.
var ErrStreamCut = errors.New("the event stream ended without its end: the daemon stopped or died")

// EventsTo copies a session's NDJSON events to w, line by line as they
// come, until the daemon ends the stream (at once without follow) or ctx
// ends (nil). A follow stream ends normally with its end marker (not
// copied) when the session is removed; one cut before (the daemon went)
// is ErrStreamCut.
func (c *Client) EventsTo(ctx context.Context, name string, opts EventsOptions, w io.Writer) error {
	return c.eventLines(ctx, sessionPath(name, "events")+opts.query(false), opts.Follow, w, nil)
}

// AllEventsTo is EventsTo for every session's events (GET /v1/events):
// a follow stream of them ends only with ctx, or cut with ErrStreamCut.
func (c *Client) AllEventsTo(ctx context.Context, opts EventsOptions, w io.Writer) error {
	return c.eventLines(ctx, Prefix+"/events"+opts.query(true), opts.Follow, w, nil)
}

// Events calls fn with each of a session's events, decoded, until the
// daemon ends the stream, fn returns an error (returned), or ctx ends
// (nil); a follow stream cut before its end is ErrStreamCut, as in
// EventsTo.
func (c *Client) Events(ctx context.Context, name string, opts EventsOptions, fn func(Event) error) error {
	return c.eventLines(ctx, sessionPath(name, "events")+opts.query(false), opts.Follow, nil, fn)
}

// AllEvents is Events for every session's events.
func (c *Client) AllEvents(ctx context.Context, opts EventsOptions, fn func(Event) error) error {
	return c.eventLines(ctx, Prefix+"/events"+opts.query(true), opts.Follow, nil, fn)
}

// eventLines reads an event stream line by line, copying each line to w
// (when set) and passing it decoded to fn (when set). The end marker of
// a follow stream is neither copied nor passed.
func (c *Client) eventLines(ctx context.Context, path string, follow bool, w io.Writer, fn func(Event) error) error {
	resp, err := c.request(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	for {
		line, rerr := br.ReadBytes('\n')
		if len(line) > 0 && rerr == nil {
			var ev Event
			if err := json.Unmarshal(line, &ev); err != nil {
				return fmt.Errorf("read events: line %.80q: %w", line, err)
			}
			if follow && ev.Kind == EventKindEnd {
				return nil
			}
			if w != nil {
				if _, err := w.Write(line); err != nil {
					return fmt.Errorf("write events: %w", err)
				}
			}
			if fn != nil {
				if err := fn(ev); err != nil {
					return err
				}
			}
			continue
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case follow && (rerr == nil || errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF)):
			return ErrStreamCut
		case errors.Is(rerr, io.EOF) && len(line) == 0:
			return nil
		case rerr == nil || errors.Is(rerr, io.EOF):
			return fmt.Errorf("read events: the stream ended inside a line")
		}
		return fmt.Errorf("read events: %w", rerr)
	}
}
