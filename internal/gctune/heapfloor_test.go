package gctune

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

// TestHeapFloorRaisesTheGoal: with a floor the collector's next goal is
// at least the floor above the live heap, cycle after cycle (the garbage
// between them included); without it, about twice the live heap (control).
func TestHeapFloorRaisesTheGoal(t *testing.T) {
	const floor = 64 << 20
	t.Cleanup(func() { SetHeapFloor(0) })
	goal := func() (next, live uint64) {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.NextGC, m.HeapAlloc
	}
	SetHeapFloor(floor)
	for cycle := 0; cycle < 5; cycle++ {
		var sink [][]byte
		for i := 0; i < 200; i++ {
			sink = append(sink, make([]byte, 64<<10))
		}
		runtime.KeepAlive(sink)
		runtime.GC()
		// The percent is re-tuned by a finalizer after the cycle.
		var next, live uint64
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if next, live = goal(); next >= live+floor*9/10 || time.Now().After(deadline) {
				break
			}
		}
		if next < live+floor*9/10 {
			t.Fatalf("cycle %d: next goal %d bytes with a %d-byte floor and %d live", cycle, next, floor, live)
		}
	}
	SetHeapFloor(0)
	runtime.GC()
	if next, live := goal(); next >= live+floor/2 {
		t.Errorf("next goal %d bytes after removing the floor (%d live)", next, live)
	}
	if p := debug.SetGCPercent(100); p != 100 {
		t.Errorf("GC percent %d after removing the floor, want GOGC's 100", p)
	}
}

// TestFloorPercent: the percent puts the goal near live+floor, is capped
// for tiny heaps (the runtime's minimum goal scales with it), and never
// falls below GOGC's.
func TestFloorPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, floor float64
		base, want  int
	}{
		{8 * mib, 32 * mib, 100, 400},  // goal 8 + 32
		{1 * mib, 32 * mib, 100, 825},  // capped: minimum goal 4 MiB * 8.25 = 33 MiB
		{64 * mib, 32 * mib, 100, 100}, // large heap: GOGC's own
		{16 * mib, 32 * mib, 300, 300},
	} {
		if got := floorPercent(c.live, c.floor, c.base); got != c.want {
			t.Errorf("floorPercent(%v MiB live, %v MiB floor, base %d) = %d, want %d", c.live/mib, c.floor/mib, c.base, got, c.want)
		}
	}
}
