package daemon

import "sync"

// DefaultHeapFloor is the heap the garbage collector lets the daemon reach
// before its first cycle, and the headroom it keeps above the live heap
// after that (32 MiB).
//
// Without it a daemon with few sessions has a live heap of a few MiB, and
// the collector's goal (twice the live heap) is met after a few MiB of
// allocation: under a DNS flood (each answer allocates a few KiB) it ran
// tens of cycles a second, and the proxy answered about 15 % fewer
// queries than with the floor (docs/benchmarks.md, "What moved since the
// 17:33 run").
const DefaultHeapFloor = 32 << 20

var (
	floorMu sync.Mutex
	floor   []byte // never read or written: only counted by the collector
)

// SetHeapFloor makes the collector count n bytes of heap that are never
// touched (a ballast): a pointer-free allocation fresh from the OS is
// neither zeroed nor scanned, so it costs address space, not resident
// memory. Garbage may then grow to about n more bytes before a cycle than
// the live heap alone would allow; that, and no more, is what it costs in
// RSS. Call it once, at the start: memory the heap has used before is
// zeroed when reused, which makes it resident. n <= 0 removes the floor.
func SetHeapFloor(n int) {
	floorMu.Lock()
	defer floorMu.Unlock()
	floor = nil
	if n > 0 {
		floor = make([]byte, n)
	}
}
