package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/seccomp"
	"golang.org/x/sys/unix"
)

// destroyWait bounds how long Destroy waits for a killed sandbox's init to be gone.
const destroyWait = 10 * time.Second

// Manager creates, runs commands in and removes the sandboxes of one prefix.
//
// Invariants: every object it makes carries the prefix ("<prefix>-<name>"); a name is created or
// destroyed by one goroutine at a time (names); the daemon waits on every init it started
// (sandbox.initDone) and on every exec, so none is left a zombie.
type Manager struct {
	cfg   Config
	facts hostFacts

	// cgMu orders cgroup creation (read side, in Create) against the removal of the shared
	// "<prefix>" parent directories (write side, in Reap), so a parent is never removed
	// under a sandbox that is making its cgroup in it.
	cgMu sync.RWMutex
	// names serializes Create, Load and Destroy of one name.
	names keyedMutex

	// cgParents are the "<prefix>" cgroup directories sandboxes are made in, by controller,
	// computed once (see cgroupParentDirs).
	cgParents map[string]string

	// keeper is the sandbox pid 1 executable (a sealed memfd, see keeper.go), shared by all.
	keeper *os.File

	mu    sync.Mutex          // guards boxes
	boxes map[string]*sandbox // live sandboxes by session name
}

// sandbox is one live sandbox the Manager knows.
type sandbox struct {
	name string
	l    layout
	c    *libcontainer.Container
	// initDone is closed when the daemon has reaped the sandbox's init; nil for a sandbox
	// adopted after a restart (its init is no longer the daemon's child).
	initDone chan struct{}
	// pidsDir is the sandbox's pids cgroup directory, computed once (Manager.pidsDir).
	pidsOnce sync.Once
	pidsDir  string
}

// New checks cfg and the host, and makes the state and layer directories.
func New(cfg Config) (*Manager, error) {
	if err := validateConfig(cfg); err != nil {
		return nil, err
	}
	if !seccomp.Enabled {
		return nil, errors.New("container: built without seccomp support; build with cgo and -tags seccomp")
	}
	if err := ensurePrivateDirs(cfg); err != nil {
		return nil, err
	}
	// libcontainer wants the rootfs path without symlinks.
	for _, p := range []*string{&cfg.StateDir, &cfg.LayerDir} {
		r, err := filepath.EvalSymlinks(*p)
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", *p, err)
		}
		*p = r
	}
	parents, err := cgroupParentDirs(cfg.Prefix)
	if err != nil {
		return nil, err
	}
	keeper, err := newKeeperFile(runtime.GOARCH)
	if err != nil {
		return nil, err
	}
	return &Manager{cfg: cfg, facts: probeHost(), cgParents: parents, keeper: keeper, boxes: map[string]*sandbox{}}, nil
}

// probeHost measures the facts the config builder needs.
func probeHost() hostFacts {
	if cgroups.IsCgroup2UnifiedMode() {
		return hostFacts{memsw: true} // fs2 tolerates a missing memory.swap.max
	}
	mnt, err := cgroups.FindCgroupMountpoint("", "memory")
	if err != nil {
		return hostFacts{}
	}
	_, err = os.Stat(filepath.Join(mnt, "memory.memsw.limit_in_bytes"))
	return hostFacts{memsw: err == nil}
}

func (m *Manager) layout(name string) layout { return newLayout(m.cfg.LayerDir, m.cfg.Prefix, name) }

// Create makes the sandbox and starts its init, which keeps it up until Destroy. On any error
// it removes everything it made.
func (m *Manager) Create(spec Spec) (err error) {
	if err := validateSpec(spec); err != nil {
		return err
	}
	unlock := m.names.lock(spec.Name)
	defer unlock()
	l := m.layout(spec.Name)
	if m.known(spec.Name) {
		return fmt.Errorf("create sandbox %s: %w", spec.Name, ErrExists)
	}
	if _, err := os.Stat(filepath.Join(m.cfg.StateDir, l.id)); err == nil {
		return fmt.Errorf("create sandbox %s: state %s exists (Load or Destroy it): %w", spec.Name, l.id, ErrExists)
	}
	if _, err := os.Stat(l.dir); err == nil {
		return fmt.Errorf("create sandbox %s: layer dir %s exists (Destroy it): %w", spec.Name, l.dir, ErrExists)
	}
	if spec.NetnsPath != "" {
		if _, err := os.Stat(spec.NetnsPath); err != nil {
			return fmt.Errorf("create sandbox %s: netns: %w", spec.Name, err)
		}
	}
	cfg, err := buildConfig(m.cfg.Prefix, l, spec, m.facts)
	if err != nil {
		return err
	}
	// Again at every create: an operator's chmod since New must not expose this sandbox.
	if err := ensurePrivateDirs(m.cfg); err != nil {
		return fmt.Errorf("create sandbox %s: %w", spec.Name, err)
	}
	if spec.UserNS {
		if err := checkSearchable(m.cfg.LayerDir); err != nil {
			return fmt.Errorf("create sandbox %s: %w", spec.Name, err)
		}
	}
	defer func() {
		if err != nil {
			if rerr := m.destroyLocked(spec.Name); rerr != nil {
				err = fmt.Errorf("%w (rollback: %w)", err, rerr)
			}
		}
	}()
	if err := prepareLayer(spec.Rootfs, l, spec); err != nil {
		return fmt.Errorf("create sandbox %s: %w", spec.Name, err)
	}
	box := &sandbox{name: spec.Name, l: l, initDone: make(chan struct{})}
	m.cgMu.RLock()
	err = m.start(box, cfg)
	m.cgMu.RUnlock()
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", spec.Name, err)
	}
	m.mu.Lock()
	m.boxes[spec.Name] = box
	m.mu.Unlock()
	return nil
}

