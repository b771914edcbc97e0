package api

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// WhyAnswer is the body of GET /v1/sessions/{name}/why?dest=DEST: what the
// session's policy does with a destination now, and why, from the daemon's
// own data and the kernel's sets. DEST is a name or an IPv4 address, with
// an optional :PORT and /PROTO (tcp or udp; tcp when only a port is given).
type WhyAnswer struct {
	Session string `json:"session"`
	Dest    string `json:"dest"`
	// Verdict is the verdict of the destination as asked: WhyAllowed,
	// WhyDropped, WhyRejected (the session's on-deny answers what its
	// policy refuses) or WhyNXDomain (a name the policy does not allow: the
	// proxy answers NXDOMAIN and never asks upstream). For a name it is
	// dropped or rejected as soon as one address the guest gets is, on the
	// port asked (Reason and Detail are then that address's); Addrs has
	// each address's own answer.
	Verdict string `json:"verdict"`
	// Reason is one word: for a drop the same as the flow events'
	// (not-allowed, port, special-purpose, resolver, no-network), for an
	// accept static, attested, pinned, public or lab-peer; for a name
	// allowed or not-allowed.
	Reason string `json:"reason"`
	Detail string `json:"detail"` // one line a person reads
	// Entry is the policy entry that decides, when one does.
	Entry string `json:"entry,omitempty"`
	// Addrs are, for a name the policy allows, what it resolves to now
	// (through the daemon's upstreams) and each address's own answer.
	Addrs []WhyAddr `json:"addrs,omitempty"`
	// AttestedName and AttestedType, for an address a DNS answer opened:
	// the name asked and the record type whose answer carried the address
	// (A, or HTTPS and SVCB for an ipv4hint).
	AttestedName string `json:"attested_name,omitempty"`
	AttestedType string `json:"attested_type,omitempty"`
}

// WhyAddr is the answer for one address of a resolved name.
type WhyAddr struct {
	IP      string     `json:"ip"`
	Verdict string     `json:"verdict"`
	Reason  string     `json:"reason"`
	Detail  string     `json:"detail"`
	Expires *time.Time `json:"expires,omitempty"` // an attested element's expiry
	// As in WhyAnswer: the name and record type whose answer opened it.
	AttestedName string `json:"attested_name,omitempty"`
	AttestedType string `json:"attested_type,omitempty"`
}

// Verdicts of a WhyAnswer.
const (
	WhyAllowed  = "allowed"
	WhyDropped  = "dropped"
	WhyRejected = "rejected"
	WhyNXDomain = "nxdomain"
)

func (a *server) why(w http.ResponseWriter, r *http.Request) {
	dest := r.URL.Query().Get("dest")
	if dest == "" {
		writeError(w, http.StatusBadRequest, CodeBadRequest, "dest: want ?dest=NAME|IP[:PORT][/tcp|udp]")
		return
	}
	ans, err := a.e.Why(r.Context(), r.PathValue("name"), dest, r.URL.Query().Get("sni"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSONStatus(w, http.StatusOK, ans)
}

// Why asks what the session's policy does with dest (NAME|IP[:PORT][/PROTO]) now, and why.
func (c *Client) Why(ctx context.Context, name, dest string) (WhyAnswer, error) {
	return c.WhySNI(ctx, name, dest, "")
}

// WhySNI is Why for a TCP flow to dest that asks for the name sni (a TLS
// server_name or HTTP Host): reason name-mismatch, with the entry the
// policy lacks, when the name check would refuse it. sni "" is Why.
func (c *Client) WhySNI(ctx context.Context, name, dest, sni string) (WhyAnswer, error) {
	var ans WhyAnswer
	q := url.Values{"dest": {dest}}
	if sni != "" {
		q.Set("sni", sni)
	}
	err := c.call(ctx, http.MethodGet, sessionPath(name, "why")+"?"+q.Encode(), nil, &ans)
	return ans, err
}
