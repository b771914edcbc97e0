package main

import (
	"context"
	"io"
	"log/slog"

	"github.com/sirupsen/logrus"
)

// libcontainer logs through logrus' standard logger: its own warnings (cgroups, keyrings,
// signals) and the lines its init process sends up the log pipe (logs.ForwardLogs). Left
// alone, logrus writes them to stderr as text, among the daemon's JSON lines. routeLogrus
// hands every entry to log instead, as one record of the daemon's own format with
// source=libcontainer and the entry's fields, and writes nothing itself. Its level follows
// log's: debug lines (libcontainer then also asks its init for them) only when log takes
// debug records.
func routeLogrus(log *slog.Logger) {
	level := logrus.InfoLevel
	if log.Enabled(context.Background(), slog.LevelDebug) {
		level = logrus.DebugLevel
	}
	logrus.SetLevel(level)
	logrus.SetOutput(io.Discard)
	logrus.SetFormatter(silentFormatter{})
	logrus.StandardLogger().ReplaceHooks(logrus.LevelHooks{})
	logrus.AddHook(slogHook{log})
}

// slogHook passes logrus entries to an slog.Logger.
type slogHook struct{ log *slog.Logger }

func (slogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h slogHook) Fire(e *logrus.Entry) error {
	attrs := make([]slog.Attr, 0, len(e.Data)+1)
	attrs = append(attrs, slog.String("source", "libcontainer"))
	for k, v := range e.Data {
		attrs = append(attrs, slog.Any(k, v))
	}
	ctx := e.Context
	if ctx == nil {
		ctx = context.Background()
	}
	h.log.LogAttrs(ctx, slogLevel(e.Level), e.Message, attrs...)
	return nil
}

// slogLevel maps logrus' levels onto slog's (panic and fatal are errors: libcontainer's init
// reports its fatal errors as Run's error, not as a log line).
func slogLevel(l logrus.Level) slog.Level {
	switch {
	case l <= logrus.ErrorLevel:
		return slog.LevelError
	case l == logrus.WarnLevel:
		return slog.LevelWarn
	case l == logrus.InfoLevel:
		return slog.LevelInfo
	default:
		return slog.LevelDebug
	}
}

// silentFormatter formats nothing: the hook has the entry already.
type silentFormatter struct{}

func (silentFormatter) Format(*logrus.Entry) ([]byte, error) { return nil, nil }
