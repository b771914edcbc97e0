package daemon

// State: one JSON record per session under <state-dir>/sessions/<name>.json,
// written atomically (temp file in the same directory, fsync, rename, fsync
// of the directory), so after a crash a record is either the old or the new
// one, never half of either. The record holds everything needed to re-adopt
// a session after a restart without asking the kernel what it meant.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// stateVersion is the schema version of SessionRecord.
const stateVersion = 1

// SessionRecord is the persisted state of one session: everything the
// engine needs to re-adopt it after a restart. Name is also the file name.
// Request is the create request as accepted, its policy fields as the
// last update left them; the rest are the objects and addresses the engine
// chose. Slot is -1 for a session without a NIC (egress none). Fields are
// only ever added (with omitempty), so older records still load.
type SessionRecord struct {
	Version   int                     `json:"version"`
	Name      string                  `json:"name"`
	Created   time.Time               `json:"created"`
	Request   api.CreateRequest       `json:"request"`
	Slot      int                     `json:"slot"`                 // index of the session's /30 in the pool; -1 = no NIC
	Netns     string                  `json:"netns"`                // named netns, <prefix>-<name>
	NetnsPath string                  `json:"netns_path,omitempty"` // its bind mount
	HostIface string                  `json:"host_iface,omitempty"` // host end of the veth
	Guest     netip.Addr              `json:"guest,omitzero"`       // the sandbox's address
	Gateway   netip.Addr              `json:"gateway,omitzero"`     // the host end's address
	Guest6    netip.Addr              `json:"guest6,omitzero"`      // a dual-stack session's v6 address (--pool6)
	Gateway6  netip.Addr              `json:"gateway6,omitzero"`    // the host end's v6 address
	Pinned    map[string][]netip.Addr `json:"pinned,omitempty"`     // --pin: host -> IPv4 addresses
	Sandbox   bool                    `json:"sandbox"`              // a container runs (not --network-only)
	Peers     []PeerRecord            `json:"peers,omitempty"`      // the lab targets this session was peered with at create
	// Generation is the policy's version: 0 or 1 until the first update.
	Generation uint64            `json:"generation,omitempty"`
	Updated    *api.PolicyChange `json:"updated,omitempty"`
	// Pending is written ahead of an update's kernel changes: the policy
	// before it. A restart that finds it re-applies the update (Request
	// and Pinned are already the new policy), so an update interrupted by
	// a crash is complete after the restart.
	Pending *PendingUpdate `json:"pending,omitempty"`
	// Grants are the grants with an end (allow_for) the session was given,
	// ended ones kept: their deadlines survive a restart here.
	Grants []GrantRecord `json:"grants,omitempty"`
}

// PendingUpdate is the policy a session had before an update in progress.
type PendingUpdate struct {
	Request         api.CreateRequest       `json:"request"`
	Pinned          map[string][]netip.Addr `json:"pinned,omitempty"`
	Peers           []PeerRecord            `json:"peers,omitempty"`
	KeepEstablished bool                    `json:"keep_established,omitempty"`
}

// PeerRecord identifies the lab target a session was peered with at
// create: its name, guest address and creation time. A restart restores a
// peering only to that very session, never to a later one that reused the
// name or the address.
type PeerRecord struct {
	Name    string     `json:"name"`
	Guest   netip.Addr `json:"guest"`
	Created time.Time  `json:"created"`
}

// BadRecord is a file in the sessions directory that could not be loaded.
// Name is the session name from the file name ("" when the file name is not
// a session name). A bad *.json record is quarantined (renamed to
// <name>.json.bad, kept for the operator, never loaded again) so its
// session's kernel objects are reaped as orphans.
type BadRecord struct {
	Name string
	Path string
	Err  error
}

