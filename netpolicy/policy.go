package netpolicy

import (
	"fmt"
	"net/netip"
	"strconv"
)

// Mode is a session's egress mode.
type Mode string

const (
	// ModeNone: the session has only a loopback interface; nothing leaves.
	ModeNone Mode = "none"
	// ModeAllowlist: only the allow entries (DNS-attested names, CIDRs,
	// pinned addresses) and lab peers are reachable.
	ModeAllowlist Mode = "allowlist"
	// ModePublic: every public unicast IPv4 destination is reachable; the
	// special-purpose ranges stay dropped.
	ModePublic Mode = "public"
)

// ParseMode parses an egress mode name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeNone, ModeAllowlist, ModePublic:
		return m, nil
	}
	return "", fmt.Errorf("egress mode %q: want none, allowlist or public", s)
}

// Proto is a transport protocol of a port constraint.
type Proto string

const (
	// ProtoAny is TCP and UDP (with a port) or any protocol (without one).
	ProtoAny Proto = ""
	ProtoTCP Proto = "tcp"
	ProtoUDP Proto = "udp"
)

// Number returns the IANA protocol number (0 for ProtoAny).
func (p Proto) Number() uint8 {
	switch p {
	case ProtoTCP:
		return 6
	case ProtoUDP:
		return 17
	}
	return 0
}

// PortSpec is one port constraint. Port 0 means "any port, any protocol"
// and then Proto is ProtoAny.
type PortSpec struct {
	Port  uint16
	Proto Proto
}

func (p PortSpec) String() string {
	if p.Port == 0 {
		return ""
	}
	s := ":" + strconv.Itoa(int(p.Port))
	if p.Proto != ProtoAny {
		s += "/" + string(p.Proto)
	}
	return s
}

// EntryKind says what an allow entry matches.
type EntryKind int

const (
	// KindHost matches exactly one DNS name.
	KindHost EntryKind = iota
	// KindWildcard (*.example.com) matches names with exactly one more label.
	KindWildcard
	// KindMultiWildcard (**.example.com) matches names with one or more more labels.
	KindMultiWildcard
	// KindCIDR matches an IPv4 prefix (a bare address is a /32).
	KindCIDR
)

