package cli

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// OnJournalStream reports whether f is the stream systemd connected to the
// journal: JOURNAL_STREAM names its device and inode ("DEV:INODE"), and a
// process must compare them with its own stderr, since a child started
// with other output inherits the variable. Only a line written to that
// stream has its "<N>" prefix read by journald.
func OnJournalStream(getenv func(string) string, f *os.File) bool {
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
		line = JournalPriority(slog.LevelError) + line
	}
	return line
}

// JournalPriority maps a level to syslog's: err 3, warning 4, info 6, debug 7.
func JournalPriority(l slog.Level) string {
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
