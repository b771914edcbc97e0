package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/cgroups"
	// Registers the device cgroup managers; without it libcontainer refuses device rules.
	_ "github.com/opencontainers/cgroups/devices"
	"github.com/opencontainers/cgroups/manager"
	"golang.org/x/sys/unix"
)

// cgroupPaths returns the cgroup directories of sandbox id, one per controller (cgroup v1) or
// one (v2), as libcontainer's fs manager computes them: "<prefix>/<id>" relative to this
// process's own cgroup (v1) or its parent (v2).
func cgroupPaths(prefix, id string) (map[string]string, error) {
	cm, err := manager.New(&cgroups.Cgroup{Parent: prefix, Name: id, Resources: &cgroups.Resources{}})
	if err != nil {
		return nil, fmt.Errorf("cgroup paths of %s: %w", id, err)
	}
	return cm.GetPaths(), nil
}

// cgroupParentDirs returns the "<prefix>" directories sandbox cgroups are made in, by
// controller (cgroup v1) or under "" (v2), as cgroupPaths places them. The Manager computes
// them once (New): libcontainer's fs manager finds them by parsing this process's
// /proc/self/cgroup once per controller, which is most of what a sandbox's removal cost, and
// they stay the same while the process keeps its own cgroup.
func cgroupParentDirs(prefix string) (map[string]string, error) {
	paths, err := cgroupPaths(prefix, prefix+"-x")
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(paths))
	for ctrl, p := range paths {
		if p != "" {
			out[ctrl] = filepath.Dir(p)
		}
	}
	return out, nil
}

// childPaths returns the cgroup directories of sandbox id under the parents of cgroupParentDirs:
// what cgroupPaths(prefix, id) returns.
func childPaths(parents map[string]string, id string) map[string]string {
	out := make(map[string]string, len(parents))
	for ctrl, d := range parents {
		out[ctrl] = filepath.Join(d, id)
	}
	return out
}

// removeCgroup kills whatever still runs in the cgroups at paths (one sandbox's, by
// controller) and removes them. Idempotent: missing directories are success. It covers a
// daemon that died between making the cgroup and saving the container's state.
func removeCgroup(id string, paths map[string]string) error {
	var errs []error
	for _, p := range uniquePaths(paths) {
		if err := killCgroup(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := cgroups.RemovePaths(paths); err != nil {
		errs = append(errs, fmt.Errorf("remove cgroup of %s: %w", id, err))
	}
	return errors.Join(errs...)
}

// killCgroup SIGKILLs every process in the cgroup at dir (and below) until it is empty.
func killCgroup(dir string) error {
	for i := range 50 {
		pids, err := cgroups.GetAllPids(dir)
		if errors.Is(err, os.ErrNotExist) || (err == nil && len(pids) == 0) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list processes of cgroup %s: %w", dir, err)
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(time.Duration(i+1) * time.Millisecond)
	}
	return fmt.Errorf("kill processes of cgroup %s: still not empty", dir)
}

// removeCgroupParents removes the "<prefix>" parent directories when no sandbox is left in
// them (libcontainer's Destroy leaves them). A parent still in use is left alone.
func removeCgroupParents(parents map[string]string) error {
	var errs []error
	for _, parent := range uniquePaths(parents) {
		err := unix.Rmdir(parent)
		if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EBUSY) || errors.Is(err, unix.ENOTEMPTY) {
			continue
		}
		errs = append(errs, fmt.Errorf("remove cgroup %s: %w", parent, err))
	}
	return errors.Join(errs...)
}

// cgroupIDs lists the sandbox ids that have a cgroup under the "<prefix>" parents in any
// controller.
func cgroupIDs(prefix string, parents map[string]string) ([]string, error) {
	var ids []string
	for _, parent := range uniquePaths(parents) {
		ents, err := os.ReadDir(parent)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list cgroup %s: %w", parent, err)
		}
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), prefix+"-") {
				ids = append(ids, e.Name())
			}
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// uniquePaths returns the distinct non-empty paths (v1 controllers mounted together share one).
func uniquePaths(paths map[string]string) []string {
	var out []string
	for _, p := range paths {
		if p != "" {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// CgroupParents returns the directories the cgroups of prefix's sandboxes are made in, one per
// controller hierarchy (cgroup v1) or one (v2): "<prefix>" below this process's own cgroup (v1)
// or its parent (v2), as cgroupPaths places them. They need not exist yet.
func CgroupParents(prefix string) ([]string, error) {
	paths, err := cgroupPaths(prefix, prefix+"-x")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range uniquePaths(paths) {
		if d := filepath.Dir(p); !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out, nil
}
