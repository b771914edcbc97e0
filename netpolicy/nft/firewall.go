package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/internal/nfnetlink"
	"github.com/enforcerd/enforcerd/netpolicy"
)

const (
	// DefaultAttestFloor is the shortest life of an attested address when
	// FirewallConfig.AttestFloor is zero. DNS TTLs of 0 or a few seconds are
	// common; the guest connects right after the answer, and established
	// connections outlive the element anyway.
	DefaultAttestFloor = 30 * time.Second
	// MaxAttestTimeout caps an attested address's life (DNS TTLs go up to
	// 2^31 s; an element should not outlive a day without a fresh answer).
	MaxAttestTimeout = 24 * time.Hour
	// elemChunk bounds the elements per netlink message: the element list
	// is one attribute whose length is 16 bits.
	elemChunk = 256
	// DefaultMaxFlows, DefaultFlowRate and DefaultMaxAttested are the
	// per-session budgets when FirewallConfig leaves them zero.
	DefaultMaxFlows    = 8192
	DefaultFlowRate    = 2000
	DefaultMaxAttested = 4096
)

// prefixPattern: the prefix names the table and starts every session
// interface name, so it is short and plain.
var prefixPattern = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)

// FirewallConfig configures the nftables table of one daemon.
type FirewallConfig struct {
	// NetNS is the daemon's (host) network namespace. The Firewall keeps its
	// own duplicate of the handle; the caller may close theirs.
	NetNS netns.NsHandle
	// Prefix names the table ("inet <Prefix>") and is the prefix of every
	// host-side session interface: 1 to 8 of [a-z0-9], starting with a letter.
	Prefix string
	// Pool is the session address pool: masqueraded on the way out, and
	// always blocked as a destination except for lab peers.
	Pool netip.Prefix
	// DNSAddr is the DNS anycast address, the only local address sessions
	// may reach (UDP and TCP port 53).
	DNSAddr netip.Addr
	// Pool6, when set, makes the table dual-stack (firewall6.go): sessions
	// have the v6 address of their slot in it, judged by Guard's v6 half
	// (which must be built for this Pool6), and DNS6Addr is the v6 anycast
	// address. Unset, the table is IPv4-only, exactly as without it.
	Pool6    netip.Prefix
	DNS6Addr netip.Addr
	// Guard defines the blocked destinations; nil means NewGuard(Pool, nil).
	// Its pool must be Pool.
	Guard *netpolicy.Guard
	// AttestFloor is the minimum attest timeout (0: DefaultAttestFloor).
	AttestFloor time.Duration
	// AttestMaxLifetime turns on the refresh of attested elements: a new
	// flow to an attested address keeps it allowed for AttestFloor after
	// that flow, for at most AttestMaxLifetime after the DNS answer that
	// last attested it (SweepRefreshed enforces the maximum). 0 turns the
	// refresh off: an address is allowed for its answer's timeout only.
	AttestMaxLifetime time.Duration
	// MaxFlows caps each session's concurrent tracked flows (conntrack
	// entries it opened); 0 means DefaultMaxFlows.
	MaxFlows int
	// FlowRate caps each session's new flows per second, with a burst of
	// twice that; 0 means DefaultFlowRate.
	FlowRate int
	// MaxAttested caps each session's live attested elements; an Attest
	// that would exceed it fails with ErrAttestCap. 0 means DefaultMaxAttested.
	MaxAttested int
	// LogRate is each session's drop-log budget: NFLOG lines per second,
	// with a burst of twice that (0: DefaultLogRate). Drops over it are
	// counted (Counters.Unlogged), not logged.
	LogRate int
	// LogGroup is the NFLOG group of the drop log (0: derived from Prefix,
	// in 1000..64999).
	LogGroup uint16
	// NameQueue is the NFQUEUE number of the name check (0: derived from
	// Prefix as LogGroup is; queues and groups are apart).
	NameQueue uint16
	// OnFlowFlushError reports a failed background flush of removed
	// sessions' conntrack entries (it is retried after 1 s, backing off to 1 min); nil drops it.
	OnFlowFlushError func(error)
	// AttestFault is a test seam (nil in production): when it returns an
	// error for a guest, every attest batch holding that guest's elements
	// fails with it before reaching the kernel, as a rejected batch would
	// (and its connection is discarded).
	AttestFault func(guest netip.Addr) error
}

