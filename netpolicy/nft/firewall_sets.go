package nft

import (
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
)

// Set names in the table. Every per-session set is shared by all sessions and
// keyed by the session's guest address first, so the kernel does one hash or
// interval lookup per set whatever the number of sessions.
//
// Static destinations are split by shape. Single addresses (pinned hosts,
// /32 entries) go to hash sets, whose insert cost is flat. CIDRs need a
// concatenated interval set (the kernel's pipapo type), and pipapo clones
// its whole lookup table on every transaction that changes it: measured
// here, adding a session with one CIDR cost ~160 us with 10 sessions loaded
// and ~315 us with 4000, against ~90 us flat without. Keeping the common
// case out of pipapo keeps AddSession flat; sessions with CIDR entries pay
// an insert cost that grows with all sessions' CIDR elements.
const (
	setSessions          = "sessions"            // ifname . ipv4_addr: host veth . guest (anti-spoofing, known interfaces)
	setPublic            = "public"              // ipv4_addr: guests in public mode
	setBlocked           = "blocked"             // ipv4_addr interval: Guard.Blocked()
	setPeers             = "peers"               // ipv4_addr . ipv4_addr: guest . lab peer guest
	setAttested          = "attested"            // ipv4_addr . ipv4_addr, timeout: guest . DNS-attested address
	setAttestedPorts     = "attested_ports"      // ipv4_addr . inet_proto . ipv4_addr . inet_service, timeout
	setAttestedLive      = "attested_live"       // ipv4_addr . ipv4_addr, dynamic, timeout: attested elements kept alive by use
	setAttestedPortsLive = "attested_ports_live" // the same for attested_ports
	setStatic            = "static"              // ipv4_addr . ipv4_addr: guest . single static address (pinned, /32 entry)
	setStaticPorts       = "static_ports"        // ipv4_addr . inet_proto . ipv4_addr . inet_service: the same with a port
	setStaticCIDR        = "static_cidr"         // ipv4_addr . ipv4_addr interval: guest . CIDR (shorter than /32)
	setStaticCIDRPorts   = "static_cidr_ports"   // ipv4_addr . inet_proto . ipv4_addr . inet_service interval
	setAcctAccept        = "acct_accept"         // ipv4_addr with a counter per element: guest
	setAcctDrop          = "acct_drop"           // ipv4_addr with a counter per element: guest
	setAcctLimited       = "acct_limited"        // ipv4_addr with a counter per element: new flows over budget
	setAcctReturn        = "acct_return"         // ipv4_addr with a counter per element: guest, traffic to it (replies)
	setFlows             = "flows"               // ipv4_addr, dynamic, ct count per element: tracked flows of a guest
	setFlowRate          = "flowrate"            // ipv4_addr, dynamic, limit per element: new-flow rate of a guest
	setIfaces            = "ifaces"              // map ifname : mark: host veth -> the guest's address bytes (names the session of a spoofed packet)
	setPortHosts         = "port_hosts"          // ipv4_addr . ipv4_addr: guest . address static_ports allows on some port
	setPortCIDRs         = "port_cidrs"          // ipv4_addr . ipv4_addr interval: guest . CIDR static_cidr_ports allows on some port
	setPortAttested      = "port_attested"       // ipv4_addr . ipv4_addr, timeout: guest . address attested_ports allows on some port
	setAcctReason        = "acct_reason"         // ipv4_addr . mark, dynamic, counter: guest . drop reason code
	setLogRate           = "lograte"             // ipv4_addr, dynamic, limit per element: the guest's drop-log budget
	setDenied            = "denied"              // ipv4_addr . ipv4_addr interval: guest . denied address or CIDR
	setDeniedPorts       = "denied_ports"        // ipv4_addr . inet_proto . ipv4_addr . inet_service interval: the same on a port
	setReject            = "reject"              // ipv4_addr: guests whose policy drops are answered (--on-deny reject or reset)
	setReset             = "reset"               // ipv4_addr: of those, guests whose TCP is answered with a reset (--on-deny reset)
	setNameCheck         = "namecheck"           // ipv4_addr: guests whose name-admitted TCP flows are name-checked (--name-check tls)
	setNameCheckPublic   = "namecheck_public"    // ipv4_addr: of those, public-mode guests with deny entries by name: every TCP flow checked
	setNameCheckQUIC     = "namecheck_quic"      // ipv4_addr: of those, guests whose UDP/443 is checked too (--quic check), not refused
	setPinned            = "pinned"              // ipv4_addr . ipv4_addr: guest . address of a pinned name (also in static), under the name check
	setPinnedPorts       = "pinned_ports"        // ipv4_addr . inet_proto . ipv4_addr . inet_service: the same with a port
)

