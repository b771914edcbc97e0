package nsmgr

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
)

// DefaultPool is the session pool enforcerd uses unless configured.
var DefaultPool = netip.MustParsePrefix("10.20.0.0/16")

// Config configures a Manager.
type Config struct {
	// Prefix tags every object the Manager creates (see ValidatePrefix).
	Prefix string
	// Pool is the IPv4 pool the /30 slots come from (see NewIPAM).
	Pool netip.Prefix
	// Pool6, when set, makes every session with a NIC dual-stack: its slot's
	// twin /126 of Pool6 (see ipv6.go and ValidatePool6). Unset, IPv6 is
	// disabled in every session, as it always was.
	Pool6 netip.Prefix
	// HostNS is the daemon's netns, where the host-side veths and the DNS
	// interface live. The caller keeps it open while the Manager is used
	// and closes it afterwards.
	HostNS netns.NsHandle
	// NetnsDir is where the session netns are bind-mounted (default
	// /run/netns, where `ip netns` finds them).
	NetnsDir string
	// EtcNetnsDir is where a session with a NIC gets
	// <prefix>-<session>/resolv.conf naming the DNS anycast address, the
	// file `ip netns exec` shows as /etc/resolv.conf (default /etc/netns,
	// iproute2's convention).
	EtcNetnsDir string
	// GuestClean, when set, is asked before a released slot is handed out
	// again, with the slot's guest address: false keeps the slot
	// quarantined (state elsewhere keyed by that address, such as the
	// conntrack entries the firewall flushes in the background, may still
	// remain). It must be fast and must not call back into the Manager.
	GuestClean func(guest netip.Addr) bool
	// Fault is a test seam: when set, Create calls it before each step
	// (see CreateSteps) and a non-nil error fails that step.
	Fault func(step string) error
	// StepStarted, when set, is told as each step of Create starts (after
	// Fault passed it): an observer for timing the steps (the bench), it
	// cannot fail one.
	StepStarted func(step string)
	// RetireFailed, when set, is told of a background veth delete that
	// failed (see retire.go): the veth stays down and its slot quarantined
	// until Reap removes it.
	RetireFailed func(err error)
	// NoLinkEcho is a test seam: Create asks no echo of the veth it
	// creates, as on a kernel before 6.3 (which sends none), so that the
	// lookups by name that such a kernel needs are exercised here too.
	NoLinkEcho bool
	// Prepared is how many netns the Manager keeps made and configured
	// ahead of demand once StartPrepared is called, for Create to claim
	// (see prepared.go); 0 disables the pool. The daemon's default is
	// DefaultPrepared.
	Prepared int
	// PrepareConcurrency bounds how many of them are made at once
	// (default 1: the refill competes with the creates for the CPU).
	PrepareConcurrency int
}

// Session describes the network of one session.
type Session struct {
	Name      string
	Netns     string // "<prefix>-<name>"; attached: the netns path
	NetnsPath string // NetnsDir/Netns; attached: the runtime's path
	Slot      int    // -1: no NIC (egress none)
	HostIface string // "<prefix><slot>h"; empty without NIC
	Subnet    netip.Prefix
	Gateway   netip.Addr // on HostIface
	Guest     netip.Addr // on eth0 (attached: IfName) in the session netns
	// Subnet6, Gateway6 and Guest6 are the slot's /126 and its two ends
	// on a dual-stack daemon (Config.Pool6), attached sessions included;
	// invalid otherwise, and for VM sessions, which stay IPv4-only.
	Subnet6  netip.Prefix
	Gateway6 netip.Addr
	Guest6   netip.Addr
	// Attached: the session lives in a netns enforcerd did not make (see
	// Attach). Recover finds it by its veth's alias but not its netns path
	// or IfName, which the caller records.
	Attached bool
	IfName   string // attached: the guest-side interface
	// VM: a VM session's bridge, tap and guest MAC (see CreateVM); nil
	// otherwise. Guest is then the VM's address, held by nothing in the
	// session netns.
	VM *VMNet
}

