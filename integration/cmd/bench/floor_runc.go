package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/specconv"
)

// sandboxFloor is figure 5's floor (issue 25): libcontainer's own create and
// start, in this process, of the configuration `runc spec` writes (runc's
// default namespaces, mounts, capabilities and cgroup) with the same image
// as a read-only root and a long sleep as the process: what `runc run -d`
// does without runc's process start and its bundle, and what the container
// package does without its overlay, /etc files, seccomp, limits and the
// keeper. No network (the netns is runc's empty one), no policy.
type sandboxFloor struct {
	root   string // libcontainer's state directory
	rootfs string
	prefix string
	live   map[string]*floorBox
}

type floorBox struct {
	c    *libcontainer.Container
	init *libcontainer.Process
}

func newSandboxFloor(tmp, rootfs, prefix string) *sandboxFloor {
	return &sandboxFloor{root: filepath.Join(tmp, prefix+"-state"), rootfs: rootfs, prefix: prefix,
		live: map[string]*floorBox{}}
}

// Run creates and starts container id; it returns once the process runs.
func (f *sandboxFloor) Run(id string) (time.Duration, error) {
	id = f.prefix + "-" + id
	start := time.Now()
	spec := specconv.Example()
	spec.Root.Path, spec.Root.Readonly = f.rootfs, true
	spec.Process.Terminal = false
	spec.Process.Args = []string{"sleep", "1000000"}
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{CgroupName: id, Spec: spec})
	if err != nil {
		return 0, fmt.Errorf("sandbox floor: config: %w", err)
	}
	c, err := libcontainer.Create(f.root, id, cfg)
	if err != nil {
		return 0, fmt.Errorf("sandbox floor: create %s: %w", id, err)
	}
	init := &libcontainer.Process{Args: spec.Process.Args, Env: spec.Process.Env, Cwd: spec.Process.Cwd, Init: true}
	box := &floorBox{c: c, init: init}
	f.live[id] = box
	if err := c.Run(init); err != nil {
		return 0, fmt.Errorf("sandbox floor: start %s: %w", id, err)
	}
	return time.Since(start), nil
}

// Destroy kills container id's process (by the container, never by name)
// and removes its state.
func (f *sandboxFloor) Destroy(id string) (time.Duration, error) {
	id = f.prefix + "-" + id
	box, ok := f.live[id]
	if !ok {
		return 0, fmt.Errorf("sandbox floor: %s: not started", id)
	}
	start := time.Now()
	if err := f.destroy(box); err != nil {
		return 0, fmt.Errorf("sandbox floor: destroy %s: %w", id, err)
	}
	took := time.Since(start)
	delete(f.live, id)
	return took, nil
}

// destroy kills the container's init if it runs (waiting for it only
// when the signal went out: an init that never started has nothing to
// wait for) and removes the container, its cgroup and state.
func (f *sandboxFloor) destroy(b *floorBox) error {
	if st, err := b.c.Status(); err == nil && st != libcontainer.Stopped {
		if err := b.c.Signal(os.Kill); err == nil {
			b.init.Wait()
		}
	}
	return b.c.Destroy()
}

// Close destroys every container still there.
func (f *sandboxFloor) Close() {
	for id, b := range f.live {
		if err := f.destroy(b); err != nil {
			logf("cleanup: sandbox floor %s: %v", id, err)
		}
	}
	os.RemoveAll(f.root)
}
