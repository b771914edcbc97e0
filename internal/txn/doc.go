// Package txn is the undo log of a multi-step change: every step that
// changed something pushes how to take it back, and a failure unwinds them
// in reverse, returning every undo that failed.
//
// It is the one undo log of enforcerd: nsmgr's Create (netns, veth,
// addresses) and the daemon's session Create (network, rules, DNS
// registration, sandbox) both use it. It lives in internal/ because the
// domain packages may not import each other or the daemon, and a second
// copy would drift: one of them once only logged its failed undos, so a
// caller learned a create had failed but not that it had left something
// behind.
package txn