// Chain names in the table.
const (
	chainForward        = "forward"
	chainInput          = "input"
	chainPostrouting    = "postrouting"
	chainFromSession    = "from_session"
	chainAccept         = "accept_session"
	chainAcceptReturn   = "accept_return"
	chainDrop           = "drop_session"
	chainRawPrerouting  = "raw_prerouting"
	chainRawOutput      = "raw_output"
	chainRelated        = "related_session"
	chainPolicy         = "policy"
	chainResolver       = "resolver"
	chainFlowLimit      = "flow_limit"
	chainAcceptNew      = "accept_new"
	chainDropLimited    = "drop_limited"
	chainInputSession   = "input_session"
	chainDropNotAllowed = "drop_not_allowed"
	chainDropPort       = "drop_port"
	chainDropSpecial    = "drop_special"
	chainDropResolver   = "drop_resolver"
	chainDropSpoofed    = "drop_spoofed"
	chainDropInbound    = "drop_inbound"
	chainDropDenied     = "drop_denied"
	chainDropPolicy     = "drop_policy"
	chainReject         = "reject_session"
	chainAcceptNamed    = "accept_named"
	chainNameQueue      = "name_queue"
	chainDropName       = "drop_name"
	chainDropQUIC       = "drop_quic"
)

var (
	typeGuestPeer  = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr)
	typeGuestPort  = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeIPAddr, nftables.TypeInetService)
	typeIfaceGuest = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)
	typeGuestMark  = nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeMark)
)

// schema holds the client-side descriptions of the table's sets. The flags
// matter on the client too: google/nftables only encodes element timeouts
// when the Set value has HasTimeout, and only sends KeyEnd for concatenated
// interval sets.
type schema struct {
	table *nftables.Table
	sets  map[string]*nftables.Set
	order []string // creation order
}

// defaultDynSetSize is the kernel's size for a dynamic set declared without
// one; the accounting sets hold one element per session, so a pool with more
// /30 slots than this needs an explicit size.
const defaultDynSetSize = 65535

// attestedSetSize bounds each attested set: about 150 MiB of kernel memory
// at worst, 256 sessions at the default per-session cap.
const attestedSetSize = 1 << 20

