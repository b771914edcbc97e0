package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"

	dto "github.com/prometheus/client_model/go"

	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/netpolicy"
)

type fakeSource struct{}

func (fakeSource) SessionCount() int { return 2 }
func (fakeSource) Healthy() error    { return nil }

func (fakeSource) DNSStats() dnsproxy.Stats { return dnsproxy.Stats{AttestCap: 2, TCPRefused: 9} }

func (fakeSource) SessionCounters() map[string]netpolicy.Counters {
	return map[string]netpolicy.Counters{"s1": {DroppedPackets: 5, LimitedPackets: 3}, "s2": {}}
}

func gatherMetrics(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
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
			v = float64(m.GetHistogram().GetSampleCount())
		}
		out = append(out, fmt.Sprintf("%s=%g", strings.Join(ls, ","), v))
	}
	return out
}

func TestMetrics(t *testing.T) {
	var nilM *Metrics // every method is nil-safe
	nilM.observeCreate(time.Second, nil)
	nilM.dnsQuery("allowed")
	nilM.observeAttest(time.Millisecond)
	nilM.SetSessionSource(fakeSource{})

	m := NewMetrics()
	fams := gatherMetrics(t, m)
	if got := metricSeries(fams["enforcerd_sessions"]); fmt.Sprint(got) != "[=0]" {
		t.Fatalf("sessions without source: %v", got)
	}
	m.SetSessionSource(fakeSource{})
	m.observeCreate(20*time.Millisecond, nil)
	m.observeCreate(0, fmt.Errorf("x: %w", api.ErrNameTaken))
	m.observeCreate(0, fmt.Errorf("x: %w", api.ErrPoolExhausted))
	m.observeCreate(0, fmt.Errorf("x: %w", api.ErrBadRequest))
	m.observeCreate(0, context.Canceled)
	m.observeCreate(0, io.EOF)
	m.dnsQuery("allowed")
	m.dnsQuery("allowed")
	m.dnsQuery("denied")
	m.observeAttest(300 * time.Microsecond)

	fams = gatherMetrics(t, m)
	want := map[string]string{
		"enforcerd_sessions":                      "[=2]",
		"enforcerd_session_creates_total":         "[result=error=5 result=ok=1]",
		"enforcerd_session_create_failures_total": "[reason=bad_request=1 reason=canceled=1 reason=internal=1 reason=name_taken=1 reason=pool_exhausted=1]",
		"enforcerd_session_create_seconds":        "[=1]",
		"enforcerd_dns_queries_total":             "[verdict=allowed=2 verdict=denied=1]",
		"enforcerd_dns_attest_seconds":            "[=1]",
		"enforcerd_session_dropped_packets":       "[session=s1=5 session=s2=0]",
		"enforcerd_session_limited_packets":       "[session=s1=3 session=s2=0]",
		"enforcerd_dns_attest_cap_total":          "[=2]",
		"enforcerd_dns_tcp_refused_total":         "[=9]",
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
	if fams["go_goroutines"] == nil || fams["process_open_fds"] == nil {
		t.Error("runtime or process collector missing")
	}
}

func TestServeMetrics(t *testing.T) {
	m := NewMetrics()
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
