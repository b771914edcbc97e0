package dnsproxy

import (
	"errors"
	"sync/atomic"
	"time"
)

// latencyBounds are the upper bounds of the histogram buckets used for
// attestation and upstream latencies (the last bucket is +Inf).
var latencyBounds = []time.Duration{
	100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond,
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2500 * time.Millisecond, 5 * time.Second,
}

// Stats is a point-in-time copy of the proxy's counters, shaped for
// Prometheus (counters and cumulative histograms).
type Stats struct {
	// Verdicts counts answered queries by verdict (see the Verdict constants).
	Verdicts map[string]uint64
	// Malformed counts packets dropped because they did not parse (or were
	// responses, not queries).
	Malformed uint64
	// Shed counts queries dropped unanswered by the fairness limits: a full
	// per-session queue, or a query that waited longer than the timeout.
	Shed uint64
	// AttestErrors counts failed Attest calls (each also gave a SERVFAIL).
	AttestErrors uint64
	// AttestCap counts attests refused because the session holds the
	// firewall's per-session cap of attested addresses
	// (netpolicy.ErrAttestCap); each is also in AttestErrors and gave a
	// SERVFAIL.
	AttestCap uint64
	// AnswerCap counts answers that carried more addresses than
	// Config.MaxAnswerAddrs (the rest were removed, not attested).
	AnswerCap uint64
	// SessionGone counts queries whose session was unregistered (or
	// replaced) while they were in flight: SERVFAIL, nothing attested.
	SessionGone uint64
	// TCPRefused counts TCP connections closed as soon as they were
	// accepted: from a source that is no registered session, or over the
	// per-session or total connection limits.
	TCPRefused uint64
	// UpstreamErrors counts failed upstream tries (each try, not each query).
	UpstreamErrors uint64
	// InFlight is the number of queries being worked on now; Queued the
	// number waiting for a slot.
	InFlight, Queued int
	// Sessions is the number of registered sessions.
	Sessions int
	// UDPReaders and TCPAcceptors are the serve loops running now (each
	// Serve call starts up to four UDP readers and one TCP accept loop;
	// all of a call's loops end when one of its sockets fails for good).
	UDPReaders, TCPAcceptors int
	// Attest and Upstream are latency histograms of Attest calls and of
	// successful upstream exchanges.
	Attest, Upstream Histogram
}

// Histogram is a cumulative latency histogram: Counts[i] is the number of
// observations <= Bounds[i]; Count includes the +Inf bucket.
type Histogram struct {
	Bounds []time.Duration
	Counts []uint64
	Count  uint64
	Sum    time.Duration
	Max    time.Duration
}

// histogram is a lock-free latency histogram.
type histogram struct {
	buckets [16]atomic.Uint64 // len(latencyBounds)+1
	count   atomic.Uint64
	sumNs   atomic.Int64
	maxNs   atomic.Int64
}

func (h *histogram) observe(d time.Duration) {
	i := 0
	for i < len(latencyBounds) && d > latencyBounds[i] {
		i++
	}
	h.buckets[i].Add(1)
	h.count.Add(1)
	h.sumNs.Add(int64(d))
	for {
		m := h.maxNs.Load()
		if int64(d) <= m || h.maxNs.CompareAndSwap(m, int64(d)) {
			return
		}
	}
}

func (h *histogram) snapshot() Histogram {
	out := Histogram{
		Bounds: append([]time.Duration(nil), latencyBounds...),
		Counts: make([]uint64, len(latencyBounds)),
		Count:  h.count.Load(),
		Sum:    time.Duration(h.sumNs.Load()),
		Max:    time.Duration(h.maxNs.Load()),
	}
	var cum uint64
	for i := range latencyBounds {
		cum += h.buckets[i].Load()
		out.Counts[i] = cum
	}
	return out
}

// counters are the proxy's metrics; every field is updated atomically.
type counters struct {
	verdicts       [len(verdictIndex)]atomic.Uint64
	malformed      atomic.Uint64
	shed           atomic.Uint64
	attestErrors   atomic.Uint64
	attestCap      atomic.Uint64
	answerCap      atomic.Uint64
	sessionGone    atomic.Uint64
	tcpRefused     atomic.Uint64
	upstreamErrors atomic.Uint64
	attest         histogram
	upstream       histogram
	// udpLoops and tcpLoops are the serve loops running now (Serve
	// counts each before it starts it, and when it returns).
	udpLoops, tcpLoops atomic.Int64
}

var verdictIndex = [...]string{
	VerdictAllowed, VerdictDenied, VerdictRefused, VerdictServfail,
	VerdictPinned, VerdictFormerr, VerdictNotImp,
}

func (c *counters) countVerdict(v string) {
	for i, name := range verdictIndex {
		if name == v {
			c.verdicts[i].Add(1)
			return
		}
	}
}

// Stats returns a copy of the counters.
func (p *Proxy) Stats() Stats {
	c := &p.stats
	s := Stats{
		Verdicts:       make(map[string]uint64, len(verdictIndex)),
		Malformed:      c.malformed.Load(),
		Shed:           c.shed.Load(),
		AttestErrors:   c.attestErrors.Load(),
		AttestCap:      c.attestCap.Load(),
		AnswerCap:      c.answerCap.Load(),
		SessionGone:    c.sessionGone.Load(),
		TCPRefused:     c.tcpRefused.Load(),
		UpstreamErrors: c.upstreamErrors.Load(),
		Sessions:       p.sessions.len(),
		Attest:         c.attest.snapshot(),
		Upstream:       c.upstream.snapshot(),
		UDPReaders:     int(c.udpLoops.Load()),
		TCPAcceptors:   int(c.tcpLoops.Load()),
	}
	for i, name := range verdictIndex {
		s.Verdicts[name] = c.verdicts[i].Load()
	}
	s.InFlight, s.Queued = p.sched.load()
	return s
}

// Serving reports whether the proxy reads queries: nil while at least one
// UDP reader and one TCP accept loop run. It fails before the first Serve,
// after Shutdown, and once a socket failed for good (which ends every loop
// of its Serve call).
func (p *Proxy) Serving() error {
	u, t := p.stats.udpLoops.Load(), p.stats.tcpLoops.Load()
	switch {
	case p.isClosed():
		return errors.New("dns proxy: shut down")
	case u == 0 && t == 0:
		return errors.New("dns proxy: not serving: no udp reader and no tcp accept loop runs")
	case u == 0:
		return errors.New("dns proxy: no udp reader runs")
	case t == 0:
		return errors.New("dns proxy: no tcp accept loop runs")
	}
	return nil
}
