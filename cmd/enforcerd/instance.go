package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/api"
)

// instanceDir holds one record per running daemon, each locked (flock) by
// its daemon for as long as it lives: a record nobody holds is stale (its
// daemon died, even by kill -9, and the kernel dropped the lock).
const instanceDir = "/run/enforcerd/instances"

// instanceRecord is what a running daemon claims. Daemons conflict only
// within one network namespace (NetNS), where they would share interfaces,
// addresses and the table's name space.
type instanceRecord struct {
	PID      int    `json:"pid"`
	NetNS    string `json:"netns"`
	Prefix   string `json:"prefix"`
	Pool     string `json:"pool"`
	Socket   string `json:"socket"`
	StateDir string `json:"state_dir"`
}

// instance holds a running daemon's claims; the locks last until the
// process exits.
type instance struct {
	files []*os.File
}

// claimInstance makes sure no other daemon serves what cfg would, before
// anything in the kernel is touched: it takes the state dir's lock, then,
// under the registry's lock, compares cfg with every live daemon of this
// network namespace (same prefix or one extending the other, overlapping
// pools, same socket or state dir) and registers cfg. A refusal is one line
// naming the conflict and the other daemon's pid, and changes nothing.
func claimInstance(cfg ServeConfig) (*instance, error) {
	st, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	inst := &instance{files: []*os.File{st}}
	if err := inst.register(cfg, instanceDir); err != nil {
		inst.release()
		return nil, err
	}
	return inst, nil
}

func (i *instance) release() {
	for _, f := range i.files {
		f.Close()
	}
	i.files = nil
}

// stateLockName is the lock file in the state dir.
const stateLockName = "lock"

// lockStateDir takes the exclusive lock of dir (creating dir 0700 and the
// lock file) and writes this process's pid into the file.
func lockStateDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, stateLockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock state dir: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, api.Classify(fmt.Errorf("state dir %s is in use by enforcerd pid %s; stop it first (one daemon per state dir)", dir, readPID(path)), api.ErrOtherDaemon)
		}
		return nil, fmt.Errorf("lock state dir %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// stateDirHeld reports the pid holding dir's lock, or "" when nobody does.
func stateDirHeld(dir string) string {
	path := filepath.Join(dir, stateLockName)
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return readPID(path)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return ""
}

func readPID(path string) string {
	b, _ := os.ReadFile(path)
	if p := strings.TrimSpace(string(b)); p != "" {
		return p
	}
	return "unknown"
}

// ownNetNS names this process's network namespace ("net:[inode]").
func ownNetNS() (string, error) {
	l, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return "", fmt.Errorf("read own netns: %w", err)
	}
	return l, nil
}

// register checks cfg against the live daemons recorded in dir and adds
// cfg's record, holding its lock.
func (i *instance) register(cfg ServeConfig, dir string) error {
	ns, err := ownNetNS()
	if err != nil {
		return err
	}
	reg, err := lockRegistry(dir)
	if err != nil {
		return err
	}
	defer reg.Close() // releases the registry lock once registered
	me := instanceRecord{PID: os.Getpid(), NetNS: ns, Prefix: cfg.NamePrefix, Pool: cfg.Pool.String(),
		Socket: cfg.Socket, StateDir: cfg.StateDir}
	others, err := liveInstances(dir)
	if err != nil {
		return err
	}
	for _, o := range others {
		if why := conflict(me, o); why != "" {
			return api.Classify(fmt.Errorf("another enforcerd (pid %d, state dir %s) runs in this network namespace: %s; stop it or choose another --name-prefix and --pool", o.PID, o.StateDir, why), api.ErrOtherDaemon)
		}
	}
	path := filepath.Join(dir, strings.NewReplacer(":", "-", "[", "", "]", "").Replace(ns)+"-"+me.Prefix+".json")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("instance record: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("instance record %s is held by another process: %w", path, err)
	}
	b, _ := json.Marshal(me)
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt(append(b, '\n'), 0)
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("write instance record: %w", err)
	}
	i.files = append(i.files, f)
	return nil
}

// registryLockName is the registry's own lock file in its directory.
const registryLockName = ".lock"

// lockRegistry takes the registry's own lock (creating dir), under which
// records are checked, added and removed; closing the file releases it.
// releaseRegistry removes the registry under this lock, unlinking the lock
// file first: a lock taken on a file no longer linked at dir/.lock is
// dropped and taken again on the new one, so no two processes ever both
// hold "the" lock, and a record is never written into a removed directory.
func lockRegistry(dir string) (*os.File, error) {
	path := filepath.Join(dir, registryLockName)
	for {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("instance registry %s: %w", dir, err)
		}
		reg, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("instance registry: %w", err)
		}
		if err := unix.Flock(int(reg.Fd()), unix.LOCK_EX); err != nil {
			reg.Close()
			return nil, fmt.Errorf("lock instance registry: %w", err)
		}
		held, err1 := reg.Stat()
		linked, err2 := os.Stat(path)
		if err1 == nil && err2 == nil && os.SameFile(held, linked) {
			return reg, nil
		}
		reg.Close() // removed while we waited: start over
	}
}

