package integration

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// TestE2EHealthReflectsKernel: /v1/healthz answers
// "ok" only while the daemon's kernel objects are in place: a table deleted
// behind its back (`nft flush ruleset` by another tool) or a DNS interface
// that lost the anycast address makes it 503, naming what is missing, so an
// orchestrator sees that enforcement is inactive. Control: ok before, and
// again after a restart rebuilt the table; /v1/readyz answers once serving.
func TestE2EHealthReflectsKernel(t *testing.T) {
	e := newE2E(t)
	e.createNetOnly("a", "--allow", "api.e2e.test")
	c := e.d.Client()
	expect := func(when string, code int, want string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := c.Healthz(ctx)
		var ae *api.Error
		switch {
		case code == http.StatusOK && err != nil:
			t.Errorf("%s: healthz: %v, want ok", when, err)
		case code == http.StatusOK:
		case !errors.As(err, &ae) || ae.Status != code || !strings.Contains(ae.Message, want) || !errors.Is(err, api.ErrUnavailable):
			t.Errorf("%s: healthz: %v, want %d containing %q (api.ErrUnavailable)", when, err, code, want)
		}
	}
	inHost := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"netns", "exec", e.w.HostName}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ready(ctx); err != nil {
		t.Errorf("readyz: %v", err)
	}
	expect("control", http.StatusOK, "")

	inHost("nft", "delete", "table", "inet", e.d.Prefix)
	expect("table deleted behind the daemon's back", http.StatusServiceUnavailable, "table inet "+e.d.Prefix+" is missing")
	if err := e.d.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	e.start() // Ensure rebuilds the table; the session lost its rules and is reaped
	expect("after the restart", http.StatusOK, "")

	inHost("ip", "addr", "flush", "dev", e.dnsIface())
	expect("anycast address removed", http.StatusServiceUnavailable, "lacks the anycast address")
}

// TestE2EMetricsListenerBeforeReady: a metrics address
// that cannot be had fails the start in one line (before: the daemon
// started and only logged it later); a free one serves /healthz and
// /readyz beside /metrics (control). The daemon's heap floor is in force
// by default (the collector's next goal is at least 32 MiB) and gone with
// --heap-floor-mib 0 (control).
func TestE2EMetricsListenerBeforeReady(t *testing.T) {
	e := prepareE2E(t, "")
	taken, err := world.ListenTCP(e.w.HostPath, netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatalf("hold a port in the simulated host: %v", err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	e.d.Args = append(e.d.Args, "--metrics-listen", addr)
	if err := e.d.Start(); err == nil {
		t.Fatalf("enforcerd started although its metrics address %s is taken", addr)
	}
	if log := e.d.Log(); !strings.Contains(log, "listen for metrics on "+addr) {
		t.Errorf("refusal %q, want it to name the metrics address %s", log, addr)
	}
	taken.Close()
	e.start()
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		body, err := world.HTTPGet(e.w.HostPath, "http://"+addr+path, 3*time.Second)
		if err != nil {
			t.Errorf("GET %s on the metrics listener: %v", path, err)
			continue
		}
		if path != "/metrics" {
			continue
		}
		// What the DNS proxy counts, read at scrape time, and the build.
		for _, want := range []string{`enforcerd_build_info{commit=`, `enforcerd_dns_serve_loops{proto="tcp"} 1`,
			`enforcerd_dns_queries_total{verdict="allowed"} 0`, `enforcerd_dns_attest_seconds_bucket{le="0.0001"} 0`,
			`enforcerd_dns_upstream_seconds_count 0`, `enforcerd_dns_in_flight 0`, `enforcerd_dns_shed_total 0`} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
	}
	// The floor is tuned after the daemon's first cycle.
	var goal float64
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if goal = nextGCBytes(t, e.w.HostPath, addr); goal >= 32<<20 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("next GC goal with the default heap floor: %.0f bytes", goal)
	if goal < 32<<20 {
		t.Errorf("next GC goal %.0f bytes with the default heap floor, want at least %d", goal, 32<<20)
	}
	if err := e.d.Stop(); err != nil {
		t.Fatal(err)
	}
	e.d.Args = append(e.d.Args, "--heap-floor-mib", "0")
	e.start()
	goal = nextGCBytes(t, e.w.HostPath, addr)
	t.Logf("next GC goal with --heap-floor-mib 0: %.0f bytes", goal)
	if goal >= 32<<20 {
		t.Errorf("next GC goal %.0f bytes with --heap-floor-mib 0, want under %d: the floor is still there", goal, 32<<20)
	}
}

// nextGCBytes scrapes go_memstats_next_gc_bytes from the daemon's metrics
// listener at addr, from the netns at hostPath.
func nextGCBytes(t *testing.T, hostPath, addr string) float64 {
	t.Helper()
	body, err := world.HTTPGet(hostPath, "http://"+addr+"/metrics", 3*time.Second)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "go_memstats_next_gc_bytes "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("go_memstats_next_gc_bytes %q: %v", v, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics lacks go_memstats_next_gc_bytes")
	return 0
}
