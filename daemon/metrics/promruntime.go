package metrics

import (
	"bytes"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// writeRuntimeMetrics writes the Go runtime's and the process's series
// under the names Prometheus's own collectors use (go_*, process_*), so
// dashboards built for any Go service read them.
func writeRuntimeMetrics(p *promWriter) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	p.family("go_goroutines", "Number of goroutines that currently exist.", "gauge")
	p.sample("go_goroutines", float64(runtime.NumGoroutine()))
	p.family("go_threads", "Number of OS threads created.", "gauge")
	p.sample("go_threads", float64(pprof.Lookup("threadcreate").Count()))
	p.family("go_info", "Information about the Go environment.", "gauge")
	p.sample("go_info", 1, "version", runtime.Version())
	for _, g := range []struct {
		name, help string
		v          uint64
	}{
		{"go_memstats_alloc_bytes", "Number of bytes allocated in heap and currently in use.", ms.HeapAlloc},
		{"go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use.", ms.HeapInuse},
		{"go_memstats_heap_objects", "Number of currently allocated objects.", ms.HeapObjects},
		{"go_memstats_sys_bytes", "Number of bytes obtained from the system.", ms.Sys},
		{"go_memstats_next_gc_bytes", "Number of heap bytes when the next garbage collection will take place.", ms.NextGC},
	} {
		p.family(g.name, g.help, "gauge")
		p.sample(g.name, float64(g.v))
	}
	p.family("go_gc_cycles_total", "Completed garbage collection cycles.", "counter")
	p.sample("go_gc_cycles_total", float64(ms.NumGC))

	st, err := readProcStat()
	if err == nil {
		p.family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "counter")
		p.sample("process_cpu_seconds_total", st.cpuSeconds)
		p.family("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge")
		p.sample("process_virtual_memory_bytes", st.vsize)
		p.family("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge")
		p.sample("process_resident_memory_bytes", st.rss)
		if st.startTime > 0 {
			p.family("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", "gauge")
			p.sample("process_start_time_seconds", st.startTime)
		}
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		p.family("process_open_fds", "Number of open file descriptors.", "gauge")
		p.sample("process_open_fds", float64(len(fds)))
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil {
		p.family("process_max_fds", "Maximum number of open file descriptors.", "gauge")
		p.sample("process_max_fds", float64(lim.Cur))
	}
}

// procStat is what process_* reads from /proc/self/stat.
type procStat struct {
	cpuSeconds, vsize, rss, startTime float64
}

// userHZ is the kernel's USER_HZ, the unit of /proc's clock ticks; it is
// 100 on every Linux architecture Go supports.
const userHZ = 100

// readProcStat parses /proc/self/stat (fields after the command, which may
// hold spaces and parentheses, so the split is at its last ')').
func readProcStat() (procStat, error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return procStat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, os.ErrInvalid
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): utime is field 14, stime 15, starttime 22,
	// vsize 23, rss 24 (pages).
	if len(f) < 22 {
		return procStat{}, os.ErrInvalid
	}
	num := func(k int) float64 { v, _ := strconv.ParseFloat(f[k-3], 64); return v }
	st := procStat{
		cpuSeconds: (num(14) + num(15)) / userHZ,
		vsize:      num(23),
		rss:        num(24) * float64(os.Getpagesize()),
	}
	if boot, err := bootTime(); err == nil {
		st.startTime = boot + num(22)/userHZ
	}
	return st, nil
}

// bootTime is the btime line of /proc/stat: the boot, in seconds since the
// epoch.
func bootTime() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, os.ErrNotExist
}
