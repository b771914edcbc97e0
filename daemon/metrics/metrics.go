package metrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// Registry is the daemon's Prometheus metrics. Every method is safe on a
// nil *Registry (tests and callers without metrics). What the engine and the
// DNS proxy already count (sessions, per-session packet counters, every
// dnsproxy.Stats field) is read at scrape time (SetSource), never
// measured twice and never stale; the creates are counted here.
type Registry struct {
	version, commit string

	mu             sync.Mutex
	creates        map[string]uint64 // by result: ok, error
	createFailures map[string]uint64 // by reason
	createHist     []uint64          // cumulative counts per createBuckets bound
	createCount    uint64
	createSum      float64
	src            Source
}

// createBuckets are the bounds, in seconds, of the create latency histogram.
var createBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Source is what the metrics read from the engine at every scrape.
type Source interface {
	// SessionCount is the number of sessions that exist now.
	SessionCount() int
	// SessionCounters maps each session with a NIC to its nftables
	// counters (policy drops, new flows over its budget).
	SessionCounters() map[string]nft.Counters
	// DNSStats are the DNS proxy's counters since start.
	DNSStats() dnsproxy.Stats
	// Healthy is the health check of /healthz.
	Healthy() error
	// NameCheckTotals are the flows the name check decided since start,
	// by result (allowed, refused, passed), and the packets its queue
	// lost (the kernel dropped them; the guest retransmits), and the
	// packets it dropped because their session's backlog was full.
	NameCheckTotals() (byResult map[string]uint64, queueOverruns, backlogOverflows uint64)
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

// New returns the daemon's metrics, the Go runtime's and the
// process's; version and commit label enforcerd_build_info.
func New(version, commit string) *Registry {
	return &Registry{
		version: version, commit: commit,
		// export zeros from the start
		creates:        map[string]uint64{"ok": 0, "error": 0},
		createFailures: map[string]uint64{},
		createHist:     make([]uint64, len(createBuckets)),
	}
}

// SetSource installs the engine the scrape-time metrics read.
func (m *Registry) SetSource(src Source) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.src = src
	m.mu.Unlock()
}

func (m *Registry) source() Source {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.src
}

// CreateRefused counts a create refused before it reached the daemon
// (api.HandlerOptions.CreateRefused).
func (m *Registry) CreateRefused(err error) { m.ObserveCreate(0, err) }

// ObserveCreate records one create: its result, and its latency when it
// succeeded, or its failure reason (from the error's sentinel).
func (m *Registry) ObserveCreate(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.creates["error"]++
		m.createFailures[failureReason(err)]++
		return
	}
	m.creates["ok"]++
	s := d.Seconds()
	for i, b := range createBuckets {
		if s <= b {
			m.createHist[i]++
		}
	}
	m.createCount++
	m.createSum += s
}

// failureReason is the {reason} label of a failed create.
func failureReason(err error) string {
	switch {
	case errors.Is(err, api.ErrBadRequest):
		return "bad_request"
	case errors.Is(err, api.ErrNameTaken):
		return "name_taken"
	case errors.Is(err, api.ErrBusy):
		return "busy"
	case errors.Is(err, api.ErrPoolExhausted):
		return "pool_exhausted"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "internal"
}

// WriteText writes every metric in the text exposition format: the creates,
// what the source counts now, the build, the Go runtime and the process.
func (m *Registry) WriteText(w io.Writer) error {
	p := newPromWriter(w)
	m.writeCreates(p)
	m.writeSource(p, m.source())
	p.family("enforcerd_build_info", "Always 1; the labels say which build runs.", "gauge")
	p.sample("enforcerd_build_info", 1, "commit", m.commit, "goversion", runtime.Version(), "version", m.version)
	writeRuntimeMetrics(p)
	return p.flush()
}

func (m *Registry) writeCreates(p *promWriter) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p.family("enforcerd_session_creates_total", "Session creates by result (ok or error).", "counter")
	for _, r := range sortedKeys(m.creates) {
		p.sample("enforcerd_session_creates_total", float64(m.creates[r]), "result", r)
	}
	p.family("enforcerd_session_create_failures_total", "Failed session creates by reason.", "counter")
	for _, r := range sortedKeys(m.createFailures) {
		p.sample("enforcerd_session_create_failures_total", float64(m.createFailures[r]), "reason", r)
	}
	p.family("enforcerd_session_create_seconds", "Latency of successful session creates.", "histogram")
	p.histogram("enforcerd_session_create_seconds", createBuckets, m.createHist, m.createCount, m.createSum)
}