// SessionRules is what the firewall knows about one session. Every element
// it produces is keyed by Guest, which is unique per live session (one /30
// each), so sessions never share or rewrite each other's elements.
type SessionRules struct {
	Name      string     // for messages only
	HostIface string     // host-side veth; must start with the firewall prefix
	Guest     netip.Addr // the session's address, inside the pool
	Egress    netpolicy.Mode
	Static    []netpolicy.Target   // CIDR entries and pinned addresses (see StaticTargets)
	Peers     []netip.Addr         // guest addresses of the lab peers this session may reach
	Deny      []netpolicy.Target   // denied addresses and CIDRs (DenyTargets): dropped before any accept
	OnDeny    netpolicy.DenyAnswer // what policy drops get: silence, ICMP admin-prohibited, or a TCP reset for TCP
	// NameCheck: the session's name-admitted TCP flows are held for the
	// name check (docs/network-model.md, "Names on shared addresses");
	// DenyNames: its policy has deny entries by name (in public mode,
	// every TCP flow is then checked).
	NameCheck, DenyNames bool
	// QUICCheck: under NameCheck, UDP/443 to a name-admitted address is
	// held for the check too (--quic check) instead of refused.
	QUICCheck bool
	// Pinned are the addresses of pinned names (PinnedTargets), a part of
	// Static: under the name check their flows are checked like attested
	// ones.
	Pinned []netpolicy.Target
	// InboundFromHost are the ports the host (the daemon's netns: the node)
	// may open connections to in the session; none by default (inbound.go).
	InboundFromHost []netpolicy.PortSpec
	// Limits are the session's byte budgets and connection grants
	// (limits.go).
	Limits SessionLimits
}

// SessionKey identifies a session in the kernel's "sessions" set.
type SessionKey struct {
	HostIface string
	Guest     netip.Addr
}

// AttestedAddr is one live attested destination of a session.
type AttestedAddr struct {
	IP      netip.Addr
	Port    uint16          // 0: any port and protocol
	Proto   netpolicy.Proto // with Port: ProtoTCP or ProtoUDP
	Expires time.Duration
}

// Counters are a session's packet and byte counts: accepted counts every
// forwarded packet from the session (new and established), dropped counts
// packets from the session dropped by policy in forward or input. Packets
// dropped before the session is identified (spoofed source, unknown
// interface, IPv6) are not attributed to any session.
//
// ByReason counts dropped packets by drop reason (the Reason constants),
// exactly, whatever the log's rate limit: those from the session dropped by
// policy (a subset of DroppedPackets), spoofed ones counted for the session
// whose interface they came in on, and inbound ones towards it (neither of
// those two is in DroppedPackets). Drops of invalid packets and of ICMP
// errors about others' flows have no reason. Unlogged counts the new flows
// whose drop the session's log budget kept out of the log.
type Counters struct {
	AcceptedPackets, AcceptedBytes uint64
	// ReceivedPackets and ReceivedBytes count what was forwarded into the
	// session: the replies of its flows (a download), and lab peers' traffic.
	ReceivedPackets, ReceivedBytes uint64
	DroppedPackets, DroppedBytes   uint64
	// LimitedPackets counts new flows dropped because the session was at
	// its flow cap or over its new-flow rate (also in DroppedPackets).
	LimitedPackets uint64
	ByReason       map[string]uint64
	Unlogged       uint64
}

