package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/netpolicy"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the daemon's Prometheus metrics in their own registry. Every
// method is safe on a nil *Metrics (tests and callers without metrics).
// What the engine and the DNS proxy already count (sessions, per-session
// packet counters, every dnsproxy.Stats field) is read at scrape time
// (SetSessionSource), never measured twice and never stale.
type Metrics struct {
	Registry       *prometheus.Registry
	Creates        *prometheus.CounterVec // {result="ok"|"error"}
	CreateFailures *prometheus.CounterVec // {reason}
	CreateSeconds  prometheus.Histogram

	src *sourceCollector
}

// sessionSource is what the metrics read from the engine at every scrape.
type sessionSource interface {
	// SessionCount is the number of sessions that exist now.
	SessionCount() int
	// SessionCounters maps each session with a NIC to its nftables
	// counters (policy drops, new flows over its budget).
	SessionCounters() map[string]netpolicy.Counters
	// DNSStats are the DNS proxy's counters since start.
	DNSStats() dnsproxy.Stats
	// Healthy is the health check of /healthz.
	Healthy() error
}

// dnsCounters are the DNS proxy's counters exported at scrape time; the caps
// among them make a bound that bites visible, never silent.
var dnsCounters = []struct {
	name, help string
	get        func(dnsproxy.Stats) uint64
}{
	{"enforcerd_dns_malformed_total", "Packets dropped unanswered because they did not parse as a query.", func(s dnsproxy.Stats) uint64 { return s.Malformed }},
	{"enforcerd_dns_shed_total", "Queries dropped unanswered by the fairness limits (a full per-session queue, or a wait longer than the timeout).", func(s dnsproxy.Stats) uint64 { return s.Shed }},
	{"enforcerd_dns_attest_errors_total", "Failed attests (each gave a SERVFAIL).", func(s dnsproxy.Stats) uint64 { return s.AttestErrors }},
	{"enforcerd_dns_attest_cap_total", "Answers refused (SERVFAIL) because the session holds --max-attested live attested addresses.", func(s dnsproxy.Stats) uint64 { return s.AttestCap }},
	{"enforcerd_dns_answer_cap_total", "Answers that carried more addresses than the per-answer cap (the rest were removed, not attested).", func(s dnsproxy.Stats) uint64 { return s.AnswerCap }},
	{"enforcerd_dns_session_gone_total", "Queries whose session was removed while they were in flight (SERVFAIL, nothing attested).", func(s dnsproxy.Stats) uint64 { return s.SessionGone }},
	{"enforcerd_dns_tcp_refused_total", "TCP connections closed at accept: unknown source, or over the per-session or total limits.", func(s dnsproxy.Stats) uint64 { return s.TCPRefused }},
	{"enforcerd_dns_upstream_errors_total", "Failed upstream tries (each try, not each query).", func(s dnsproxy.Stats) uint64 { return s.UpstreamErrors }},
}

// dnsGauges are the DNS proxy's levels now.
var dnsGauges = []struct {
	name, help string
	get        func(dnsproxy.Stats) int
}{
	{"enforcerd_dns_in_flight", "DNS queries being worked on now.", func(s dnsproxy.Stats) int { return s.InFlight }},
	{"enforcerd_dns_queued", "DNS queries waiting for a slot now.", func(s dnsproxy.Stats) int { return s.Queued }},
	{"enforcerd_dns_sessions", "Sessions registered with the DNS proxy.", func(s dnsproxy.Stats) int { return s.Sessions }},
}

// NewMetrics registers every metric, the Go runtime's and the process's;
// version and commit label enforcerd_build_info.
func NewMetrics(version, commit string) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Creates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "enforcerd_session_creates_total", Help: "Session creates by result (ok or error).",
		}, []string{"result"}),
		CreateFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "enforcerd_session_create_failures_total", Help: "Failed session creates by reason.",
		}, []string{"reason"}),
		CreateSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "enforcerd_session_create_seconds", Help: "Latency of successful session creates.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		src: &sourceCollector{
			sessions: prometheus.NewDesc("enforcerd_sessions", "Sessions that exist now.", nil, nil),
			dropped: prometheus.NewDesc("enforcerd_session_dropped_packets_total",
				"Packets the session's policy dropped (from the nftables counters).", []string{"session"}, nil),
			limited: prometheus.NewDesc("enforcerd_session_limited_packets_total",
				"New flows of the session dropped because it was at its flow cap or over its new-flow rate (--max-flows, --flow-rate).", []string{"session"}, nil),
			byReason: prometheus.NewDesc("enforcerd_dropped_packets_total",
				"Packets the table dropped, by reason, summed over the sessions (per session: inspect's dropped_by_reason).", []string{"reason"}, nil),
			unlogged: prometheus.NewDesc("enforcerd_drops_not_logged_total",
				"Dropped new flows that got no flow event (the per-session log budget), summed over the sessions.", nil, nil),
			queries: prometheus.NewDesc("enforcerd_dns_queries_total", "DNS queries answered, by verdict.", []string{"verdict"}, nil),
			loops: prometheus.NewDesc("enforcerd_dns_serve_loops",
				"DNS proxy serve loops running now (proto udp: readers, tcp: accept loops); 0 means queries of that protocol go unanswered.", []string{"proto"}, nil),
			attest: prometheus.NewDesc("enforcerd_dns_attest_seconds",
				"Time to put an answer's addresses into the session's set (each attest, failed ones too).", nil, nil),
			upstream: prometheus.NewDesc("enforcerd_dns_upstream_seconds",
				"Round-trip time of successful upstream exchanges.", nil, nil),
		},
	}
	for _, d := range dnsCounters {
		m.src.counters = append(m.src.counters, prometheus.NewDesc(d.name, d.help, nil, nil))
	}
	for _, d := range dnsGauges {
		m.src.gauges = append(m.src.gauges, prometheus.NewDesc(d.name, d.help, nil, nil))
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "enforcerd_build_info", Help: "Always 1; the labels say which build runs.",
		ConstLabels: prometheus.Labels{"version": version, "commit": commit, "goversion": runtime.Version()},
	})
	build.Set(1)
	m.Registry.MustRegister(m.Creates, m.CreateFailures, m.CreateSeconds, m.src, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{"ok", "error"} {
		m.Creates.WithLabelValues(r) // export zeros from the start
	}
	return m
}

