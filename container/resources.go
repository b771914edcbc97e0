package container

import (
	"fmt"
	"math"
	"runtime"
)

// Smallest limits a sandbox may be given: below them its init and a shell
// do not start, and the failure would come from the kernel mid-create.
const (
	MinMemoryBytes = 4 << 20
	MinPidsMax     = 4
)

// CheckResources checks a sandbox's limits (Spec.MemoryBytes, PidsMax,
// CPUs) without a kernel: each 0 (its default) or at least its minimum,
// and the CPUs at most this process's CPU count (more would be no limit
// at all). It is the one rule: Manager.Create applies it, and the daemon
// calls it before it builds a session's network, so a bad limit is
// refused before anything is made, with the same text.
func CheckResources(memoryBytes, pidsMax int64, cpus float64) error {
	return checkResources(memoryBytes, pidsMax, cpus, runtime.NumCPU())
}

func checkResources(memoryBytes, pidsMax int64, cpus float64, machine int) error {
	if memoryBytes < 0 || (memoryBytes > 0 && memoryBytes < MinMemoryBytes) {
		return fmt.Errorf("memory %d bytes: want at least %d MiB (%d bytes), or 0 for the default %d MiB",
			memoryBytes, MinMemoryBytes>>20, MinMemoryBytes, DefaultMemoryBytes>>20)
	}
	if pidsMax < 0 || (pidsMax > 0 && pidsMax < MinPidsMax) {
		return fmt.Errorf("pids %d: want at least %d, or 0 for the default %d", pidsMax, MinPidsMax, DefaultPidsMax)
	}
	if cpus != 0 && (math.IsNaN(cpus) || math.IsInf(cpus, 0) || cpus < 0.01 || cpus > float64(machine)) {
		return fmt.Errorf("cpus %v: want 0.01 to %d (the CPUs of this machine), or 0 for the default %v", cpus, machine, DefaultCPUs)
	}
	return nil
}
