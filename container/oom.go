package container

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// OOMError is the error of an Exec whose command the kernel killed because
// the sandbox reached its memory limit: the leader died of SIGKILL while
// the cgroup's count of OOM kills grew. Exec returns it with the status
// 137 (128 + SIGKILL), which the command really ended with.
type OOMError struct {
	Command string
	Sandbox string
	Limit   int64 // the cgroup's memory limit in bytes; 0 when unknown
}

func (e *OOMError) Error() string {
	limit := ""
	if e.Limit > 0 {
		limit = fmt.Sprintf(", %d MiB", e.Limit>>20)
	}
	return fmt.Sprintf("exec %q in %s: killed by the kernel: out of memory (the sandbox's memory limit%s)", e.Command, e.Sandbox, limit)
}

// memoryDir is the sandbox's memory cgroup directory ("" when unknown).
func (m *Manager) memoryDir(box *sandbox) string {
	paths := m.cgroupPaths(box.l.id)
	if d := paths["memory"]; d != "" {
		return d
	}
	return paths[""]
}

// oomKills is the number of processes the kernel killed in the sandbox's
// memory cgroup for want of memory (-1 when unknown): "oom_kill N" in
// memory.events (cgroup v2) or memory.oom_control (v1).
func oomKills(dir string) int64 {
	if dir == "" {
		return -1
	}
	for _, f := range []string{"memory.events", "memory.oom_control"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return n
				}
			}
		}
	}
	return -1
}

// memoryLimit is the memory cgroup's limit in bytes (0 when unknown).
func memoryLimit(dir string) int64 {
	for _, f := range []string{"memory.max", "memory.limit_in_bytes"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return n
		}
	}
	return 0
}