// releaseRegistry is `enforcerd reap`'s share of the run directory (dir is
// the registry, instanceDir; its parent /run/enforcerd). Under the
// registry's lock it drops every stale record (liveInstances does), removes
// the API socket named by a stale record of prefix in this network
// namespace when nothing listens on it (a daemon killed by SIGKILL leaves
// it; systemd's socket, which listens, stays), and when no daemon is
// registered any more, removes the registry (its lock file first, see
// lockRegistry) and the run directory if nothing else is in it. It returns
// the paths it removed.
func releaseRegistry(dir, prefix string) ([]string, error) {
	ns, err := ownNetNS()
	if err != nil {
		return nil, err
	}
	reg, err := lockRegistry(dir)
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	var removed, sockets []string
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list instance registry %s: %w", dir, err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var r instanceRecord
		if unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) == nil && json.NewDecoder(f).Decode(&r) == nil &&
			r.NetNS == ns && r.Prefix == prefix {
			sockets = append(sockets, r.Socket)
			removed = append(removed, f.Name())
		}
		f.Close()
	}
	live, err := liveInstances(dir) // removes the stale records
	if err != nil {
		return nil, err
	}
	for _, s := range sockets {
		if staleSocket(s) && os.Remove(s) == nil {
			removed = append(removed, s)
		}
	}
	if len(live) > 0 {
		return removed, nil
	}
	var errs []error
	for _, p := range []string{filepath.Join(dir, registryLockName), dir, filepath.Dir(dir)} {
		err := os.Remove(p)
		switch {
		case err == nil:
			removed = append(removed, p)
		case errors.Is(err, os.ErrNotExist):
		case errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST):
			return removed, nil // something not ours is in it: it stays
		default:
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}

// staleSocket reports whether path is a unix socket nothing listens on.
func staleSocket(path string) bool {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket {
		return false
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return false
	}
	return errors.Is(err, unix.ECONNREFUSED)
}

// liveInstances returns the records of dir whose daemon still holds them;
// stale ones are removed. The caller holds the registry lock.
func liveInstances(dir string) ([]instanceRecord, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list instance registry %s: %w", dir, err)
	}
	var out []instanceRecord
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err == nil {
			os.Remove(path) // nobody holds it: its daemon is gone
			f.Close()
			continue
		}
		var r instanceRecord
		if err := json.NewDecoder(f).Decode(&r); err == nil {
			out = append(out, r)
		}
		f.Close()
	}
	return out, nil
}

// conflict says why two daemons cannot run side by side, or "".
func conflict(me, o instanceRecord) string {
	switch {
	case me.StateDir == o.StateDir:
		return "it uses the state dir " + o.StateDir
	case me.Socket == o.Socket:
		return "it serves the socket " + o.Socket
	case me.NetNS != o.NetNS:
		return ""
	case me.Prefix == o.Prefix:
		return fmt.Sprintf("it uses the name prefix %q", o.Prefix)
	case strings.HasPrefix(me.Prefix, o.Prefix) || strings.HasPrefix(o.Prefix, me.Prefix):
		return fmt.Sprintf("the name prefixes %q and %q extend each other (the table matches interfaces by prefix)", me.Prefix, o.Prefix)
	}
	mine, err1 := netip.ParsePrefix(me.Pool)
	theirs, err2 := netip.ParsePrefix(o.Pool)
	if err1 == nil && err2 == nil && mine.Overlaps(theirs) {
		return fmt.Sprintf("its pool %s overlaps the pool %s (and holds its DNS anycast address)", theirs, mine)
	}
	return ""
}

// liveInstanceFor returns a live daemon of this network namespace that
// serves prefix or stateDir, for reap.
func liveInstanceFor(prefix, stateDir string) (instanceRecord, bool) {
	ns, err := ownNetNS()
	if err != nil {
		return instanceRecord{}, false
	}
	reg, err := lockRegistry(instanceDir)
	if err != nil {
		return instanceRecord{}, false
	}
	defer reg.Close()
	others, err := liveInstances(instanceDir)
	if err != nil {
		return instanceRecord{}, false
	}
	for _, o := range others {
		if o.StateDir == stateDir || (o.NetNS == ns && o.Prefix == prefix) {
			return o, true
		}
	}
	return instanceRecord{}, false
}