// start creates the libcontainer container and runs its init (the keeper), and starts the
// goroutine that reaps the init when it dies.
func (m *Manager) start(box *sandbox, cfg *configs.Config) error {
	c, err := libcontainer.Create(m.cfg.StateDir, box.l.id, cfg)
	if err != nil {
		return fmt.Errorf("libcontainer create %s: %w", box.l.id, err)
	}
	box.c = c
	init := &libcontainer.Process{
		Args:       keeperArgs(box.name),
		Env:        []string{},
		ExtraFiles: []*os.File{m.keeper}, // fd 3 (keeperFD) in the init
		Init:       true,
	}
	if err := c.Run(init); err != nil {
		close(box.initDone)
		return fmt.Errorf("start init of %s: %w", box.l.id, err)
	}
	go func() {
		_, _ = init.Wait() // reaps the init: it is the daemon's child (CLONE_PARENT)
		close(box.initDone)
	}()
	return nil
}

// known reports whether name is a live sandbox of this Manager's process.
func (m *Manager) known(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.boxes[name]
	return ok
}

// get returns the live sandbox name, adopting it from disk if this process has not seen it.
func (m *Manager) get(name string) (*sandbox, error) {
	m.mu.Lock()
	box, ok := m.boxes[name]
	m.mu.Unlock()
	if ok {
		return box, nil
	}
	if err := m.Load(name); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if box, ok = m.boxes[name]; !ok {
		return nil, fmt.Errorf("sandbox %s: %w", name, ErrNotFound)
	}
	return box, nil
}

// Load adopts a sandbox a previous daemon created, if its init is still running: a restarted
// daemon calls it for every session it re-adopts (Exec also does it on demand). A sandbox
// whose init is gone is ErrNotFound; Destroy (or Reap) removes its remains.
func (m *Manager) Load(name string) error {
	if !validName(name, maxNameLen, true) {
		return fmt.Errorf("sandbox name %q: %w", name, ErrNotFound)
	}
	unlock := m.names.lock(name)
	defer unlock()
	if m.known(name) {
		return nil
	}
	l := m.layout(name)
	c, err := loadRunning(m.cfg.StateDir, l.id)
	if err != nil {
		return fmt.Errorf("load sandbox %s: %w", name, err)
	}
	m.mu.Lock()
	m.boxes[name] = &sandbox{name: name, l: l, c: c}
	m.mu.Unlock()
	return nil
}

// loadRunning loads container id from the state dir; ErrNotFound unless its init runs.
func loadRunning(stateDir, id string) (*libcontainer.Container, error) {
	c, err := libcontainer.Load(stateDir, id)
	if errors.Is(err, libcontainer.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	st, err := c.Status()
	if err != nil {
		return nil, err
	}
	if st != libcontainer.Running {
		return nil, fmt.Errorf("container %s is %s: %w", id, st, ErrNotFound)
	}
	return c, nil
}

// Exists reports whether a sandbox of that name is up: its init is running, whether this
// process started it or a previous daemon did.
func (m *Manager) Exists(name string) bool {
	if !validName(name, maxNameLen, true) {
		return false
	}
	m.mu.Lock()
	box := m.boxes[name]
	m.mu.Unlock()
	if box != nil && box.initDone != nil {
		select {
		case <-box.initDone:
			return false
		default:
			return true
		}
	}
	if box != nil {
		st, err := box.c.Status()
		return err == nil && st == libcontainer.Running
	}
	_, err := loadRunning(m.cfg.StateDir, m.layout(name).id)
	return err == nil
}

// Close releases what New opened. Sandboxes are not touched: they outlive the Manager.
func (m *Manager) Close() error {
	return m.keeper.Close()
}

// Destroy kills the sandbox and removes its container state, cgroups, overlay mount and layer
// dir. Idempotent: a name with nothing left is success. The shared "<prefix>" cgroup parents
// stay for the next sandbox (making and removing them was nine mkdirs and nine rmdirs of a
// create and destroy on a cgroup v1 host); Reap removes them once empty.
func (m *Manager) Destroy(name string) error {
	if !validName(name, maxNameLen, true) {
		return fmt.Errorf("sandbox name %q: use 1 to %d of [a-z0-9-], starting with a letter or digit", name, maxNameLen)
	}
	unlock := m.names.lock(name)
	defer unlock()
	return m.destroyLocked(name)
}

// destroyLocked is Destroy with the name lock held. Each step runs even when an earlier one
// failed, so a retry has less to do; the errors are joined.
func (m *Manager) destroyLocked(name string) error {
	l := m.layout(name)
	m.mu.Lock()
	box := m.boxes[name]
	m.mu.Unlock()

	var errs []error
	c, initDone := (*libcontainer.Container)(nil), (chan struct{})(nil)
	if box != nil && box.c != nil {
		c, initDone = box.c, box.initDone
	} else {
		lc, err := libcontainer.Load(m.cfg.StateDir, l.id)
		switch {
		case err == nil:
			c = lc
		case errors.Is(err, libcontainer.ErrNotExist):
		default:
			// Unreadable state: the cgroup kill below still stops everything.
			errs = append(errs, fmt.Errorf("load sandbox %s: %w", name, err))
		}
	}
	if c != nil {
		if err := stopInit(c, initDone); err != nil {
			errs = append(errs, fmt.Errorf("stop sandbox %s: %w", name, err))
		} else if err := c.Destroy(); err != nil {
			errs = append(errs, fmt.Errorf("destroy sandbox %s: %w", name, err))
		}
	}
	if err := removeCgroup(l.id, m.cgroupPaths(l.id)); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(filepath.Join(m.cfg.StateDir, l.id)); err != nil {
		errs = append(errs, fmt.Errorf("remove state of %s: %w", name, err))
	}
	if err := removeLayer(l); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		m.mu.Lock()
		delete(m.boxes, name)
		m.mu.Unlock()
	}
	return errors.Join(errs...)
}

