// Package dnsproxy owns the one host-side DNS listener every session uses.
//
// The proxy listens (UDP and TCP) on the DNS anycast address in the daemon's
// network namespace. The source address of a query names the session: it is
// looked up in an immutable snapshot of the registered sessions, swapped
// atomically when sessions come and go, with no lock on the answer path. A
// query from an unknown source gets REFUSED.
//
// For a known session the query name is matched against the session's allow
// entries (exact, "*.x.y" one more label, "**.x.y" one or more labels) in a
// trie of reversed labels. Off-policy names get NXDOMAIN and never leave the
// host. Allowed names (every name in public mode) are forwarded to the
// upstream resolvers; the answer is filtered (A records kept only for
// public-unicast addresses, CNAME chains followed, AAAA removed, SVCB/HTTPS
// hints reduced to public IPv4) and every kept address is attested into the
// session's firewall set through the Attester, in one call, before the answer
// is released. Answer TTLs are lowered below the attestation timeout so no
// guest cache outlives its attestation. A failed attestation turns the
// answer into SERVFAIL. Pinned names are answered from the pinned addresses
// without contacting an upstream.
//
// Upstream queries go over a few long-lived connected UDP sockets per
// upstream (made with the caller's Dial function, replaced after an error
// and after a few thousand queries): each query gets a random id not in
// flight on its socket, and an answer reaches a query only when both its id
// and its question match; anything else is dropped. A truncated answer is
// asked again over a fresh TCP connection. There is no answer cache: every
// answer comes from an upstream and is attested.
//
// Every decision is reported to an EventSink and counted (see Stats).
//
// The proxy does not create sockets in other namespaces and does not touch
// the kernel's firewall itself: the caller hands it the listening sockets
// (Serve) and a Dial function for upstream sockets, and an Attester that owns
// the nftables sets.
package dnsproxy
