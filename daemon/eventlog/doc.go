// Package eventlog is the sessions' event log: each live session's ring
// (its operator records for the session's life and a bounded sample of its
// guest-driven events with their exact counts, eventtally.go), the fan-out
// to followers of one session or of every session, the on-disk store (one
// writer goroutine, operator records apart from the rotated guest sample,
// eventstore.go) and the hand-written NDJSON encoder (eventjson.go, held to
// encoding/json by a differential fuzz target).
//
// It is a package because it is a job of its own with its own invariants
// (Record never blocks on a follower; an operator record is acknowledged
// only once written; no guest flood can push an operator record out), and
// because the bench drives it as a library. It knows sessions only by
// name and labels: nothing here touches the kernel, and the lifecycle
// (package daemon) decides what is recorded and when a ring opens and
// closes.
package eventlog
