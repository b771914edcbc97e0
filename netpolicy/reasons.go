package netpolicy

// Drop reasons: why the table dropped a packet of a session. Each drop point
// of the table goes through the chain of its reason, which counts the packet
// in @acct_reason (every packet, exactly: the counts never depend on the
// log's rate limit) and, for the first packet of a flow only, logs it to
// NFLOG behind the session's log budget (@lograte).
const (
	ReasonNotAllowed     = "not-allowed"     // nothing allows the destination (no entry, nothing attested)
	ReasonPort           = "port"            // the destination is allowed on other ports only
	ReasonSpecialPurpose = "special-purpose" // the SSRF guard: a blocked range (Guard.BlockedBy names it)
	ReasonResolver       = "resolver"        // DNS or DoT to anything but the proxy
	ReasonSpoofed        = "spoofed"         // a source address that is not the session's
	ReasonInbound        = "inbound"         // a connection opened towards the session
	ReasonRateLimit      = "rate-limit"      // over the flow cap or the new-flow rate
	ReasonDenied         = "denied"          // a deny entry names the destination
	// ReasonNameMismatch: the name check refused the flow: the name it
	// asked for (TLS server_name, HTTP Host) is not allowed on the port,
	// or could not be read within the bounds (the table counts every
	// packet of such a flow under this reason; the daemon's flow event
	// says which).
	ReasonNameMismatch = "name-mismatch"
	// ReasonQUIC: UDP/443 to a name-admitted address of a session whose
	// name check is on: QUIC's name is not checked, so clients fall back
	// to TCP, where it is.
	ReasonQUIC = "quic"
)

// AnsweredReason reports whether drops of reason go to the session's
// --on-deny answer (reject, reset): spoofed and inbound packets, and
// rate-limited flows, are always dropped in silence (answering a flood or
// a spoofed address would only add to it, or reach someone else).
func AnsweredReason(reason string) bool {
	switch reason {
	case ReasonSpoofed, ReasonInbound, ReasonRateLimit:
		return false
	}
	return true
}

// Reasons lists every drop reason.
var Reasons = []string{ReasonNotAllowed, ReasonPort, ReasonSpecialPurpose, ReasonResolver, ReasonSpoofed, ReasonInbound, ReasonRateLimit, ReasonDenied, ReasonNameMismatch, ReasonQUIC}
