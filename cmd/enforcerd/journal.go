package main

import (
	"context"
	"io"
	"log/slog"
	"sync"

	"github.com/enforcerd/enforcerd/internal/cli"
)

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

func (h *journalHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *journalHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := io.WriteString(h.out, cli.JournalPriority(r.Level)); err != nil {
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