// Firewall owns the table "inet <prefix>" in the daemon's netns. It is safe
// for concurrent use. Attest has its own netlink connection so the DNS hot
// path never waits behind a session add/remove or a counter dump; the
// kernel serialises the transactions themselves. Concurrent Attest calls
// are group-committed into one batch (attests). The Firewall assumes it is
// the only writer of its table while open (one daemon per table): attested
// records what it inserted into the attested sets, so that RemoveSession
// need not dump them.
type Firewall struct {
	cfg       FirewallConfig
	guard     *netpolicy.Guard
	floor     time.Duration
	nsFd      int // our duplicate of cfg.NetNS, closed by Close
	schema    *schema
	admin     connSlot // Ensure, AddSession, RemoveSession, reads, DeleteTable
	attest    connSlot // Attest only, used by attests' leader
	attests   *groupCommit[attestReq]
	attested  attestIndex
	attested6 attest6Index   // the v6 attested elements: their cap and refresh (attestcap6.go, refresh6.go)
	known     knownIndex     // what Attest may skip the kernel for (attestknown.go)
	named     namedIndex     // the sessions' limited name entries (namedlimits.go)
	monitor   attestMonitor  // forgets what others delete (attestmonitor.go)
	flushes   atomic.Uint64  // attest batches sent to the kernel
	flows     flowTable      // conntrack entries of removed sessions
	reads     nfnetlink.Conn // single-element reads (one session's counters)
}

// OpenFirewall validates cfg and opens the netlink connections. It changes
// nothing in the kernel; call Ensure.
func OpenFirewall(cfg FirewallConfig) (*Firewall, error) {
	if err := checkConfig(&cfg); err != nil {
		return nil, fmt.Errorf("open firewall: %w", err)
	}
	fd, err := unix.FcntlInt(uintptr(cfg.NetNS), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open firewall: duplicate netns handle: %w", err)
	}
	f := &Firewall{
		cfg:    cfg,
		guard:  cfg.Guard,
		floor:  cfg.AttestFloor,
		nsFd:   fd,
		schema: newSchema(cfg.Prefix, cfg.Pool),
	}
	if cfg.Pool6.IsValid() {
		f.schema.addSets6()
		f.flows.owner6 = f.guest4Of6
		f.known.guest4Of6 = f.guest4Of6
	}
	f.admin.nsFd, f.attest.nsFd, f.flows.NetNS, f.reads.NetNS = fd, fd, fd, fd
	f.flows.Closed, f.reads.Closed = ErrClosed, ErrClosed
	f.flows.onError = cfg.OnFlowFlushError
	f.flows.afterFlush = f.forgetReturns
	f.attests = newGroupCommit(attestBatchMax, f.flushAttests)
	if cfg.AttestMaxLifetime > 0 {
		f.attested.refresh, f.attested.maxLife = f.floor, cfg.AttestMaxLifetime
	}
	if err := f.admin.do(func(*nftables.Conn) error { return nil }); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open firewall: %w", err)
	}
	return f, nil
}

func checkConfig(cfg *FirewallConfig) error {
	if cfg.NetNS <= 0 {
		return fmt.Errorf("netns handle is not set")
	}
	if !prefixPattern.MatchString(cfg.Prefix) {
		return fmt.Errorf("prefix %q: want 1 to 8 of a-z and 0-9, starting with a letter", cfg.Prefix)
	}
	if !cfg.Pool.IsValid() || !cfg.Pool.Addr().Is4() || cfg.Pool != cfg.Pool.Masked() {
		return fmt.Errorf("pool %q: want a masked IPv4 prefix such as 10.20.0.0/16", cfg.Pool)
	}
	if !cfg.DNSAddr.Is4() {
		return fmt.Errorf("dns address %q: want an IPv4 address", cfg.DNSAddr)
	}
	if cfg.Guard == nil {
		g, err := netpolicy.NewGuard(cfg.Pool, nil)
		if err != nil {
			return err
		}
		cfg.Guard = g
	}
	if cfg.Pool6.IsValid() && (cfg.Guard.Pool6() != cfg.Pool6 || !cfg.Pool6.Contains(cfg.DNS6Addr)) {
		return fmt.Errorf("pool6 %s: want a dual-stack guard of the same pool6 and a DNS6 address inside it (guard %s, dns6 %s)", cfg.Pool6, cfg.Guard.Pool6(), cfg.DNS6Addr)
	}
	if cfg.Guard.Pool() != cfg.Pool {
		return fmt.Errorf("guard pool %s differs from firewall pool %s", cfg.Guard.Pool(), cfg.Pool)
	}
	if cfg.AttestFloor < 0 {
		return fmt.Errorf("attest floor %s is negative", cfg.AttestFloor)
	}
	if cfg.AttestFloor == 0 {
		cfg.AttestFloor = DefaultAttestFloor
	}
	if cfg.AttestMaxLifetime < 0 || cfg.AttestMaxLifetime > MaxAttestTimeout {
		return fmt.Errorf("attest max lifetime %s: want 0 (no refresh) to %s", cfg.AttestMaxLifetime, MaxAttestTimeout)
	}
	for _, b := range []struct {
		name string
		v    *int
		def  int
	}{{"max flows", &cfg.MaxFlows, DefaultMaxFlows}, {"flow rate", &cfg.FlowRate, DefaultFlowRate}, {"max attested", &cfg.MaxAttested, DefaultMaxAttested},
		{"log rate", &cfg.LogRate, DefaultLogRate}} {
		switch {
		case *b.v < 0 || *b.v > 1<<24:
			return fmt.Errorf("%s %d: want 0 (the default) to %d", b.name, *b.v, 1<<24)
		case *b.v == 0:
			*b.v = b.def
		}
	}
	if cfg.NameQueue == 0 {
		cfg.NameQueue = defaultLogGroup(cfg.Prefix)
	}
	if cfg.LogGroup == 0 {
		cfg.LogGroup = defaultLogGroup(cfg.Prefix)
	}
	return nil
}