// StateStore reads and writes the records in <state-dir>/sessions. The
// engine never writes one session's record concurrently; spare (below)
// has a lock of its own, records of different sessions being written at
// once.
type StateStore struct {
	dir string
	// spare holds the files of removed records, renamed to temp-file
	// names (".spare.tmp-N"): the next Save writes into one (truncated)
	// and renames it into place, instead of making a new file. A file
	// made and one removed per session cost an inode allocation and
	// free, which on a file system that skips recently freed inodes (ext4
	// without a journal reads each one's inode block) grows with the
	// churn: 0.2-0.5 ms of an API create on the bench machine. A start
	// (LoadAll) removes the spares as it removes every temp file.
	spareMu sync.Mutex
	spare   []string
	spareN  int
}

// spareRecordPrefix starts a spare's file name: a temp file's name, which
// LoadAll removes.
const spareRecordPrefix = ".spare.tmp-"

// maxSpareRecords bounds the spare files kept: a churn of more sessions
// than this at once makes new files for the rest.
const maxSpareRecords = 256

// NewStateStore creates <stateDir>/sessions (0700) if missing.
func NewStateStore(stateDir string) (*StateStore, error) {
	dir := filepath.Join(stateDir, "sessions")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", dir, err)
	}
	return &StateStore{dir: dir}, nil
}

// Dir is the sessions directory.
func (s *StateStore) Dir() string { return s.dir }

func (s *StateStore) path(name string) string { return filepath.Join(s.dir, name+".json") }

// sessionNameValid is nsmgr's rule for a session name, which is also the
// record's file name.
func sessionNameValid(name string) bool { return nsmgr.ValidateSessionName(name) == nil }

func (s *StateStore) Save(rec SessionRecord) error {
	if !sessionNameValid(rec.Name) {
		return fmt.Errorf("save state of session %q: invalid name", rec.Name)
	}
	if rec.Version == 0 {
		rec.Version = stateVersion
	}
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return fmt.Errorf("save state of session %s: %w", rec.Name, err)
	}
	data = append(data, '\n')
	if tmp := s.takeSpare(); tmp != "" {
		err = writeFileVia(tmp, s.path(rec.Name), data, 0o600)
		if err == nil {
			return nil
		}
		os.Remove(tmp) // and a new file, below
	}
	if err := writeFileAtomic(s.path(rec.Name), data, 0o600); err != nil {
		return fmt.Errorf("save state of session %s: %w", rec.Name, err)
	}
	return nil
}

// takeSpare returns a spare file's path, or "" when there is none.
func (s *StateStore) takeSpare() string {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	n := len(s.spare)
	if n == 0 {
		return ""
	}
	tmp := s.spare[n-1]
	s.spare = s.spare[:n-1]
	return tmp
}

// writeFileVia is writeFileAtomic through tmp, an existing file of path's
// directory (a spare): truncated, written, given mode and renamed over
// path. A daemon killed before the rename leaves path as it was and tmp
// a temp file, which the next start removes.
func writeFileVia(tmp, path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// writeFileAtomic writes data to path via a temp file in the same
// directory, renamed into place: a reader, and a daemon killed at any point
// (kill -9, a crash), sees the old record or the new one, never a mix.
//
// Nothing is fsync'd, on purpose: a record describes kernel objects (a
// netns bind mount under /run, veths, set elements) that do not outlive
// the kernel. What a killed daemon wrote is in the page cache and read back
// by the next start; a machine that goes down loses those objects with
// whatever record the disk had not yet written, and a record left torn or
// empty by it fails to load and is quarantined (BadRecord) while reconcile
// finds nothing of it to adopt. Two fsyncs per write were most of a
// create's record cost (~0.5 ms on a VM's disk) and bought nothing.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	dir, base := filepath.Split(path)
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	ok = true
	return nil
}

// Load reads one record; a missing one is an error wrapping os.ErrNotExist.
func (s *StateStore) Load(name string) (SessionRecord, error) {
	if !sessionNameValid(name) {
		return SessionRecord{}, fmt.Errorf("load state of session %q: invalid name", name)
	}
	return s.load(name, s.path(name))
}

