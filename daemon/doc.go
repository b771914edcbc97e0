// Package daemon is enforcerd's session lifecycle: its Engine composes
// the four domain packages (nsmgr: netns, veth pairs and /30s; netpolicy:
// the nftables table; dnsproxy: the one DNS listener; container:
// libcontainer sandboxes) into the api.Engine the API serves.
//
// It owns the order of every multi-package operation (create, delete,
// update, reconcile and adopt after a restart, reap), the building and
// validation of a session's policy from a request, pinning, why, execs,
// images and the state store (one record per session under the state
// dir). What it records goes to the event log (daemon/eventlog), the
// flows the table admitted to each session's ledger of admissions
// (daemon/ledger, fed by the kernel's conntrack events: flowledger.go); the
// name check's loop reads the table's name queue, asks package namecheck,
// answers with the session's policy and sends the verdicts (namecheck.go); what it
// counts is read by the metrics (daemon/metrics) at scrape time. It
// reaches the domain packages through the small interfaces it declares
// (Network, Firewall, Resolver, Sandboxes in daemon.go): Open wires the
// real ones, and the state-machine tests drive recording fakes.
//
// It knows nothing of flags, TOML, sockets or systemd: cmd/enforcerd turns
// the command line into a Config and serves the Engine with package api.
// The host checks are package doctor's, the collector's heap floor
// internal/gctune's.
package daemon
