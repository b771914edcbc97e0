package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/daemon/eventlog"
	"github.com/enforcerd/enforcerd/daemon/metrics"
	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Config is what the session lifecycle needs to know. The program checks
// it (flags and TOML) before Open; Open checks again what the domain
// packages own (the prefix and the pool are nsmgr's rules).
type Config struct {
	StateDir        string           // holds sessions/<name>.json, containers/ and layers/
	NamePrefix      string           // tags every kernel object
	Pool            netip.Prefix     // the /30s of the sessions come from here
	Pool6           netip.Prefix     // the sessions' /126s; invalid: IPv4-only (IPv6 closed)
	Upstreams       []netip.AddrPort // DNS resolvers the proxy and pinning forward to
	PublicOverrides []netip.Prefix   // special-purpose ranges treated as public (labs, tests)
	DNSMinTTL       time.Duration    // floor of an attested address's lifetime
	// AttestMaxLifetime bounds how long new connections keep an attested
	// address allowed after the answer that attested it (0: no refresh).
	AttestMaxLifetime time.Duration
	ImagesDirs        []string // the only directories a sandbox rootfs may come from
	MaxFlows          int      // per-session cap on concurrent tracked flows
	FlowRate          int      // per-session new flows per second
	MaxAttested       int      // per-session cap on live DNS-attested elements
	// EventsRetention is how long a removed session's events stay in
	// <state-dir>/events (0: removed with it).
	EventsRetention time.Duration
	// PreparedNetns is how many session netns are kept made ahead of
	// demand, off the create path (nsmgr.Config.Prepared; 0: none).
	PreparedNetns int
}

// The daemon consumes the four domain packages through these interfaces,
// declared here, where they are used: the production parts are
// *nsmgr.Manager, *nft.Firewall, *dnsproxy.Proxy and
// *container.Manager (Open wires them); the engine's state-machine test
// drives recording fakes.

// Network makes and removes the sessions' netns, veth pairs and /30s.
type Network interface {
	// CreateAlongside makes a session's netns and, with nic, its veth
	// and addresses, running alongside with the session's names and
	// addresses concurrently (nsmgr.Manager.CreateAlongside).
	CreateAlongside(name string, nic bool, alongside func(nsmgr.Session) error) (nsmgr.Session, error)
	// Attach makes a session's interface in a netns the caller made.
	Attach(name string, at nsmgr.Attachment) (nsmgr.Session, error)
	Delete(name string, slot int) error
	// Recover lists the sessions whose netns (and veth) exist.
	Recover() ([]nsmgr.Session, error)
	// Reap removes every object of the prefix not in keep.
	Reap(keep map[string]bool) ([]string, error)
	// StartPrepared starts keeping netns prepared ahead of demand for
	// Create (after Reap: a reap would remove them).
	StartPrepared()
	IsGuestAddr(a netip.Addr) bool
	CheckDNSInterface() error
	// AbortTCP aborts the guest's TCP sockets of conns in the session
	// netns at netnsPath (nsmgr.AbortTCP) and returns how many.
	AbortTCP(netnsPath string, conns []nsmgr.TCPConn) (int, error)
}

// Firewall holds the sessions' rules in the host's nftables table.
type Firewall interface {
	AddSession(r nft.SessionRules) error
	// UpdateSession changes a session's elements in one batch.
	UpdateSession(u nft.SessionUpdate) error
	// CutFlows deletes the conntrack entries of flows an update revoked
	// and returns them.
	CutFlows(u nft.SessionUpdate) ([]nft.CutFlow, error)
	RemoveSession(r nft.SessionRules) error
	// Sessions lists the sessions the table holds rules for.
	Sessions() ([]nft.SessionKey, error)
	// PruneGuests removes every element and conntrack entry of the
	// addresses gone says are no live session's.
	PruneGuests(gone func(netip.Addr) bool) (int, error)
	Attested(guest netip.Addr) ([]nft.AttestedAddr, error)
	AllAttested() (map[netip.Addr][]nft.AttestedAddr, error)
	Counters(guest netip.Addr) (nft.Counters, error)
	AllCounters() (map[netip.Addr]nft.Counters, error)
	// LimitUsage reads what a session used of its counted limits.
	LimitUsage(guest netip.Addr, l nft.SessionLimits) (nft.LimitUsage, error)
	Check() error
}

// Resolver is the DNS proxy's registry of sessions.
type Resolver interface {
	Register(p dnsproxy.SessionPolicy) error
	Unregister(guest netip.Addr)
	// Update swaps a session's policy once apply has made the kernel
	// enforce it (see dnsproxy.Proxy.Update).
	Update(p dnsproxy.SessionPolicy, apply func(stale, keep []netpolicy.Attestation, forgotten bool) error) error
	Stats() dnsproxy.Stats
}

// Sandboxes runs the sessions' containers.
type Sandboxes interface {
	Create(spec container.Spec) error
	Destroy(name string) error
	Exists(name string) bool
	// StartHeld starts a holder process that runs spec in the sandbox and
	// records its output and status in dir (see container.StartHeld).
	StartHeld(dir string, spec container.HeldSpec) (*os.Process, error)
	// Reap removes every sandbox of the prefix not in keep.
	Reap(keep map[string]bool) ([]string, error)
	// SetHosts rewrites a running sandbox's /etc/hosts with the pinned
	// entries (a policy update changed them).
	SetHosts(name string, pinned map[string][]netip.Addr) error
}