// Manager creates, deletes, recovers and reaps session networks. It is safe
// for concurrent use; Creates of different sessions run their kernel steps
// in parallel.
//
// Invariant: a slot is used in ipam from the moment a Create allocates it
// until Delete or Reap releases it (or the Create unwinds); a released slot
// is handed out again only once its host veth is gone from the kernel.
type Manager struct {
	cfg  Config
	host *netlink.Handle // rtnetlink socket in cfg.HostNS, shared (the library serialises requests per socket)
	geo  *IPAM           // address arithmetic only; never allocated from, so readable without mu

	mu       sync.Mutex // protects the fields below
	ipam     *IPAM
	sessions map[string]Session
	creating map[string]bool // names whose Create is in flight
	dirReady bool            // NetnsDir prepared
	closed   bool
	prep     preparedPool
	claimed  int // creates served from the pool
	fresh    int // creates that found the pool empty
	// retiring maps the ifindex of each host veth whose background delete
	// is in flight to a channel closed when it ends (retire.go).
	retiring map[int]chan struct{}
	retireWG sync.WaitGroup

	// hostConf is the daemon netns's /proc/sys/net/ipv6/conf, opened once:
	// the host side's disable_ipv6 is resolved from it (see sysctl.go).
	// nil without IPv6.
	hostConf *os.File
	// hostRoute is a rtnetlink socket in the daemon netns, opened once, for
	// the requests the netlink library has no call for (lockARP): without
	// it each request would open, bind and close a socket of its own on a
	// thread switched into the daemon netns.
	hostRoute *nl.SocketHandle
}

// New validates cfg and returns a Manager. It changes nothing in the
// kernel; call Recover before serving to learn what a previous run left.
func New(cfg Config) (*Manager, error) {
	if err := ValidatePrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	if !cfg.Pool.IsValid() {
		cfg.Pool = DefaultPool
	}
	ipam, err := NewIPAM(cfg.Pool)
	if err != nil {
		return nil, err
	}
	geo, _ := NewIPAM(cfg.Pool)
	if cfg.Pool6.IsValid() {
		if err := ValidatePool6(cfg.Pool6, cfg.Pool); err != nil {
			return nil, err
		}
	}
	if !cfg.HostNS.IsOpen() || cfg.HostNS == 0 { // 0: the zero value (stdin), never a netns here
		return nil, errors.New("nsmgr config: HostNS is not an open netns handle")
	}
	if cfg.NetnsDir == "" {
		cfg.NetnsDir = DefaultNetnsDir
	}
	if cfg.EtcNetnsDir == "" {
		cfg.EtcNetnsDir = DefaultEtcNetnsDir
	}
	if cfg.Prepared < 0 || cfg.PrepareConcurrency < 0 {
		return nil, fmt.Errorf("nsmgr config: prepared netns %d, concurrency %d: want 0 or more", cfg.Prepared, cfg.PrepareConcurrency)
	}
	h, err := handleIn(cfg.HostNS)
	if err != nil {
		return nil, fmt.Errorf("host netns: %w", err)
	}
	var conf *os.File
	var route *nl.SocketHandle
	err = Do(cfg.HostNS, func() (err error) {
		if conf, err = openHostConfDir(); err != nil {
			return err
		}
		route, err = openRouteSocket()
		return err
	})
	if err != nil {
		if conf != nil {
			conf.Close()
		}
		h.Close()
		return nil, fmt.Errorf("host netns: %w", err)
	}
	return &Manager{
		cfg:       cfg,
		host:      h,
		geo:       geo,
		ipam:      ipam,
		sessions:  map[string]Session{},
		creating:  map[string]bool{},
		retiring:  map[int]chan struct{}{},
		hostConf:  conf,
		hostRoute: route,
		prep: preparedPool{
			names: map[string]bool{},
			wake:  make(chan struct{}, 1),
			idle:  make(chan struct{}, 1),
			stop:  make(chan struct{}),
			done:  make(chan struct{}),
		},
	}, nil
}