func newSchema(tableName string, pool netip.Prefix) *schema {
	t := &nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}
	s := &schema{table: t, sets: map[string]*nftables.Set{}}
	add := func(set *nftables.Set) {
		set.Table = t
		s.sets[set.Name] = set
		s.order = append(s.order, set.Name)
	}
	add(&nftables.Set{Name: setSessions, KeyType: typeIfaceGuest, Concatenation: true})
	add(&nftables.Set{Name: setPublic, KeyType: nftables.TypeIPAddr})
	add(&nftables.Set{Name: setBlocked, KeyType: nftables.TypeIPAddr, Interval: true})
	add(&nftables.Set{Name: setPeers, KeyType: typeGuestPeer, Concatenation: true})
	// The attested sets get a size: the per-session cap (MaxAttested) is
	// the daemon's; this bounds the kernel's memory whatever happens above
	// it (an insert into a full set fails, and the answer with it).
	add(&nftables.Set{Name: setAttested, KeyType: typeGuestPeer, Concatenation: true, HasTimeout: true, Size: attestedSetSize})
	add(&nftables.Set{Name: setAttestedPorts, KeyType: typeGuestPort, Concatenation: true, HasTimeout: true, Size: attestedSetSize})
	// The datapath's refresh of attested elements (see liveSets): it
	// creates and refreshes these from the packet path, so they are
	// dynamic; the DNS answers' own sets are never written by the datapath.
	add(&nftables.Set{Name: setAttestedLive, KeyType: typeGuestPeer, Concatenation: true, HasTimeout: true, Dynamic: true, Size: attestedSetSize})
	add(&nftables.Set{Name: setAttestedPortsLive, KeyType: typeGuestPort, Concatenation: true, HasTimeout: true, Dynamic: true, Size: attestedSetSize})
	add(&nftables.Set{Name: setStatic, KeyType: typeGuestPeer, Concatenation: true})
	add(&nftables.Set{Name: setStaticPorts, KeyType: typeGuestPort, Concatenation: true})
	add(&nftables.Set{Name: setStaticCIDR, KeyType: typeGuestPeer, Concatenation: true, Interval: true})
	add(&nftables.Set{Name: setStaticCIDRPorts, KeyType: typeGuestPort, Concatenation: true, Interval: true})
	var size uint32
	if slots := uint64(1) << (32 - pool.Bits()) / 4; slots > defaultDynSetSize {
		size = uint32(slots)
	}
	add(&nftables.Set{Name: setAcctAccept, KeyType: nftables.TypeIPAddr, Dynamic: true, Counter: true, Size: size})
	add(&nftables.Set{Name: setAcctDrop, KeyType: nftables.TypeIPAddr, Dynamic: true, Counter: true, Size: size})
	add(&nftables.Set{Name: setAcctLimited, KeyType: nftables.TypeIPAddr, Dynamic: true, Counter: true, Size: size})
	add(&nftables.Set{Name: setAcctReturn, KeyType: nftables.TypeIPAddr, Dynamic: true, Counter: true, Size: size})
	// The datapath creates these two elements (with their ct count and
	// limit state); RemoveSession deletes them.
	add(&nftables.Set{Name: setFlows, KeyType: nftables.TypeIPAddr, Dynamic: true, Size: size})
	add(&nftables.Set{Name: setFlowRate, KeyType: nftables.TypeIPAddr, Dynamic: true, Size: size})
	// The drop reasons (see droprules.go). ifaces maps a host veth to its
	// guest, so a spoofed packet is counted and logged for the session whose
	// interface it came in on. The three port_* sets hold, without the port,
	// the addresses a session may reach on some port only, so a drop can say
	// "port" rather than "not-allowed". acct_reason holds up to
	// len(dropReasons)+1 elements per session, created by the datapath.
	// Host order, as nft declares a lone ifname key: without it nft reads the
	// key reversed and prints it empty.
	add(&nftables.Set{Name: setIfaces, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian, IsMap: true, DataType: nftables.TypeMark})
	add(&nftables.Set{Name: setPortHosts, KeyType: typeGuestPeer, Concatenation: true})
	add(&nftables.Set{Name: setPortCIDRs, KeyType: typeGuestPeer, Concatenation: true, Interval: true})
	add(&nftables.Set{Name: setPortAttested, KeyType: typeGuestPeer, Concatenation: true, HasTimeout: true, Size: attestedSetSize})
	reasonSize := uint32(uint64(1) << (32 - pool.Bits()) / 4 * uint64(len(dropCodes)))
	if reasonSize <= defaultDynSetSize {
		reasonSize = 0
	}
	add(&nftables.Set{Name: setAcctReason, KeyType: typeGuestMark, Concatenation: true, Dynamic: true, Counter: true, Size: reasonSize})
	add(&nftables.Set{Name: setLogRate, KeyType: nftables.TypeIPAddr, Dynamic: true, Size: size})
	// Deny entries are interval sets whatever their shape: few sessions
	// have any, and only those pay pipapo's insert cost (see above).
	add(&nftables.Set{Name: setDenied, KeyType: typeGuestPeer, Concatenation: true, Interval: true})
	add(&nftables.Set{Name: setDeniedPorts, KeyType: typeGuestPort, Concatenation: true, Interval: true})
	add(&nftables.Set{Name: setReject, KeyType: nftables.TypeIPAddr, Size: size})
	add(&nftables.Set{Name: setReset, KeyType: nftables.TypeIPAddr, Size: size})
	add(&nftables.Set{Name: setNameCheck, KeyType: nftables.TypeIPAddr, Size: size})
	add(&nftables.Set{Name: setNameCheckPublic, KeyType: nftables.TypeIPAddr, Size: size})
	add(&nftables.Set{Name: setNameCheckQUIC, KeyType: nftables.TypeIPAddr, Size: size})
	add(&nftables.Set{Name: setPinned, KeyType: typeGuestPeer, Concatenation: true})
	add(&nftables.Set{Name: setPinnedPorts, KeyType: typeGuestPort, Concatenation: true})
	add(&nftables.Set{Name: setInboundHost, KeyType: typeGuestService, Concatenation: true}) // see inbound.go
	// The counted limits' chains of the sessions that have any (limits.go).
	add(&nftables.Set{Name: setBudgetChains, KeyType: nftables.TypeIPAddr, IsMap: true, DataType: nftables.TypeVerdict, Size: size})
	add(&nftables.Set{Name: setGrantChains, KeyType: nftables.TypeIPAddr, IsMap: true, DataType: nftables.TypeVerdict, Size: size})
	return s
}

// fresh returns a copy of the named set for an AddSet call (AddSet assigns
// the batch-local ID into the value it is given).
func (s *schema) fresh(name string) *nftables.Set {
	c := *s.sets[name]
	c.ID = 0
	return &c
}
