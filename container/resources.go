package container

import (
	"fmt"
	"runtime"

	"github.com/enforcerd/enforcerd/container/rules"
)

// CheckResources checks a sandbox's limits (Spec.MemoryBytes, PidsMax,
// CPUs) without a kernel: each 0 (left out: its default) or at least its
// minimum, and the CPUs at most this process's CPU count. It is the one
// rule: Manager.Create applies it, and the daemon calls it before it
// builds a session's network, so a bad limit is refused before anything
// is made, with the same text; the command line says the same *Want text.
func CheckResources(memoryBytes, pidsMax int64, cpus float64) error {
	return checkResources(memoryBytes, pidsMax, cpus, runtime.NumCPU())
}

func checkResources(memoryBytes, pidsMax int64, cpus float64, machine int) error {
	if memoryBytes < 0 || (memoryBytes > 0 && memoryBytes < rules.MinMemoryBytes) {
		return fmt.Errorf("memory %d bytes: %s", memoryBytes, rules.MemoryWant())
	}
	if pidsMax < 0 || (pidsMax > 0 && pidsMax < rules.MinPidsMax) {
		return fmt.Errorf("pids %d: %s", pidsMax, rules.PidsWant())
	}
	if cpus != 0 && !rules.CPUsInRange(cpus, machine) {
		return fmt.Errorf("cpus %v: %s", cpus, rules.CPUsWant(machine))
	}
	return nil
}