// stopInit SIGKILLs the container's init (the kernel then kills the whole pid namespace) and
// waits until it is gone: reaped by the daemon when initDone is set, else no longer running.
func stopInit(c *libcontainer.Container, initDone chan struct{}) error {
	if err := c.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
		return err
	}
	deadline := time.After(destroyWait)
	if initDone != nil {
		select {
		case <-initDone:
			return nil
		case <-deadline:
			return errors.New("init still running after SIGKILL")
		}
	}
	for {
		st, err := c.Status()
		if err != nil {
			return err
		}
		if st == libcontainer.Stopped {
			return nil
		}
		select {
		case <-deadline:
			return errors.New("init still running after SIGKILL")
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// List returns the names of this prefix's sandboxes that have container state (running or
// not), sorted.
func (m *Manager) List() ([]string, error) {
	ents, err := os.ReadDir(m.cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes in %s: %w", m.cfg.StateDir, err)
	}
	var names []string
	for _, e := range ents {
		if n, ok := m.nameOf(e.Name()); ok && e.IsDir() {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names, nil
}

// nameOf returns the session name of an id of this prefix.
func (m *Manager) nameOf(id string) (string, bool) {
	n, ok := strings.CutPrefix(id, m.cfg.Prefix+"-")
	return n, ok && validName(n, maxNameLen, true)
}

// Reap destroys every sandbox of this prefix not in keep: those with container state, and the
// remains of interrupted creates (a layer dir or a cgroup without state). It returns the names
// it removed, sorted; then it removes the "<prefix>" cgroup parents if no sandbox is left in
// them. Call it when no Create of this prefix runs (at daemon start, at teardown).
func (m *Manager) Reap(keep map[string]bool) ([]string, error) {
	found := map[string]bool{}
	names, err := m.List()
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		found[n] = true
	}
	ents, err := os.ReadDir(m.cfg.LayerDir)
	if err != nil {
		return nil, fmt.Errorf("list layer dirs in %s: %w", m.cfg.LayerDir, err)
	}
	for _, e := range ents {
		if n, ok := m.nameOf(e.Name()); ok {
			found[n] = true
		}
	}
	ids, err := cgroupIDs(m.cfg.Prefix, m.cgParents)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if n, ok := m.nameOf(id); ok {
			found[n] = true
		}
	}
	var removed []string
	var errs []error
	for n := range found {
		if keep[n] {
			continue
		}
		if err := m.Destroy(n); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, n)
	}
	slices.Sort(removed)
	m.cgMu.Lock()
	if err := removeCgroupParents(m.cgParents); err != nil {
		errs = append(errs, err)
	}
	m.cgMu.Unlock()
	return removed, errors.Join(errs...)
}

// CgroupPaths returns the sandbox's cgroup directories by controller (v1) or under "" (v2), for
// counters and inspection.
func (m *Manager) CgroupPaths(name string) (map[string]string, error) {
	if !validName(name, maxNameLen, true) {
		return nil, fmt.Errorf("sandbox name %q: %w", name, ErrNotFound)
	}
	return m.cgroupPaths(m.layout(name).id), nil
}

// cgroupPaths returns the cgroup directories of sandbox id by controller (v1) or under "" (v2).
func (m *Manager) cgroupPaths(id string) map[string]string { return childPaths(m.cgParents, id) }

// keyedMutex is a set of mutexes by name, made on demand and dropped when unused.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

func (k *keyedMutex) lock(name string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[name]
	if e == nil {
		e = &keyedEntry{}
		k.m[name] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, name)
		}
		k.mu.Unlock()
	}
}
