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
// Every decision is reported to an EventSink and counted (see Stats).
//
// The proxy does not create sockets in other namespaces and does not touch
// the kernel's firewall itself: the caller hands it the listening sockets
// (Serve) and a Dial function for upstream sockets, and an Attester that owns
// the nftables sets.
package dnsproxy
