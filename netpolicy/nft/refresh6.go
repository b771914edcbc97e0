package nft

import (
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// The refresh of a dual-stack session's AAAA-attested elements (issue 26),
// the twin of the v4 one (see buildRules and liveSets): on a dual-stack
// daemon with the refresh on (FirewallConfig.AttestMaxLifetime),
//
//	from_session6
//	  KEY6 @attested6_ports update @attested6_ports_live { KEY6 timeout REFRESH }
//	  KEY6 @attested6_ports goto accept_named6
//	  KEY6 @attested6_ports_live update @attested6_ports_live { KEY6 timeout REFRESH } goto accept_named6
//	  ...
//	  ip6 saddr . ip6 daddr @attested6 update @attested6_live { ip6 saddr . ip6 daddr timeout REFRESH }
//	  ip6 saddr . ip6 daddr @attested6 goto accept_named6
//	  ip6 saddr . ip6 daddr @attested6_live update @attested6_live { ip6 saddr . ip6 daddr timeout REFRESH } goto accept_named6
//
// A new v6 flow admitted by an AAAA-attested element creates or refreshes
// its key in the live set; a live element admits and refreshes itself, and
// goes through the name check as the attested one does. The daemon's
// sweep (SweepRefreshed) deletes every live v6 element no answer of this
// process justified within the maximum lifetime, whose name an update
// revoked, or whose session is gone; removing a session deletes its live
// elements with its other v6 ones (sessionSets6). While justified, an
// element counts against the v6 attested-element cap (attestcap6.go), as
// the v4 index counts its refreshed elements.
const (
	setAttested6Live      = "attested6_live"       // ipv6_addr . ipv6_addr, dynamic, timeout: attested6 elements kept alive by use
	setAttested6PortsLive = "attested6_ports_live" // the same for attested6_ports
)

// live6Sets are the live copies of attested6 and attested6_ports
// (live6Sets[i] of attested6Sets[i]), keyed as they are.
var (
	attested6Sets = []string{setAttested6, setAttested6Ports}
	live6Sets     = []string{setAttested6Live, setAttested6PortsLive}
)

// live6Of returns the live set of a v6 attested set, if it has one.
func live6Of(set string) (string, bool) {
	for i, s := range attested6Sets {
		if s == set {
			return live6Sets[i], true
		}
	}
	return "", false
}

// addLiveSets6 adds the v6 live sets to a dual-stack daemon's schema (made
// whether or not the refresh is on, as the v4 ones are: a restart that
// turns it on or off keeps the table's sets).
func addLiveSets6(add func(*nftables.Set)) {
	add(&nftables.Set{Name: setAttested6Live, KeyType: typeGuestPeer6, Concatenation: true, HasTimeout: true, Dynamic: true, Size: attestedSetSize})
	add(&nftables.Set{Name: setAttested6PortsLive, KeyType: typeGuestPort6, Concatenation: true, HasTimeout: true, Dynamic: true, Size: attestedSetSize})
}

// attested6Rules adds the rules accepting new v6 flows by an attested6
// element (with ports, attested6_ports) and, with the refresh on, those
// refreshing and accepting by its live element (refreshedAccepts).
func (env ruleEnv) attested6Rules(add6 func(string, ...[]expr.Any), ports bool) {
	lookup, set, live := env.lookupPair6, setAttested6, setAttested6Live
	if ports {
		lookup, set, live = env.lookupPorts6, setAttested6Ports, setAttested6PortsLive
	}
	env.refreshedAccepts(func(parts ...[]expr.Any) { add6(chainFromSession6, parts...) }, lookup, set, live, chainAcceptNamed6)
}

// noteAnswer6 records that an answer attested the v6 elements of plan at
// now (after the kernel acked them, or known to be there): their refresh
// is justified for the maximum lifetime from now, during which they count
// against the v6 cap.
func (f *Firewall) noteAnswer6(guest netip.Addr, plan []setElems, now time.Time) {
	if f.attested.maxLife <= 0 {
		return
	}
	f.attested6.justify(guest, plan, now.Add(f.attested.maxLife))
}

// sweptLiveSets are the live sets SweepRefreshed dumps: the v4 ones and,
// on a dual-stack daemon, the v6 ones.
func (f *Firewall) sweptLiveSets() []string {
	if !f.dualStack() {
		return liveSets
	}
	return append(append([]string(nil), liveSets...), live6Sets...)
}

// liveJustified reports whether the element of the live set name with key
// may stay (see SweepRefreshed).
func (f *Firewall) liveJustified(name string, key []byte, now time.Time) bool {
	for i, live := range live6Sets {
		if live != name {
			continue
		}
		if len(key) < 16 {
			return false
		}
		g, ok := f.guest4Of6(netip.AddrFrom16([16]byte(key[:16])))
		return ok && f.attested6.justified(g, attested6Sets[i], key, now)
	}
	g, ok := keyGuest(name, key)
	return ok && f.attested.justified(g, name, key, now)
}