// Close releases the netlink connections and the netns handle. The table and
// its state stay in the kernel (and keep enforcing). Close must not run
// concurrently with other methods; a second Close does nothing, and any
// other method called after it fails with ErrClosed.
func (f *Firewall) Close() error {
	f.stopMonitor()
	f.known.forgetAll(false) // an Attest after Close must not succeed from memory
	f.admin.close()
	f.attest.close()
	f.flows.close()
	f.reads.Close()
	if f.nsFd > 0 {
		err := unix.Close(f.nsFd)
		f.nsFd = -1
		if err != nil {
			return fmt.Errorf("close firewall netns handle: %w", err)
		}
	}
	return nil
}

// Table returns the table name.
func (f *Firewall) Table() string { return f.cfg.Prefix }

// LogGroup returns the NFLOG group of the drop log.
func (f *Firewall) LogGroup() uint16 { return f.cfg.LogGroup }

// AttestFloor returns the effective floor.
func (f *Firewall) AttestFloor() time.Duration { return f.floor }

func (f *Firewall) checkGuest(guest netip.Addr) error {
	if !guest.Is4() || !f.cfg.Pool.Contains(guest) {
		return fmt.Errorf("guest address %s is not inside the pool %s", guest, f.cfg.Pool)
	}
	return nil
}

// tableExists reports whether the table is present.
func tableExists(c *nftables.Conn, t *nftables.Table) (bool, error) {
	_, err := c.ListTableOfFamily(t.Name, t.Family)
	if err == nil {
		return true, nil
	}
	if isNotFound(err) {
		return false, nil
	}
	return false, fmt.Errorf("look up table inet %s: %w", t.Name, err)
}

// DeleteTable removes the whole table with every session's state. It is for
// an offline reap (no daemon running); deleting a missing table succeeds.
func (f *Firewall) DeleteTable() error {
	f.known.forget(everyGuest)
	defer f.known.forget(everyGuest)
	err := f.admin.do(func(c *nftables.Conn) error {
		ok, err := tableExists(c, f.schema.table)
		if err != nil || !ok {
			return err
		}
		c.DelTable(f.schema.table)
		return c.Flush()
	})
	f.attested.reset()
	if err != nil && !isNotFound(err) {
		return fmt.Errorf("delete table inet %s: %w", f.cfg.Prefix, err)
	}
	return nil
}

// addElements queues elems for set in messages of at most elemChunk elements.
func addElements(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement, del bool) error {
	for len(elems) > 0 {
		n := min(len(elems), elemChunk)
		var err error
		if del {
			err = c.SetDeleteElements(s, elems[:n])
		} else {
			err = c.SetAddElements(s, elems[:n])
		}
		if err != nil {
			return fmt.Errorf("encode elements of set %s: %w", s.Name, err)
		}
		elems = elems[n:]
	}
	return nil
}

var errNoTable = errors.New("table does not exist; call Ensure first")
