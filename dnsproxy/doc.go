// Package dnsproxy owns the one host-side DNS listener every session uses.
//
// The proxy listens (UDP and TCP) on the DNS anycast address in the daemon's
// network namespace. The source address of a query names the session: it is
// looked up in an immutable snapshot of the registered sessions, swapped
// atomically when sessions come and go, with no lock on the answer path. A
// UDP query from an unknown source gets REFUSED.
//
// For a known session the query name is matched against the session's allow
// entries (exact, "*.x.y" one more label, "**.x.y" one or more labels) in a
// trie of reversed labels. Off-policy names get NXDOMAIN and never leave the
// host. Allowed names (every name in public mode) are forwarded to the
// upstream resolvers; the answer is filtered (A records kept only for
// public-unicast addresses, CNAME chains followed, AAAA removed, SVCB/HTTPS
// hints reduced to public IPv4), cut to at most Config.MaxAnswerAddrs
// addresses (the records of the others removed, the cut counted and named
// in the event), and in allowlist mode every kept address is attested into
// the session's firewall set through the Attester, in one call, before the
// answer is released. Answer TTLs are lowered below the attestation timeout
// so no guest cache outlives its attestation. A failed attestation
// (including the firewall's per-session cap, netpolicy.ErrAttestCap) turns
// the answer into SERVFAIL. Public-mode sessions attest nothing: the
// firewall's public set already accepts their traffic to any public
// address. Pinned names are answered from the pinned addresses without an
// upstream and attest nothing either: the static sets hold them with their
// entry's port constraint.
//
// A registration ends with its queries: Unregister (and a Register that
// replaces a session) cancels the session's upstream waits and, once it
// returns, nothing is ever attested for that registration (a per-session
// RWMutex, read-locked only around "not gone, then Attest"; see
// compiledSession). Such queries get SERVFAIL.
//
// Over TCP a connection from a source that is no registered session is
// closed as soon as it is accepted; one session holds at most a few
// connections (its share of the proxy's), and a connection that does not
// bring a whole query within a few seconds is closed.
//
// Upstream queries go over a few long-lived connected UDP sockets per
// upstream (made with the caller's Dial function, replaced after an error
// and after a few thousand queries): each query gets a random id not in
// flight on its socket, and an answer reaches a query only when both its id
// and its question match; anything else is dropped. A query whose socket
// fails under it (a forged ICMP port unreachable leaves ECONNREFUSED on a
// connected UDP socket) is asked again on another socket. A truncated
// answer is asked again over a fresh TCP connection. There is no answer
// cache: every answer comes from an upstream (and, in allowlist mode, is
// attested).
//
// A registered session's query runs under the scheduler (sched.go): a
// bounded number in flight, shared fairly between sessions, each holding
// its slot until its answer is sent. A UDP query that may start at once
// starts on the goroutine that read it: it is parsed, decided and sent
// upstream without waiting, and the goroutine that reads the upstream
// socket finishes it (filter, attest, reply, the event, then the slot's
// release), so the common path wakes no other goroutine. Anything off that path (a
// failed socket, a truncated or refused answer, a timeout, the session's
// end) carries on as over TCP, on a goroutine of its own.
//
// Every decision is reported to an EventSink and counted (see Stats).
//
// The proxy does not create sockets in other namespaces and does not touch
// the kernel's firewall itself: the caller hands it the listening sockets
// (Serve) and a Dial function for upstream sockets, and an Attester that owns
// the nftables sets.
//
// Limits, stated:
//   - A name with more than MaxAnswerAddrs addresses is answered with the
//     first MaxAnswerAddrs of them, in the upstream's order.
//   - The TCP slots are shared (1024 in all, 8 per session): sessions acting
//     together (128 of them) can still hold every slot until the idle
//     timeout closes their connections; UDP is unaffected.
//   - A query is sent on at most 3 sockets per upstream try: a sender that
//     can forge an ICMP error for every retry still fails it. Keeping
//     sessions from relating to the proxy's flows is the firewall's job.
package dnsproxy
