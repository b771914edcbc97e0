package dnsproxy

import (
	"net/netip"
	"time"
)

// Verdicts: the outcome of one query, as reported in Event.Verdict and
// counted in Stats.Verdicts.
const (
	VerdictAllowed  = "allowed"  // forwarded upstream, answer filtered and attested
	VerdictDenied   = "denied"   // off-policy name: NXDOMAIN, never sent upstream
	VerdictRefused  = "refused"  // unknown source, non-IN class or zone transfer
	VerdictServfail = "servfail" // every upstream failed, the attestation failed (Err names a cap), or the session went away
	VerdictPinned   = "pinned"   // answered from the session's pinned addresses
	VerdictFormerr  = "formerr"  // not exactly one question, or a bad EDNS0 version
	VerdictNotImp   = "notimp"   // an opcode other than QUERY
)

// Event is one decision of the proxy: one query from one client.
//
// Addrs are the addresses released to the client: attested first in
// allowlist mode; in public mode (the public set accepts them) and for a
// pinned name (the static sets hold it) nothing is attested and TTL is
// zero. Dropped are addresses the upstream answered that the guard removed
// (private, loopback, link-local, metadata ...). Capped is how many more
// addresses the answer carried beyond Config.MaxAnswerAddrs: their records
// were removed, never released, never attested. Latency is the upstream
// round trip (zero when no upstream was asked).
type Event struct {
	Time     time.Time     `json:"time"`
	Session  string        `json:"session,omitempty"`
	Client   netip.Addr    `json:"client"`
	Name     string        `json:"name,omitempty"`
	Type     string        `json:"type,omitempty"`
	Verdict  string        `json:"verdict"`
	Rcode    string        `json:"rcode,omitempty"`
	Addrs    []netip.Addr  `json:"addrs,omitempty"`
	Dropped  []netip.Addr  `json:"dropped,omitempty"`
	Upstream string        `json:"upstream,omitempty"`
	Latency  time.Duration `json:"latency_ns,omitempty"`
	TTL      time.Duration `json:"attest_ttl_ns,omitempty"`
	Capped   int           `json:"capped,omitempty"`
	Err      string        `json:"err,omitempty"`
}

// EventSink receives every decision. Record is called on the answer path,
// after the answer is written (over TCP, just before): it must not block
// for long (buffer or drop).
type EventSink interface {
	Record(Event)
}
