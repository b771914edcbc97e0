// Package nft is the nftables table that enforces netpolicy's policies from
// the daemon's network namespace: its rules and sets (firewall_rules.go,
// firewall_sets.go, elements.go: the desired state as plain values, tested
// byte for byte and against a schema), the per-session batches (AddSession,
// RemoveSession, UpdateSession, CutFlows), the counted limits of a session
// (limits.go: connection grants and byte budgets), the attests (group-committed,
// with the known index that lets an answer skip the kernel and the monitor
// that forgets what others delete), the counters, the drop log (DropLog,
// droprules.go) and the conntrack flusher of removed sessions.
//
// It is a package apart from netpolicy because it is the kernel layer of a
// pure core: everything here talks to the kernel through google/nftables
// on netlink sockets bound to the daemon's netns by fd, or through the
// small netfilter clients of internal/nfnetlink; netpolicy itself does no
// I/O. See netpolicy's doc for the enforcement model and the choices
// beyond the brief.
package nft
