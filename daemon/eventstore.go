package daemon

// The events' persistence: one NDJSON file per session name under
// <state-dir>/events/<name>.ndjson, one api.Event per line.
//
// Every event is written with one write(2) as it is recorded, without
// fsync: a daemon that is killed (kill -9, a crash) loses no event, since
// the kernel holds what was written; a machine that goes down (power, a
// kernel crash) can lose what the kernel had not yet written back, at
// most the last few seconds (a file is synced when its session is removed
// and when it is rotated). A torn last line is skipped when read.
//
// A file that would grow past maxBytes is renamed to <name>.ndjson.1
// (replacing the one before) and started anew, so a name keeps at most
// twice maxBytes. A removed session's files stay for the retention after
// their last event, readable through GET /v1/sessions/{name}/events, and
// are pruned at start and every pruneInterval.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// defaultEventFileBytes is where a session's event file is rotated.
const defaultEventFileBytes = 1 << 20

const (
	eventFileExt     = ".ndjson"
	eventRotatedExt  = ".ndjson.1"
	maxPruneInterval = time.Hour
	minPruneInterval = time.Minute
)

// pruneInterval is how often removed sessions' files are pruned: a tenth
// of the retention, within a minute and an hour.
func pruneInterval(retention time.Duration) time.Duration {
	return min(max(retention/10, minPruneInterval), maxPruneInterval)
}

// eventStore writes and reads the event files. Its methods are called
// under EventLog.mu. files holds the open files of the sessions with a
// ring; a name without one is opened, appended to and closed per event.
type eventStore struct {
	dir       string
	maxBytes  int64
	retention time.Duration
	log       *slog.Logger
	now       func() time.Time
	files     map[string]*eventFile
	failing   map[string]bool // names whose last write failed (logged once)
}

type eventFile struct {
	f    *os.File
	size int64
}

func openEventStore(dir string, opts EventStoreOptions) (*eventStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create events directory %s: %w", dir, err)
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = defaultEventFileBytes
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &eventStore{dir: dir, maxBytes: opts.MaxBytes, retention: opts.Retention, log: opts.Log,
		now: time.Now, files: map[string]*eventFile{}, failing: map[string]bool{}}, nil
}

func (s *eventStore) path(name string) string { return filepath.Join(s.dir, name+eventFileExt) }

func (s *eventStore) openFile(name string) (*eventFile, error) {
	f, err := os.OpenFile(s.path(name), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &eventFile{f: f, size: fi.Size()}, nil
}

// appendLocked writes ev to its session's file; keepOpen keeps the file
// open for the next (the session has a ring). A name that is not a
// session name has no file. A failure is logged once per name until a
// write succeeds again; the event still reaches the ring and followers.
//
// A refused call on a name that has neither a session nor a file (a
// create that failed validation, an rm of an unknown name) is not written:
// any caller could otherwise make a file per name it invents. It still
// reaches the journal and the followers of every session's events.
func (s *eventStore) appendLocked(ev api.Event, keepOpen bool) {
	name := ev.Session
	if !sessionNameValid(name) {
		return
	}
	if !keepOpen && s.files[name] == nil && ev.Detail["outcome"] == "error" {
		if _, err := os.Stat(s.path(name)); errors.Is(err, os.ErrNotExist) {
			return
		}
	}
	if err := s.write(name, ev, keepOpen); err != nil {
		if !s.failing[name] {
			s.log.Error("persist event (it is kept in memory only)", "session", name, "kind", ev.Kind, "action", ev.Action, "err", err)
		}
		s.failing[name] = true
		return
	}
	delete(s.failing, name)
}

func (s *eventStore) write(name string, ev api.Event, keepOpen bool) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(ev); err != nil {
		return err
	}
	ef := s.files[name]
	if ef == nil {
		var err error
		if ef, err = s.openFile(name); err != nil {
			return err
		}
	}
	if ef.size > 0 && ef.size+int64(buf.Len()) > s.maxBytes {
		// Rotate: the full file becomes .1 (replacing the one before).
		_ = ef.f.Sync()
		ef.f.Close()
		delete(s.files, name)
		if err := os.Rename(s.path(name), filepath.Join(s.dir, name+eventRotatedExt)); err != nil {
			return fmt.Errorf("rotate %s: %w", s.path(name), err)
		}
		var err error
		if ef, err = s.openFile(name); err != nil {
			return err
		}
	}
	if keepOpen {
		s.files[name] = ef
	} else {
		defer ef.f.Close()
	}
	n, err := ef.f.Write(buf.Bytes())
	ef.size += int64(n)
	return err
}

// readLocked returns a name's stored events, oldest first, and whether it
// has any file. Lines that do not decode (a line torn by a machine crash)
// are skipped.
func (s *eventStore) readLocked(name string) ([]api.Event, bool) {
	if !sessionNameValid(name) {
		return nil, false
	}
	var (
		out   []api.Event
		found bool
	)
	for _, p := range []string{filepath.Join(s.dir, name+eventRotatedExt), s.path(name)} {
		f, err := os.Open(p)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				s.log.Warn("read stored events", "file", p, "err", err)
			}
			continue
		}
		found = true
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			var ev api.Event
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Session == name {
				out = append(out, ev)
			}
		}
		if err := sc.Err(); err != nil {
			s.log.Warn("read stored events", "file", p, "err", err)
		}
		f.Close()
	}
	if found && out == nil {
		out = []api.Event{}
	}
	return out, found
}

// closeLocked syncs and closes a name's open file; with no retention its
// files go at once.
func (s *eventStore) closeLocked(name string) {
	if ef := s.files[name]; ef != nil {
		_ = ef.f.Sync()
		ef.f.Close()
		delete(s.files, name)
	}
	if s.retention <= 0 && sessionNameValid(name) {
		s.removeLocked(name)
	}
}

func (s *eventStore) removeLocked(name string) {
	for _, p := range []string{s.path(name), filepath.Join(s.dir, name+eventRotatedExt)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("remove stored events", "file", p, "err", err)
		}
	}
}

func (s *eventStore) closeAllLocked() {
	for name, ef := range s.files {
		_ = ef.f.Sync()
		ef.f.Close()
		delete(s.files, name)
	}
}

// pruneLocked removes the files of the names that are not live whose
// newest file was last written more than the retention ago.
func (s *eventStore) pruneLocked(live func(string) bool) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		s.log.Warn("prune stored events", "dir", s.dir, "err", err)
		return
	}
	newest := map[string]time.Time{}
	for _, ent := range ents {
		name, ok := strings.CutSuffix(ent.Name(), eventRotatedExt)
		if !ok {
			name, ok = strings.CutSuffix(ent.Name(), eventFileExt)
		}
		if !ok || !sessionNameValid(name) || live(name) {
			continue
		}
		fi, err := ent.Info()
		if err != nil {
			continue
		}
		if fi.ModTime().After(newest[name]) {
			newest[name] = fi.ModTime()
		}
	}
	cutoff := s.now().Add(-s.retention)
	for name, t := range newest {
		if t.Before(cutoff) {
			s.removeLocked(name)
			s.log.Info("pruned the stored events of a removed session", "session", name, "last_event", t.UTC().Format(time.RFC3339))
		}
	}
}
