package api

import (
	"context"
	"net/http"
	"time"
)

// LedgerReport is the body of GET /v1/sessions/{name}/report: the session's
// ledger of admissions (every flow the table admitted, chained record to
// record by SHA-256), verified, and summed per destination. A removed
// session has one while its files are retained (--events-retention).
type LedgerReport struct {
	Session string `json:"session"`
	// Verified is true when every record's hash is the SHA-256 of the
	// previous record's hash and its own canonical JSON, the sequence has
	// no gap, and the file ends where the running daemon last wrote.
	Verified bool `json:"verified"`
	// Broken says where and how the chain breaks (empty when Verified).
	Broken string `json:"broken,omitempty"`
	// Records is the number of records read; Head the last one's hash
	// (anchor it elsewhere, e.g. the journal, to detect a rewrite).
	Records int    `json:"records"`
	Head    string `json:"head,omitempty"`
	// Aggregated is how many flows were recorded in aggregate records
	// only (past the session's line budget): counted, without lines.
	Aggregated   uint64              `json:"aggregated,omitempty"`
	Destinations []LedgerDestination `json:"destinations"`
}

// LedgerDestination is one destination the session reached under one
// entry and policy generation.
type LedgerDestination struct {
	Dest  string `json:"dest"`            // the IPv4 address
	Port  uint16 `json:"port,omitempty"`  // 0 for a protocol without ports
	Proto string `json:"proto"`           // tcp, udp, icmp or the number
	Via   string `json:"via"`             // static, pinned, attested, lab-peer, public or unknown
	Entry string `json:"entry,omitempty"` // the policy entry that admitted it, when one did
	// AttestedName is the name whose DNS answer attested the address.
	AttestedName string    `json:"attested_name,omitempty"`
	Generation   uint64    `json:"generation"`
	Connections  uint64    `json:"connections"`
	BytesOut     uint64    `json:"bytes_out"` // sent by the guest
	BytesIn      uint64    `json:"bytes_in"`  // sent to the guest
	First        time.Time `json:"first"`
	Last         time.Time `json:"last"`
}

func (a *server) report(w http.ResponseWriter, r *http.Request) {
	rep, err := a.e.Report(r.Context(), r.PathValue("name"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSONStatus(w, http.StatusOK, rep)
}

// Report returns the session's verified ledger of admissions, summed per
// destination; a broken chain is a report with Verified false, not an error.
func (c *Client) Report(ctx context.Context, name string) (LedgerReport, error) {
	var rep LedgerReport
	err := c.call(ctx, http.MethodGet, sessionPath(name, "report"), nil, &rep)
	return rep, err
}
