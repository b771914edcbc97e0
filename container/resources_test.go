package container

import (
	"math"
	"testing"

	"github.com/enforcerd/enforcerd/container/rules"
)

func TestCheckResources(t *testing.T) {
	const cpuWant = "want 0.01 to 4 (the CPUs of this machine); leave it out for the default 1"
	tests := []struct {
		mem, pids int64
		cpus      float64
		want      string
	}{
		{0, 0, 0, ""}, // every default
		{rules.MinMemoryBytes, rules.MinPidsMax, 0.01, ""},
		{1 << 30, 1 << 20, 4, ""},
		{1 << 20, 0, 0, "memory 1048576 bytes: want at least 4 MiB (4194304 bytes); leave it out for the default 512 MiB"},
		{-1, 0, 0, "memory -1 bytes: want at least 4 MiB (4194304 bytes); leave it out for the default 512 MiB"},
		{0, 3, 0, "pids 3: want at least 4; leave it out for the default 1024"},
		{0, -1, 0, "pids -1: want at least 4; leave it out for the default 1024"},
		{0, 0, 0.001, "cpus 0.001: " + cpuWant},
		{0, 0, -1, "cpus -1: " + cpuWant},
		{0, 0, 4.5, "cpus 4.5: " + cpuWant},
		{0, 0, math.Inf(1), "cpus +Inf: " + cpuWant},
	}
	for _, tt := range tests {
		if got := errString(checkResources(tt.mem, tt.pids, tt.cpus, 4)); got != tt.want {
			t.Errorf("checkResources(%d, %d, %v, 4) = %q, want %q", tt.mem, tt.pids, tt.cpus, got, tt.want)
		}
	}
}