// writeSource writes what the engine and the DNS proxy count now, so
// sessions that went leave no series.
func (m *Registry) writeSource(p *promWriter, src Source) {
	p.family("enforcerd_sessions", "Sessions that exist now.", "gauge")
	if src == nil {
		p.sample("enforcerd_sessions", 0)
		return
	}
	p.sample("enforcerd_sessions", float64(src.SessionCount()))
	// Every reason has a series, zero included, so a rate() over it never
	// starts from a missing one.
	byReason := map[string]uint64{}
	for _, r := range netpolicy.Reasons {
		byReason[r] = 0
	}
	var unlogged uint64
	counters := src.SessionCounters()
	names := sortedKeys(counters)
	p.family("enforcerd_session_dropped_packets_total", "Packets of the session the table dropped (from the nftables counters): those the reasons of enforcerd_dropped_packets_total count other than spoofed and inbound, plus packets no reason counts (conntrack invalid, ICMP errors about another's flow; inspect's dropped_no_reason).", "counter")
	for _, name := range names {
		p.sample("enforcerd_session_dropped_packets_total", float64(counters[name].DroppedPackets), "session", name)
	}
	p.family("enforcerd_session_limited_packets_total", "New flows of the session dropped because it was at its flow cap or over its new-flow rate (--max-flows, --flow-rate).", "counter")
	for _, name := range names {
		n := counters[name]
		p.sample("enforcerd_session_limited_packets_total", float64(n.LimitedPackets), "session", name)
		for r, v := range n.ByReason {
			byReason[r] += v
		}
		unlogged += n.Unlogged
	}
	p.family("enforcerd_dropped_packets_total", "Packets the table dropped, by reason, summed over the sessions (per session: inspect's dropped_by_reason).", "counter")
	for _, r := range sortedKeys(byReason) {
		p.sample("enforcerd_dropped_packets_total", float64(byReason[r]), "reason", r)
	}
	p.family("enforcerd_drops_not_logged_total", "Dropped new flows that got no flow event (the per-session log budget), summed over the sessions.", "counter")
	p.sample("enforcerd_drops_not_logged_total", float64(unlogged))

	nc, overruns, overflows := src.NameCheckTotals()
	p.family("enforcerd_namecheck_flows_total", "TCP flows the name check decided (docs/network-model.md, Names on shared addresses), by result: allowed (a name the policy allows on the port), refused (the flow was ended), passed (no name to check: L3 semantics). checked = the sum.", "counter")
	for _, r := range []string{"allowed", "refused", "passed"} {
		p.sample("enforcerd_namecheck_flows_total", float64(nc[r]), "result", r)
	}
	p.family("enforcerd_namecheck_queue_overruns_total", "Times the name check's queue could not deliver packets to the daemon (a full socket buffer): the kernel dropped them and the guests retransmit.", "counter")
	p.sample("enforcerd_namecheck_queue_overruns_total", float64(overruns))
	p.family("enforcerd_namecheck_backlog_overflows_total", "Packets the name check dropped because their session's backlog was full (a session flooding checked connections; per session: inspect's name_check.overflowed). Its TCP sends them again.", "counter")
	p.sample("enforcerd_namecheck_backlog_overflows_total", float64(overflows))

	st := src.DNSStats()
	p.family("enforcerd_dns_queries_total", "DNS queries answered, by verdict.", "counter")
	for _, v := range sortedKeys(st.Verdicts) {
		p.sample("enforcerd_dns_queries_total", float64(st.Verdicts[v]), "verdict", v)
	}
	for _, d := range dnsCounters {
		p.family(d.name, d.help, "counter")
		p.sample(d.name, float64(d.get(st)))
	}
	for _, d := range dnsGauges {
		p.family(d.name, d.help, "gauge")
		p.sample(d.name, float64(d.get(st)))
	}
	p.family("enforcerd_dns_serve_loops", "DNS proxy serve loops running now (proto udp: readers, tcp: accept loops); 0 means queries of that protocol go unanswered.", "gauge")
	p.sample("enforcerd_dns_serve_loops", float64(st.TCPAcceptors), "proto", "tcp")
	p.sample("enforcerd_dns_serve_loops", float64(st.UDPReaders), "proto", "udp")
	writeDNSHistogram(p, "enforcerd_dns_attest_seconds", "Time to put an answer's addresses into the session's set (each attest, failed ones too).", st.Attest)
	writeDNSHistogram(p, "enforcerd_dns_upstream_seconds", "Round-trip time of successful upstream exchanges.", st.Upstream)
}

// writeDNSHistogram exports one of the proxy's cumulative histograms as is.
func writeDNSHistogram(p *promWriter, name, help string, h dnsproxy.Histogram) {
	bounds := make([]float64, len(h.Bounds))
	for i, b := range h.Bounds {
		bounds[i] = b.Seconds()
	}
	p.family(name, help, "histogram")
	p.histogram(name, bounds, h.Counts, h.Count, h.Sum.Seconds())
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Handler serves the registry at /metrics, and /healthz and /readyz.
func (m *Registry) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		if err := m.WriteText(&buf); err != nil {
			http.Error(w, "metrics: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(buf.Bytes())
	})
	// Health for orchestrators that probe over TCP: the same check as the
	// API's /v1/healthz; ready once the engine is installed (after reconcile).
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		src := m.source()
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
		if m.source() == nil {
			http.Error(w, "reconciling", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// Serve serves m on ln (/metrics, /healthz, /readyz) until ctx ends.
func (m *Registry) Serve(ctx context.Context, ln net.Listener) error {
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