// Close stops the refill of prepared netns and removes the prepared ones
// (they are no session's), waits for the background veth deletes in
// flight (retire.go), then releases the Manager's sockets and fds. It
// removes no session; the Manager is unusable afterwards.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	err := m.closePrepared()
	m.waitRetiring()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.host.Close()
	if m.hostConf != nil {
		m.hostConf.Close()
	}
	if m.hostRoute != nil {
		m.hostRoute.Close()
	}
	return err
}

// Prefix returns the prefix.
func (m *Manager) Prefix() string { return m.cfg.Prefix }

// Pool returns the pool.
func (m *Manager) Pool() netip.Prefix { return m.cfg.Pool }

// DNSAddr returns the DNS anycast address of the pool.
func (m *Manager) DNSAddr() netip.Addr { return m.geo.DNSAddr() }

// NetnsPath returns the path of a session's netns file.
func (m *Manager) NetnsPath(session string) string {
	return filepath.Join(m.cfg.NetnsDir, NetnsName(m.cfg.Prefix, session))
}

// SlotOf returns the slot whose /30 holds addr.
func (m *Manager) SlotOf(addr netip.Addr) (int, bool) { return m.geo.SlotOf(addr) }

// IsGuestAddr reports whether addr is the guest address of a slot of the
// pool (not a gateway, not the DNS anycast address): the address that keys
// a session's state elsewhere (firewall elements, conntrack entries).
func (m *Manager) IsGuestAddr(addr netip.Addr) bool {
	slot, ok := m.geo.SlotOf(addr)
	if !ok {
		return false
	}
	_, _, guest := m.geo.SlotAddrs(slot)
	return addr == guest
}

// SlotsInUse returns the number of slots handed out (for metrics and tests).
func (m *Manager) SlotsInUse() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ipam.InUse()
}

// Sessions returns the sessions the Manager knows (created, or found by
// Recover), sorted by name.
func (m *Manager) Sessions() []Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	return sortedSessions(m.sessions)
}

// session builds the Session value of a name and slot.
func (m *Manager) session(name string, slot int) Session {
	s := Session{
		Name:      name,
		Netns:     NetnsName(m.cfg.Prefix, name),
		NetnsPath: m.NetnsPath(name),
		Slot:      -1,
	}
	if slot >= 0 {
		s.Slot = slot
		s.HostIface = HostIfaceName(m.cfg.Prefix, slot)
		s.Subnet, s.Gateway, s.Guest = m.geo.SlotAddrs(slot)
		if m.cfg.Pool6.IsValid() {
			s.Subnet6, s.Gateway6, s.Guest6 = Slot6Addrs(m.cfg.Pool6, slot)
		}
	}
	return s
}

// allocateLocked hands out a slot whose host veth name is free in the
// kernel: a dirty slot (released by Delete, whose veth the kernel removes in
// the background) is checked with one link lookup and skipped while its old
// veth lingers, or while GuestClean says its address still has state.
// Caller holds m.mu.
func (m *Manager) allocateLocked() (int, error) {
	return m.ipam.AllocateIf(func(slot int) bool {
		if clean := m.cfg.GuestClean; clean != nil {
			if _, _, guest := m.geo.SlotAddrs(slot); !clean(guest) {
				return false
			}
		}
		_, err := m.host.LinkByName(HostIfaceName(m.cfg.Prefix, slot))
		return isNotFound(err)
	})
}

// prepareDirLocked prepares NetnsDir once. Caller holds m.mu.
func (m *Manager) prepareDirLocked() error {
	if m.dirReady {
		return nil
	}
	if err := PrepareNetnsDir(m.cfg.NetnsDir); err != nil {
		return err
	}
	m.dirReady = true
	return nil
}