func (s *StateStore) load(name, path string) (SessionRecord, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return SessionRecord{}, fmt.Errorf("load state of session %s: %w", name, err)
	}
	var rec SessionRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return SessionRecord{}, fmt.Errorf("load state of session %s: %w", name, err)
	}
	switch {
	case rec.Version != stateVersion:
		return SessionRecord{}, fmt.Errorf("load state of session %s: schema version %d, want %d", name, rec.Version, stateVersion)
	case rec.Name != name:
		return SessionRecord{}, fmt.Errorf("load state of session %s: record names %q", name, rec.Name)
	}
	return rec, nil
}

// LoadAll loads every record, sorted by name; records that cannot be
// loaded are quarantined (see BadRecord) and skipped. The error is only for
// an unreadable directory. It removes temp files a crash left behind, so
// call it at start-up before any Save.
func (s *StateStore) LoadAll() ([]SessionRecord, error) {
	recs, _, err := s.LoadAllReport()
	return recs, err
}

// LoadAllReport is LoadAll that also returns what it quarantined or could
// not read, for one log line each.
func (s *StateStore) LoadAllReport() (recs []SessionRecord, bad []BadRecord, err error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("read state directory %s: %w", s.dir, err)
	}
	for _, e := range entries {
		fn := e.Name()
		path := filepath.Join(s.dir, fn)
		if strings.HasPrefix(fn, ".") && strings.Contains(fn, ".tmp-") {
			_ = os.Remove(path) // an interrupted Save: the rename never happened
			continue
		}
		if strings.HasSuffix(fn, ".json.bad") {
			continue // quarantined earlier
		}
		name, isJSON := strings.CutSuffix(fn, ".json")
		if !isJSON || !sessionNameValid(name) || !e.Type().IsRegular() {
			bad = append(bad, BadRecord{Path: path, Err: fmt.Errorf("state directory %s: unexpected entry %q", s.dir, fn)})
			continue
		}
		rec, err := s.load(name, path)
		if err != nil {
			if qerr := os.Rename(path, path+".bad"); qerr == nil {
				path += ".bad"
			} else {
				err = errors.Join(err, fmt.Errorf("quarantine: %w", qerr))
			}
			bad = append(bad, BadRecord{Name: name, Path: path, Err: err})
			continue
		}
		recs = append(recs, rec)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Name < recs[j].Name })
	return recs, bad, nil
}

// Remove deletes a session's record; a missing record is success.
func (s *StateStore) Remove(name string) error {
	if !sessionNameValid(name) {
		return fmt.Errorf("remove state of session %q: invalid name", name)
	}
	if s.keepSpare(s.path(name)) {
		return nil
	}
	return s.removePath(s.path(name))
}

// keepSpare renames a removed record to a spare's name, if fewer than
// maxSpareRecords are kept, and reports whether it did (a missing record
// is not kept: it is removed already).
func (s *StateStore) keepSpare(path string) bool {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if len(s.spare) >= maxSpareRecords {
		return false
	}
	s.spareN++
	tmp := filepath.Join(s.dir, spareRecordPrefix+strconv.Itoa(s.spareN))
	if err := os.Rename(path, tmp); err != nil {
		return false // removed by removePath (which reports what is wrong)
	}
	s.spare = append(s.spare, tmp)
	return true
}

// RemoveAll deletes every file of the sessions directory: records,
// quarantined records and temp files (for reap). Missing is success.
func (s *StateStore) RemoveAll() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("read state directory %s: %w", s.dir, err)
	}
	var errs []error
	for _, e := range entries {
		if e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(s.dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove state file %s: %w", e.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// RemovePath deletes a file of the sessions directory by path (for bad
// records, whose names may not be session names); missing is success.
func (s *StateStore) RemovePath(path string) error {
	if filepath.Dir(path) != filepath.Clean(s.dir) {
		return fmt.Errorf("remove state file %s: not in %s", path, s.dir)
	}
	return s.removePath(path)
}

func (s *StateStore) removePath(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove state file %s: %w", path, err)
	}
	// Not fsync'd, as writeFileAtomic: a removal a machine crash undoes
	// leaves a record whose kernel objects are gone too; the next start
	// removes it.
	return nil
}
