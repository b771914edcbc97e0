package metrics

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/netpolicy/nft"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"

	"github.com/enforcerd/enforcerd/dnsproxy"
)

type fakeSource struct{}

func (fakeSource) SessionCount() int { return 2 }
func (fakeSource) Healthy() error    { return nil }

func (fakeSource) NameCheckTotals() (map[string]uint64, uint64, uint64) {
	return map[string]uint64{"allowed": 3, "refused": 2, "passed": 1}, 0, 4
}

func (fakeSource) DNSStats() dnsproxy.Stats {
	ms := time.Millisecond
	return dnsproxy.Stats{
		Verdicts:  map[string]uint64{dnsproxy.VerdictAllowed: 2, dnsproxy.VerdictDenied: 1},
		Malformed: 4, Shed: 5, AttestErrors: 3, AttestCap: 2, UpstreamErrors: 7, TCPRefused: 9,
		InFlight: 6, Queued: 8, Sessions: 2, UDPReaders: 4, TCPAcceptors: 1,
		Attest: dnsproxy.Histogram{Bounds: []time.Duration{ms, 10 * ms}, Counts: []uint64{1, 2}, Count: 3, Sum: 2 * time.Second},
	}
}

func (fakeSource) SessionCounters() map[string]nft.Counters {
	return map[string]nft.Counters{"s1": {DroppedPackets: 5, LimitedPackets: 3}, "s2": {}}
}

// gatherMetrics parses what m writes with Prometheus's own text parser,
// so the hand-written exposition is checked against the format.
func gatherMetrics(t *testing.T, m *Registry) map[string]*dto.MetricFamily {
	t.Helper()
	var buf bytes.Buffer
	if err := m.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(prommodel.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(&buf)
	if err != nil {
		t.Fatalf("parse the exposition: %v\n%s", err, buf.String())
	}
	return fams
}

// series renders a family as "label=value,...=number" lines.
func metricSeries(f *dto.MetricFamily) []string {
	var out []string
	for _, m := range f.GetMetric() {
		var ls []string
		for _, l := range m.GetLabel() {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		var v float64
		switch {
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		case m.Histogram != nil:
			h := m.GetHistogram()
			v = float64(h.GetSampleCount())
			for _, b := range h.GetBucket() {
				ls = append(ls, fmt.Sprintf("le%g:%d", b.GetUpperBound(), b.GetCumulativeCount()))
			}
			ls = append(ls, fmt.Sprintf("sum:%g", h.GetSampleSum()))
		}
		out = append(out, fmt.Sprintf("%s=%g", strings.Join(ls, ","), v))
	}
	return out
}

func TestMetrics(t *testing.T) {
	var nilM *Registry // every method is nil-safe
	nilM.ObserveCreate(time.Second, nil)
	nilM.SetSource(fakeSource{})

	m := New("1.2.3", "abc")
	fams := gatherMetrics(t, m)
	if got := metricSeries(fams["enforcerd_sessions"]); fmt.Sprint(got) != "[=0]" {
		t.Fatalf("sessions without source: %v", got)
	}
	m.SetSource(fakeSource{})
	m.ObserveCreate(20*time.Millisecond, nil)
	m.ObserveCreate(0, fmt.Errorf("x: %w", api.ErrNameTaken))
	m.ObserveCreate(0, fmt.Errorf("x: %w", api.ErrPoolExhausted))
	m.ObserveCreate(0, fmt.Errorf("x: %w", api.ErrBadRequest))
	m.ObserveCreate(0, context.Canceled)
	m.ObserveCreate(0, io.EOF)

	fams = gatherMetrics(t, m)
	want := map[string]string{
		"enforcerd_sessions":                      "[=2]",
		"enforcerd_session_creates_total":         "[result=error=5 result=ok=1]",
		"enforcerd_session_create_failures_total": "[reason=bad_request=1 reason=canceled=1 reason=internal=1 reason=name_taken=1 reason=pool_exhausted=1]",
		"enforcerd_session_create_seconds":        "[le0.001:0,le0.0025:0,le0.005:0,le0.01:0,le0.025:1,le0.05:1,le0.1:1,le0.25:1,le0.5:1,le1:1,le2.5:1,le5:1,le10:1,le+Inf:1,sum:0.02=1]",
		"enforcerd_session_dropped_packets_total": "[session=s1=5 session=s2=0]",
		"enforcerd_session_limited_packets_total": "[session=s1=3 session=s2=0]",
		"enforcerd_dns_queries_total":             "[verdict=allowed=2 verdict=denied=1]",
		"enforcerd_dns_malformed_total":           "[=4]",
		"enforcerd_dns_shed_total":                "[=5]",
		"enforcerd_dns_attest_errors_total":       "[=3]",
		"enforcerd_dns_attest_cap_total":          "[=2]",
		"enforcerd_dns_answer_cap_total":          "[=0]",
		"enforcerd_dns_session_gone_total":        "[=0]",
		"enforcerd_dns_upstream_errors_total":     "[=7]",
		"enforcerd_dns_tcp_refused_total":         "[=9]",
		"enforcerd_dns_in_flight":                 "[=6]",
		"enforcerd_dns_queued":                    "[=8]",
		"enforcerd_dns_sessions":                  "[=2]",
		"enforcerd_dns_serve_loops":               "[proto=tcp=1 proto=udp=4]",
		"enforcerd_dns_attest_seconds":            "[le0.001:1,le0.01:2,le+Inf:3,sum:2=3]",
		"enforcerd_dns_upstream_seconds":          "[le+Inf:0,sum:0=0]",
		"enforcerd_build_info":                    "[commit=abc,goversion=" + runtime.Version() + ",version=1.2.3=1]",
	}
	for name, w := range want {
		f := fams[name]
		if f == nil {
			t.Errorf("%s missing", name)
			continue
		}
		if got := fmt.Sprint(metricSeries(f)); got != w {
			t.Errorf("%s = %s, want %s", name, got, w)
		}
	}
	for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_open_fds", "process_resident_memory_bytes", "process_cpu_seconds_total", "process_start_time_seconds"} {
		if fams[name] == nil {
			t.Errorf("%s missing", name)
		}
	}
	if st := fams["process_start_time_seconds"]; st != nil {
		if v := st.GetMetric()[0].GetGauge().GetValue(); math.Abs(v-float64(time.Now().Unix())) > 3600 {
			t.Errorf("process_start_time_seconds = %g, not within an hour of now", v)
		}
	}
	if rss := fams["process_resident_memory_bytes"]; rss != nil && rss.GetMetric()[0].GetGauge().GetValue() < 1<<20 {
		t.Errorf("process_resident_memory_bytes = %g, under 1 MiB", rss.GetMetric()[0].GetGauge().GetValue())
	}
}

func TestServeMetrics(t *testing.T) {
	m := New("1.2.3", "abc")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Serve(ctx, ln) }()
	resp, err := http.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "enforcerd_session_creates_total{result=\"ok\"} 0") {
		t.Fatalf("scrape:\n%s", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
