package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// onJournalStream reports whether f is the stream systemd connected to the
// journal: JOURNAL_STREAM names its device and inode ("DEV:INODE"), and a
// process must compare them with its own stderr, since a child started
// with other output inherits the variable. Only a line written to that
// stream has its "<N>" prefix read by journald.
func onJournalStream(getenv func(string) string, f *os.File) bool {
	want := getenv("JOURNAL_STREAM")
	if want == "" || f == nil {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return want == fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// errorLine is the one line an exiting command prints for its error: a
// JSON log record at level ERROR when the daemon logs JSON (a log shipper
// reading the daemon's stderr then sees no stray text line), the plain
// text otherwise; and, on the journal stream, with err's priority prefix
// so `journalctl -p err` shows why a start failed.
func errorLine(msg string, asJSON, journal bool, now func() time.Time) string {
	line := msg + "\n"
	if asJSON {
		var b bytes.Buffer
		r := slog.NewRecord(now(), slog.LevelError, msg, 0)
		if err := slog.NewJSONHandler(&b, nil).Handle(context.Background(), r); err == nil {
			line = b.String()
		}
	}
	if journal {
		line = journalPriority(slog.LevelError) + line
	}
	return line
}

// journalHandler prefixes every record with its syslog priority, "<N>", the
// way journald reads a service's stdout and stderr (SyslogLevelPrefix=,
// on by default): `journalctl -p err` then shows errors, and warnings are
// warnings, instead of every line being "info".
type journalHandler struct {
	mu    *sync.Mutex // shared by every handler derived from one writer
	out   io.Writer
	inner slog.Handler
}

// newJournalHandler wraps a handler that writes to out (which must be the
// same writer) so its lines carry priority prefixes.
func newJournalHandler(out io.Writer, inner slog.Handler) *journalHandler {
	return &journalHandler{mu: &sync.Mutex{}, out: out, inner: inner}
}

// journalPriority maps a level to syslog's: err 3, warning 4, info 6, debug 7.
func journalPriority(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "<3>"
	case l >= slog.LevelWarn:
		return "<4>"
	case l >= slog.LevelInfo:
		return "<6>"
	}
	return "<7>"
}

func (h *journalHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *journalHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := io.WriteString(h.out, journalPriority(r.Level)); err != nil {
		return err
	}
	return h.inner.Handle(ctx, r)
}

func (h *journalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &journalHandler{mu: h.mu, out: h.out, inner: h.inner.WithAttrs(as)}
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	return &journalHandler{mu: h.mu, out: h.out, inner: h.inner.WithGroup(name)}
}