// SetSessionSource installs the engine the scrape-time metrics read.
func (m *Metrics) SetSessionSource(src sessionSource) {
	if m == nil {
		return
	}
	m.src.mu.Lock()
	m.src.source = src
	m.src.mu.Unlock()
}

// CreateRefused counts a create refused before it reached the daemon
// (api.HandlerOptions.CreateRefused).
func (m *Metrics) CreateRefused(err error) { m.observeCreate(0, err) }

// observeCreate records one create: its result, and its latency when it
// succeeded, or its failure reason (from the error's sentinel).
func (m *Metrics) observeCreate(d time.Duration, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.Creates.WithLabelValues("error").Inc()
		m.CreateFailures.WithLabelValues(failureReason(err)).Inc()
		return
	}
	m.Creates.WithLabelValues("ok").Inc()
	m.CreateSeconds.Observe(d.Seconds())
}

// failureReason is the {reason} label of a failed create.
func failureReason(err error) string {
	switch {
	case errors.Is(err, api.ErrBadRequest):
		return "bad_request"
	case errors.Is(err, api.ErrNameTaken):
		return "name_taken"
	case errors.Is(err, api.ErrPoolExhausted):
		return "pool_exhausted"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "internal"
}

// sourceCollector reads the engine's and the DNS proxy's counters at
// scrape time, so sessions that went leave no series. mu guards source.
type sourceCollector struct {
	sessions, dropped, limited *prometheus.Desc
	byReason, unlogged         *prometheus.Desc
	queries, loops             *prometheus.Desc
	attest, upstream           *prometheus.Desc
	counters                   []*prometheus.Desc // one per dnsCounters entry
	gauges                     []*prometheus.Desc // one per dnsGauges entry
	mu                         sync.Mutex
	source                     sessionSource
}

func (c *sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.sessions, c.dropped, c.limited, c.byReason, c.unlogged, c.queries, c.loops, c.attest, c.upstream} {
		ch <- d
	}
	for _, d := range c.counters {
		ch <- d
	}
	for _, d := range c.gauges {
		ch <- d
	}
}

func (c *sourceCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	src := c.source
	c.mu.Unlock()
	if src == nil {
		ch <- prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(src.SessionCount()))
	// Every reason has a series, zero included, so a rate() over it never
	// starts from a missing one.
	byReason := map[string]uint64{}
	for _, r := range netpolicy.Reasons {
		byReason[r] = 0
	}
	var unlogged uint64
	for name, n := range src.SessionCounters() {
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(n.DroppedPackets), name)
		ch <- prometheus.MustNewConstMetric(c.limited, prometheus.CounterValue, float64(n.LimitedPackets), name)
		for r, v := range n.ByReason {
			byReason[r] += v
		}
		unlogged += n.Unlogged
	}
	for r, v := range byReason {
		ch <- prometheus.MustNewConstMetric(c.byReason, prometheus.CounterValue, float64(v), r)
	}
	ch <- prometheus.MustNewConstMetric(c.unlogged, prometheus.CounterValue, float64(unlogged))
	st := src.DNSStats()
	for verdict, n := range st.Verdicts {
		ch <- prometheus.MustNewConstMetric(c.queries, prometheus.CounterValue, float64(n), verdict)
	}
	for i, d := range c.counters {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(dnsCounters[i].get(st)))
	}
	for i, d := range c.gauges {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(dnsGauges[i].get(st)))
	}
	ch <- prometheus.MustNewConstMetric(c.loops, prometheus.GaugeValue, float64(st.UDPReaders), "udp")
	ch <- prometheus.MustNewConstMetric(c.loops, prometheus.GaugeValue, float64(st.TCPAcceptors), "tcp")
	ch <- constHistogram(c.attest, st.Attest)
	ch <- constHistogram(c.upstream, st.Upstream)
}

// constHistogram exports one of the proxy's cumulative histograms as is.
func constHistogram(d *prometheus.Desc, h dnsproxy.Histogram) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.Bounds))
	for i, b := range h.Bounds {
		buckets[b.Seconds()] = h.Counts[i]
	}
	return prometheus.MustNewConstHistogram(d, h.Count, h.Sum.Seconds(), buckets)
}

// Handler serves the registry at /metrics, and /healthz and /readyz.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	// Health for orchestrators that probe over TCP: the same check as the
	// API's /v1/healthz; ready once the engine is installed (after reconcile).
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		m.src.mu.Lock()
		src := m.src.source
		m.src.mu.Unlock()
		switch {
		case src == nil:
			http.Error(w, "starting", http.StatusServiceUnavailable)
		default:
			if err := src.Healthy(); err != nil {
				http.Error(w, "unhealthy: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		}
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		m.src.mu.Lock()
		ready := m.src.source != nil
		m.src.mu.Unlock()
		if !ready {
			http.Error(w, "reconciling", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// Serve serves m on ln (/metrics, /healthz, /readyz) until ctx ends.
func (m *Metrics) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: m.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("serve metrics: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	<-errc
	return nil
}
