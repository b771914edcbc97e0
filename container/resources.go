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
	MinCPUs        = 0.01 // one CFS quota of 1 ms per 100 ms period
)

// MemoryWant, PidsWant and CPUsWant say what each limit accepts, in the one
// wording every layer uses: the daemon's refusal of an API field
// ("cpus 0.001: " + CPUsWant) and the command line's refusal of a flag
// (`invalid value "0" for flag --cpus: ` + CPUsWant). A limit left out is
// the default; in the API's JSON a 0 is a field left out, on the command
// line a 0 is refused (no flag takes 0 for "the default").
func MemoryWant() string {
	return fmt.Sprintf("want at least %d MiB (%d bytes); leave it out for the default %d MiB",
		MinMemoryBytes>>20, MinMemoryBytes, DefaultMemoryBytes>>20)
}

// PidsWant: see MemoryWant.
func PidsWant() string {
	return fmt.Sprintf("want at least %d; leave it out for the default %d", MinPidsMax, DefaultPidsMax)
}

// CPUsWant: see MemoryWant. machine is the CPU count of the machine that
// judges (more CPUs than it has would be no limit at all).
func CPUsWant(machine int) string {
	return fmt.Sprintf("want %v to %d (the CPUs of this machine); leave it out for the default %v", MinCPUs, machine, DefaultCPUs)
}

// CPUsInRange reports whether a given number of CPUs (0 is not "left
// out" here) is a limit this machine can apply.
func CPUsInRange(cpus float64, machine int) bool {
	return !math.IsNaN(cpus) && !math.IsInf(cpus, 0) && cpus >= MinCPUs && cpus <= float64(machine)
}

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
	if memoryBytes < 0 || (memoryBytes > 0 && memoryBytes < MinMemoryBytes) {
		return fmt.Errorf("memory %d bytes: %s", memoryBytes, MemoryWant())
	}
	if pidsMax < 0 || (pidsMax > 0 && pidsMax < MinPidsMax) {
		return fmt.Errorf("pids %d: %s", pidsMax, PidsWant())
	}
	if cpus != 0 && !CPUsInRange(cpus, machine) {
		return fmt.Errorf("cpus %v: %s", cpus, CPUsWant(machine))
	}
	return nil
}
