// Package ledger keeps a session's ledger of admissions: one NDJSON file
// (<state-dir>/events/operator/<name>.ledger.ndjson, the operator's store,
// never rotated) with a record per flow the table admitted (open) and per
// flow that ended (close: duration and bytes each way), each record
// chained to the one before it by a SHA-256 of the previous hash and its
// own canonical JSON. Past a line budget, flows are folded into exact
// per-destination aggregate records (in the chain too): counts and bytes
// are never lost, only lines. Read verifies a file and sums it per
// destination.
//
// It knows nothing of the kernel or of policies: the daemon classifies
// each flow (which entry, which generation) and hands it over.
package ledger
