package gctune

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"
)

// DefaultHeapFloor is the garbage the collector lets the daemon's heap
// gather before a cycle, however small its live heap (32 MiB).
//
// Without it a daemon with few sessions has a live heap of a few MiB, and
// the collector's goal (twice the live heap) is met after a few MiB of
// allocation: under a DNS flood (each answer allocates a few KiB) it ran
// tens of cycles a second, and the proxy answered about 15 % fewer
// queries than with the floor (docs/benchmarks.md, "What moved since the
// 17:33 run").
const DefaultHeapFloor = 32 << 20

// heapFloor holds the floor SetHeapFloor set; gen tells a finalizer armed
// for an earlier floor to stop.
var heapFloor struct {
	mu   sync.Mutex
	n    uint64
	base int // the GOGC percent to keep when the live heap is large
	gen  uint64
}

// SetHeapFloor lets the heap gather at least n bytes of garbage before the
// collector runs: the GC percent is raised, after every cycle, to what
// puts the next goal n bytes above the live heap, and never below the
// process's own GOGC (default 100). It costs what it allows, up to n bytes
// more resident memory, and nothing while the heap is large. n <= 0
// restores the GOGC percent. GOGC=off is left alone.
func SetHeapFloor(n int) {
	heapFloor.mu.Lock()
	heapFloor.gen++
	gen := heapFloor.gen
	if heapFloor.base == 0 {
		heapFloor.base = gogcPercent()
	}
	heapFloor.n = uint64(max(n, 0))
	base, floor := heapFloor.base, heapFloor.n
	heapFloor.mu.Unlock()
	if base < 0 {
		return
	}
	if floor == 0 {
		debug.SetGCPercent(base)
		return
	}
	runtime.GC() // the live heap, measured, not guessed
	tuneHeapFloor(gen)
	armHeapFloor(gen)
}

// gogcPercent is the process's GOGC setting (-1 for off).
func gogcPercent() int {
	switch v := os.Getenv("GOGC"); {
	case v == "":
		return 100
	case v == "off":
		return -1
	default:
		if p, err := strconv.Atoi(v); err == nil && p > 0 {
			return p
		}
		return 100
	}
}

// liveHeapSample reads the heap the last cycle found live.
var liveHeapSample = []metrics.Sample{{Name: "/gc/heap/live:bytes"}}

// tuneHeapFloor sets the GC percent for the floor of generation gen,
// unless a later SetHeapFloor replaced it.
func tuneHeapFloor(gen uint64) bool {
	heapFloor.mu.Lock()
	defer heapFloor.mu.Unlock()
	if gen != heapFloor.gen || heapFloor.n == 0 {
		return false
	}
	metrics.Read(liveHeapSample)
	live := float64(1 << 20) // at least 1 MiB
	if s := liveHeapSample[0]; s.Value.Kind() == metrics.KindUint64 {
		live = max(live, float64(s.Value.Uint64()))
	}
	debug.SetGCPercent(floorPercent(live, float64(heapFloor.n), heapFloor.base))
	return true
}

// runtimeHeapMinimum is the Go runtime's smallest heap goal at GOGC=100
// (defaultHeapMinimum); it scales with the percent.
const runtimeHeapMinimum = 4 << 20

// floorPercent is the GC percent whose next goal is about live+floor: the
// goal is live plus percent of live, and at least runtimeHeapMinimum times
// percent/100, which for a tiny live heap would overshoot, so the percent
// is capped where that minimum reaches live+floor. Never below base.
func floorPercent(live, floor float64, base int) int {
	p := min(floor*100/live, (live+floor)*100/runtimeHeapMinimum)
	return max(base, min(int(math.Ceil(p)), 1<<20))
}

// heapFloorSentinel is garbage whose finalizer runs once after each cycle.
type heapFloorSentinel struct{ _ [16]byte }

// armHeapFloor re-tunes after the next cycle, and so on after every cycle,
// while generation gen is the floor in force.
func armHeapFloor(gen uint64) {
	s := new(heapFloorSentinel)
	runtime.SetFinalizer(s, func(*heapFloorSentinel) {
		if tuneHeapFloor(gen) {
			armHeapFloor(gen)
		}
	})
}