// PinResolver resolves a host's addresses once, for --pin.
type PinResolver func(ctx context.Context, host string) ([]netip.Addr, error)

// Parts are the daemon's collaborators.
type Parts struct {
	Network   Network
	Firewall  Firewall
	Resolver  Resolver
	Sandboxes Sandboxes
	Guard     *netpolicy.Guard // the special-purpose address table
	Pin       PinResolver
	DNSAddr   netip.Addr // the anycast address sessions resolve through
	DNS6Addr  netip.Addr // its IPv6 twin on a dual-stack daemon; invalid otherwise
	Store     *StateStore
	Log       *slog.Logger      // nil: discard
	Metrics   *metrics.Registry // nil: none
	Events    *eventlog.Log     // nil: in memory only
	// Close, when set, releases what Open opened (called by Engine.Close).
	Close func()
	// Images is the image store (nil: image calls fail, --image is refused).
	Images *container.ImageStore
	// StartLease starts a VM session's DHCP responder (nil: the real one,
	// see vm.go).
	StartLease StartLease
}

// Engine composes the four packages into the session lifecycle the API
// serves (it implements api.Engine). It owns the order of every
// multi-package operation:
//
//	create: network (nsmgr) -> rules (netpolicy) -> DNS registration
//	        (dnsproxy) -> sandbox (container) -> state record
//	delete: sandbox -> DNS registration -> rules -> network -> record
//
// The record is written last, so a crash in the middle of a create leaves
// kernel objects without a record, and the next start reaps them as
// orphans: a create is complete or it is gone.
type Engine struct {
	cfg     Config
	log     *slog.Logger
	nets    Network
	guard   *netpolicy.Guard
	fw      Firewall
	dns     Resolver
	boxes   Sandboxes
	state   *StateStore
	events  *eventlog.Log
	metrics *metrics.Registry
	dnsAddr netip.Addr
	dns6    netip.Addr // invalid: IPv4-only
	pin     PinResolver
	closeFn func()
	proxy   *dnsproxy.Proxy // set by Open only: what ListenDNS serves

	mu       sync.Mutex // protects sessions, byGuest, pending and creating
	sessions map[string]*liveSession
	// byGuest names the session of each guest address (v4 and v6) with a
	// network, for the name check's lookup (sessionOfGuest); kept with sessions
	// by addSessionLocked and removeSessionLocked.
	byGuest map[netip.Addr]string
	pending map[string]bool // names whose create or delete is in flight
	// creating is the rootfs of each create in flight with a sandbox: an
	// image it names is in use before its session exists (images.go).
	creating map[string]string

	images *container.ImageStore

	held heldWatch // the execs whose end this daemon watches (execs.go)
	// finishMu serialises finishExec (an exec's end is recorded once) and
	// guards execCallers: the context of each exec this daemon started,
	// whose caller the end event names.
	finishMu    sync.Mutex
	execCallers map[string]context.Context

	names attestNames // the name that attested each address (expired.go)

	namecheck *nameCheck // the name check (namecheck.go); nil without the kernel's queue (fakes)

	ledger     *flowLedger // the ledger of admissions (flowledger.go); nil without the kernel's events
	ledgerStop func()      // ends it: closes the event socket and every ledger

	startLeaseFn StartLease // Parts.StartLease
	leases       leases     // the VM sessions' DHCP responders (vm.go)

	// grantTimers (guarded by mu) fire at each session's next grant
	// deadline (grants.go); grantsStopped is set by Close.
	grantTimers   map[string]*time.Timer
	grantsStopped bool
	// limitsReached dedupes the events of limits reached (limits.go).
	limitsReached limitEvents
}

// New returns a daemon over the given parts. It changes nothing: call
// Reconcile before serving.
func New(cfg Config, p Parts) *Engine {
	log := p.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	events := p.Events
	if events == nil {
		events = eventlog.New(0)
	}
	return &Engine{
		cfg: cfg, log: log, nets: p.Network, guard: p.Guard, fw: p.Firewall,
		dns: p.Resolver, boxes: p.Sandboxes, state: p.Store, events: events,
		metrics: p.Metrics, dnsAddr: p.DNSAddr, dns6: p.DNS6Addr, pin: p.Pin, closeFn: p.Close,
		sessions: map[string]*liveSession{}, byGuest: map[netip.Addr]string{}, pending: map[string]bool{}, creating: map[string]string{},
		images: p.Images,
		names:  attestNames{max: cfg.MaxAttested},

		grantTimers: map[string]*time.Timer{},

		startLeaseFn: p.StartLease,
	}
}

// Close releases the parts (the sessions stay up, enforced by the kernel).
func (e *Engine) Close() {
	e.stopGrants()
	e.stopLeases()
	e.shutdownDNS()
	if e.ledgerStop != nil {
		e.ledgerStop()
	}
	e.events.Shutdown()
	if e.closeFn != nil {
		e.closeFn()
	}
}

// DNSAddr is the anycast address the sessions resolve through.
func (e *Engine) DNSAddr() netip.Addr { return e.dnsAddr }
