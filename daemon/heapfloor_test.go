package daemon

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestHeapFloorCountedNotResident: the floor raises the heap the collector
// counts by its size and leaves resident memory (VmRSS) where it was; 0
// removes it. It runs in a fresh process, as at the daemon's start: memory
// an earlier test's heap used would have to be zeroed, hence made resident.
func TestHeapFloorCountedNotResident(t *testing.T) {
	if os.Getenv("ENFORCERD_HEAPFLOOR_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHeapFloorCountedNotResident$", "-test.count=1")
		cmd.Env = append(os.Environ(), "ENFORCERD_HEAPFLOOR_CHILD=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("in a fresh process: %v\n%s", err, out)
		}
		return
	}
	const n = 256 << 20
	runtime.GC()
	rss0, heap0 := vmRSSKiB(t), heapAlloc()
	SetHeapFloor(n)
	rss1, heap1 := vmRSSKiB(t), heapAlloc()
	if heap1-heap0 < n-(1<<20) { // less whatever else was freed meanwhile
		t.Errorf("heap grew by %d bytes with a %d-byte floor: the collector does not count it", heap1-heap0, n)
	}
	if grew := rss1 - rss0; grew > 16<<10 {
		t.Errorf("VmRSS grew by %d KiB with a %d MiB floor: the floor is resident", grew, n>>20)
	}
	SetHeapFloor(0)
	runtime.GC()
	if heap2 := heapAlloc(); heap2 > heap1-n/2 {
		t.Errorf("heap %d bytes after removing the floor (%d with it)", heap2, heap1)
	}
}

func heapAlloc() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func vmRSSKiB(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			v, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}
