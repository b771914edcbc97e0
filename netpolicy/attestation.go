package netpolicy

// The attester's contract, shared by the DNS proxy (which attests) and the
// table (which holds what was attested), so that the proxy needs nothing of
// the table's package.

import (
	"errors"
	"net/netip"
)

// Attestation is what one DNS answer attested for a session: its addresses
// with the port constraint they were attested with (the arguments of
// Attest). The DNS proxy keeps them per name, so that an update can tell
// which attested elements its new policy no longer justifies.
type Attestation struct {
	Addrs []netip.Addr
	Ports []PortSpec
}

// ErrAttestCap is wrapped by Attest's error when the session already holds
// the firewall's per-session cap (nft.FirewallConfig.MaxAttested) live attested elements and the call would add
// more: the answer must fail (SERVFAIL), never pass unattested, and the cap
// is reported (an event and a metric), never silent.
var ErrAttestCap = errors.New("per-session cap on attested addresses reached")
