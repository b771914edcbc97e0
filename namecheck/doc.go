// Package namecheck decides, from the first bytes a guest sends on a TCP
// flow, which name the flow asks for: a TLS ClientHello's server_name
// (Inspect), an HTTP/1.x request's Host and absolute-form authority, or
// none (any other protocol, a ClientHello without server_name); and, for
// a QUIC flow (UDP/443 under --quic check), the server_name of the
// ClientHello in its Initial packets (QUICHello: RFC 9001 keys derived
// from the Destination Connection ID, CRYPTO frames reassembled). It
// reassembles those bytes by TCP sequence number (Stream: split,
// duplicated, retransmitted and out-of-order segments; an overlap that
// changes a byte seen before is a conflict) within fixed bounds, and keeps
// the per-flow state of the check (Checker): which queued packets are
// held, and the verdict each gets once the name is known. Packets are
// IPv4 or IPv6 (a flow is keyed by its family's 5-tuple); a guest's IPv6
// packet with extension headers before its transport header refuses its
// flow instead of being read past.
//
// It exists apart from the daemon and the table because it is the part of
// the name check an attacker feeds directly (every byte comes from the
// guest): pure parsing and decision, no I/O, fuzzed (fuzz_test.go), so the
// kernel glue (netpolicy/nft's rules, internal/nfnetlink's NFQUEUE client,
// the daemon's loop) stays thin. What a name is allowed is the caller's
// (Judge): the daemon answers with the session's policy, the same test the
// DNS proxy applies.
//
// Invariants: a packet carrying payload of an undecided flow is never
// accepted; it is held (no verdict) until the flow is decided, and then
// either every held packet passes or none does. A flow whose first byte
// is unknown (its SYN was not seen: the daemon restarted) is refused, not
// passed. Limits, stated: only the first request of a flow is read (a
// keep-alive connection's later requests, and anything inside TLS, are
// not); a ClientHello without server_name passes.
package namecheck