func (k EntryKind) String() string {
	switch k {
	case KindHost:
		return "host"
	case KindWildcard:
		return "wildcard"
	case KindMultiWildcard:
		return "multi-wildcard"
	case KindCIDR:
		return "cidr"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Entry is one validated allow entry. Invariants (guaranteed by ParseEntry):
// Name is a normalised ASCII name (lower-case, punycode, no trailing dot) for
// the name kinds and empty for KindCIDR; for wildcards it is the suffix
// without "*." or "**." and has at least two labels; Prefix is valid and
// masked for KindCIDR and zero otherwise; Proto is ProtoAny when Port is 0.
type Entry struct {
	Kind   EntryKind
	Name   string
	Prefix netip.Prefix
	PortSpec
	// NoHints: the DNS proxy attests only the A records of the names this
	// entry allows, never the ipv4hint addresses of their SVCB/HTTPS
	// records (which could point anywhere). Scope entries set it: a scope
	// is "this host and nothing else".
	NoHints bool
}

// Policy is a session's egress policy.
//
// Decisions: ModeNone takes no allow entries and no lab peers (the session has
// no interface, so they could never apply; saying so beats ignoring them).
// ModePublic accepts allow entries although they add no reach: a profile can
// switch between allowlist and public without editing its list, and the DNS
// proxy may still use them. An empty allowlist allows nothing.
type Policy struct {
	Egress Mode
	Allow  []Entry
	// LabPeers names other sessions this one may open connections to (their
	// guest addresses and every port); replies flow back, nothing else does.
	LabPeers []string
	// Lab marks this session as a lab target: other sessions may name it in
	// their LabPeers. The daemon enforces the pairing; the firewall only sees
	// addresses.
	Lab bool
	// Deny wins over every allow, in every mode (public, attested, static,
	// lab peers): a name entry is answered NXDOMAIN and never sent upstream
	// (Guard.ParseDeny: names take no port), an address or CIDR entry is
	// dropped in the kernel before any accept and removed from DNS answers.
	Deny []Entry
	// OnDeny is what a packet the session's policy drops gets (--on-deny).
	OnDeny DenyAnswer
	// NameCheck is whether the TCP flows the table admits because of a
	// name have the name they ask for (TLS server_name, HTTP Host)
	// checked against this policy (--name-check).
	NameCheck NameCheck
	// QUIC is what the name check does with UDP/443 to a name-admitted
	// address: refuse (the default) or check its Initial's server_name.
	// Only meaningful under NameCheckTLS.
	QUIC QUIC
	// InboundFromHost are the ports on which the host (the daemon's netns:
	// the node, e.g. a kubelet's probes) may open connections into the
	// session. Empty: none, every connection from the host is dropped.
	InboundFromHost []PortSpec
}

// DenyAnswer is what a packet a session's policy drops gets. The zero
// value is DenyDrop: a record written before the answer was chosen per
// session (no on_deny) meant silence, and keeps meaning it.
type DenyAnswer uint8

const (
	// DenyDrop: silence. A client waits for its own timeout (a connect
	// retries its SYN for ~130 s; nmap says filtered).
	DenyDrop DenyAnswer = iota
	// DenyReject: ICMP destination unreachable, administratively
	// prohibited (type 3 code 13), for every protocol. Linux fails a
	// connect at once with EHOSTUNREACH ("No route to host"); scanners
	// say filtered, not closed.
	DenyReject
	// DenyReset: a TCP reset for TCP (a connect fails with ECONNREFUSED,
	// the port looks closed), ICMP administratively prohibited otherwise.
	DenyReset
)

// String is the --on-deny spelling: drop, reject or reset.
func (d DenyAnswer) String() string {
	switch d {
	case DenyReject:
		return "reject"
	case DenyReset:
		return "reset"
	}
	return "drop"
}

// Answers reports whether the session answers its policy's drops (reject
// or reset) instead of staying silent.
func (d DenyAnswer) Answers() bool { return d == DenyReject || d == DenyReset }

// ParseDenyAnswer reads an --on-deny value: drop, reject or reset.
func ParseDenyAnswer(s string) (DenyAnswer, error) {
	switch s {
	case "drop":
		return DenyDrop, nil
	case "reject":
		return DenyReject, nil
	case "reset":
		return DenyReset, nil
	}
	return DenyDrop, fmt.Errorf("--on-deny %q: want drop, reject or reset", s)
}

// NameCheck is whether a session's name-admitted TCP flows are checked
// for the name they ask for. The zero value is NameCheckTLS: a record
// written before the check existed is checked, as a new session is by
// default ("a name means that name").
type NameCheck uint8

const (
	// NameCheckTLS: the first bytes of a TCP flow the table admits
	// because of a name (an attested address; in public mode, every TCP
	// flow of a session with deny entries by name) are read before any
	// leaves the host, and a TLS ClientHello's server_name or an HTTP/1.x
	// Host the policy does not allow on that port ends the flow.
	NameCheckTLS NameCheck = iota
	// NameCheckOff: L3 only, as before the check (any name on an
	// attested address passes).
	NameCheckOff
)

// String is the --name-check spelling: tls or off.
func (n NameCheck) String() string {
	if n == NameCheckOff {
		return "off"
	}
	return "tls"
}

// ParseNameCheck reads a --name-check value: tls or off.
func ParseNameCheck(s string) (NameCheck, error) {
	switch s {
	case "tls":
		return NameCheckTLS, nil
	case "off":
		return NameCheckOff, nil
	}
	return NameCheckTLS, fmt.Errorf("--name-check %q: want tls or off", s)
}

// QUIC is what a session under the name check (NameCheckTLS) does with
// UDP/443 to a name-admitted address, whose name TCP's check cannot
// read. The zero value is QUICRefuse: what every session did before the
// choice existed.
type QUIC uint8

const (
	// QUICRefuse: refused with the session's on-deny (drop reason quic):
	// clients fall back to TCP, whose name is checked.
	QUICRefuse QUIC = iota
	// QUICCheck: the flow's datagrams are held until the ClientHello in
	// its Initial packets is read (RFC 9001 5: anyone can decrypt them),
	// and its server_name is checked as a TLS flow's is.
	QUICCheck
)

// String is the --quic spelling: refuse or check.
func (q QUIC) String() string {
	if q == QUICCheck {
		return "check"
	}
	return "refuse"
}

// ParseQUIC reads a --quic value: refuse or check.
func ParseQUIC(s string) (QUIC, error) {
	switch s {
	case "refuse":
		return QUICRefuse, nil
	case "check":
		return QUICCheck, nil
	}
	return QUICRefuse, fmt.Errorf("--quic %q: want refuse or check", s)
}

// DeniedName returns the deny entry that matches name, if any.
func (p Policy) DeniedName(name string) (Entry, bool) {
	for _, e := range p.Deny {
		if e.MatchesName(name) {
			return e, true
		}
	}
	return Entry{}, false
}

// DeniedAddr returns the deny entry that denies a (on port/proto when port
// is not 0; with port 0, only a port-less entry), if any.
func (p Policy) DeniedAddr(a netip.Addr, port uint16, proto Proto) (Entry, bool) {
	for _, e := range p.Deny {
		if e.Kind != KindCIDR || !e.Prefix.Contains(a) {
			continue
		}
		if e.Port == 0 || (e.Port == port && (e.Proto == ProtoAny || e.Proto == proto)) {
			return e, true
		}
	}
	return Entry{}, false
}

// IsResolverPort reports whether port is DNS (53) or DNS over TLS (853):
// a port-less allow or scope entry never opens them; only an entry that
// names the port does.
func IsResolverPort(port uint16) bool { return port == 53 || port == 853 }
