// Package netpolicy is the egress policy of a session network as plain
// values: the policy language (modes, allow and deny entries, scope URLs,
// lab peers, inbound-from-host ports, the on-deny answer) and its
// validation, the SSRF guard (the single table of IPv4 special-purpose
// ranges), the targets a policy resolves to, the drop reasons, and the
// attester's contract (Attestation, ErrAttestCap). It does no I/O and
// links no nftables and no netlink (internal/depaware's
// TestPolicyLanguageIsPure checks): the DNS proxy uses it without the
// table.
//
// The nftables table that enforces it is package netpolicy/nft; the
// netfilter netlink clients the table reads the kernel with (ctnetlink,
// NFLOG, set-element reads) are internal/nfnetlink.
//
//   - policy.go, entry.go, name.go, scope.go, validate.go, inbound_ports.go:
//     parsing and validation.
//   - ranges.go: the special-purpose table, the Guard built from it, and the
//     interval arithmetic behind the table's drop set (BlockedRanges).
//   - targets.go: the static and deny targets of a policy.
//   - reasons.go: why the table drops a packet.
//
// The enforcement model below is netpolicy/nft's, described here because
// it is what the policy means in the kernel.
//
// # Enforcement model
//
// One table "inet <prefix>" whose chains never change per session (see
// buildRules for every rule), but for the counted limits of the sessions
// that have any (nft's limits.go: two chains, quotas and sets of their own,
// reached through verdict maps keyed by the guest). Every per-session fact is an element of a set
// shared by all sessions and keyed by the session's guest address: the
// interface/address pair (anti-spoofing), public mode, lab peers, attested
// addresses (with per-element timeouts), static targets, and per-session
// counters. A packet therefore costs a fixed number of set lookups whatever
// the number of sessions, an attest is one element insert, and adding or
// removing a session is one batch of element changes that never touches
// another session's state. Established and related traffic is accepted
// first, so only the first packet of a connection walks the policy.
//
// # Choices beyond the brief
//
//   - Static targets are split by shape: single addresses in hash sets
//     (static, static_ports), CIDRs in concatenated interval sets
//     (static_cidr, static_cidr_ports). The kernel's concatenated interval
//     type (pipapo) clones its lookup table on every change, which made
//     AddSession grow with the number of sessions; hash inserts stay flat.
//   - The input chain checks iifname . ip saddr against @sessions too, so a
//     guest cannot query the DNS proxy under another session's address.
//   - Accepted counters include established packets (a rule in forward
//     updates the session's counter once iifname . ip saddr is known); they
//     count traffic from the session, not replies to it.
//   - ParseScope takes the Guard like ParseEntry, so an IPv4 scope host is
//     judged by the daemon's public overrides.
//   - Concurrent Attest calls are group-committed (groupCommit): one Flush
//     per batch of calls that queued while the previous batch was in
//     flight, each call returning after its batch's ack, each call's
//     elements retried alone if a shared batch fails.
//   - RemoveSession deletes by key (the rules it is given, an in-memory
//     index of attested elements seeded at Ensure, a dump of the small
//     peers set) and falls back to dumping every session set only when the
//     kernel rejects that batch (ENOENT) or only the guest is known. The
//     index assumes the Firewall is its table's only writer.
package netpolicy
