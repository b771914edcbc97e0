package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// Attester inserts a session's answered addresses into its firewall set.
// It is owned here, its consumer; netpolicy's Firewall implements it.
//
// Attest must return only once the addresses are in the kernel's set (the
// answer is released right after). ttl is the element timeout the proxy
// wants; the returned duration is how long the elements are known to stay
// there from now: the timeout actually applied (after the attester's floor
// clamp), or less for elements already there that it did not insert again
// (netpolicy's known elements). The answer's TTLs are capped by it. ports
// nil means any port.
type Attester interface {
	Attest(guest netip.Addr, ips []netip.Addr, ttl time.Duration, ports []netpolicy.PortSpec) (time.Duration, error)
}

// NameAttester is an Attester that is also told the name the addresses
// answer (the query name, lower-case, without the trailing dot), so that it
// can count a session's flows per name (netpolicy's counted limits). The
// proxy calls AttestName instead of Attest when the Attester has it; the
// contract is Attest's.
type NameAttester interface {
	AttestName(guest netip.Addr, name string, ips []netip.Addr, ttl time.Duration, ports []netpolicy.PortSpec) (time.Duration, error)
}

// Config configures a Proxy. Upstreams, Guard and Attester are required.
type Config struct {
	// Upstreams are the resolvers allowed names are forwarded to, in order
	// of preference.
	Upstreams []netip.AddrPort
	// Timeout bounds one try against one upstream (UDP plus the TCP retry).
	// Default 2s.
	Timeout time.Duration
	// MinTTL is the lowest attestation timeout the proxy asks for; the
	// attester may clamp it up further. Default 0 (the attester's floor).
	MinTTL time.Duration
	// Guard decides which answered addresses a session may reach.
	Guard *netpolicy.Guard
	// Attester inserts kept addresses into the session's set.
	Attester Attester
	// Events receives every decision; nil discards them.
	Events EventSink
	// SessionShare is how many queries of one session may be in flight
	// while other sessions wait. Default 32 (at most MaxInFlight-1).
	SessionShare int
	// MaxInFlight bounds the queries being worked on at once. Default 1024.
	MaxInFlight int
	// Dial makes upstream sockets ("udp" or "tcp"). A UDP socket is kept
	// and shared by many queries (it must outlive the ctx passed to Dial);
	// a TCP connection serves one query. Default: a net.Dialer in the
	// caller's network namespace.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxAnswerAddrs caps the addresses one answer may carry (and attest):
	// beyond it the remaining A records and hints are removed, so a name
	// answering thousands of addresses cannot grow the kernel's sets by
	// thousands per query. Default 32.
	MaxAnswerAddrs int
	// Logger receives a debug record per decision. Default: discard.
	Logger *slog.Logger
}

const (
	defaultTimeout      = 2 * time.Second
	defaultSessionShare = 32
	defaultMaxInFlight  = 1024
	defaultAnswerAddrs  = 32
)

// ErrClosed is returned by Serve after Shutdown.
var ErrClosed = errors.New("dnsproxy: closed")

// Proxy is the DNS listener shared by every session. Its methods are safe
// for concurrent use.
//
// sessions holds immutable snapshots (sessionMap, sharded) read without a
// lock on the answer path; Register, Unregister and Update publish a new
// copy of one shard under sessionsMu.
type Proxy struct {
	cfg   Config
	log   *slog.Logger
	stats counters
	sched *scheduler

	sessions   *sessionTable
	sessionsMu sync.Mutex

	preferred atomic.Uint32 // index of the upstream that answered last

	// upstreamAddrs[i] is cfg.Upstreams[i] as address:port; udp[i] its
	// long-lived UDP sockets (closed by Shutdown).
	upstreamAddrs []string
	udp           []*udpPool

	ctx    context.Context // cancelled by Shutdown: aborts upstream exchanges
	cancel context.CancelFunc
	wg     sync.WaitGroup // serve loops, connections and jobs

	mu     sync.Mutex // protects the fields below
	closed bool
	pconns []net.PacketConn
	lns    []net.Listener
	conns  map[net.Conn]struct{}
	tcpPer map[netip.Addr]int // open TCP connections per client
}

// New checks cfg, fills in defaults and returns a proxy with no sessions.
func New(cfg Config) (*Proxy, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("new dns proxy: no upstream resolvers: want at least one address:port")
	}
	for _, u := range cfg.Upstreams {
		if !u.IsValid() || u.Port() == 0 {
			return nil, fmt.Errorf("new dns proxy: upstream %q: want address:port", u)
		}
	}
	if cfg.Guard == nil {
		return nil, errors.New("new dns proxy: no guard")
	}
	if cfg.Attester == nil {
		return nil, errors.New("new dns proxy: no attester")
	}
	if cfg.Timeout < 0 || cfg.MinTTL < 0 || cfg.SessionShare < 0 || cfg.MaxInFlight < 0 {
		return nil, errors.New("new dns proxy: negative timeout, min ttl, session share or max in flight")
	}
	if cfg.MaxAnswerAddrs < 0 {
		return nil, fmt.Errorf("new dns proxy: max answer addresses %d: want at least 1 (0: the default, %d)", cfg.MaxAnswerAddrs, defaultAnswerAddrs)
	}
	if cfg.MaxAnswerAddrs == 0 {
		cfg.MaxAnswerAddrs = defaultAnswerAddrs
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = defaultMaxInFlight
	}
	if cfg.MaxInFlight < 2 {
		return nil, fmt.Errorf("new dns proxy: max in flight %d: want at least 2", cfg.MaxInFlight)
	}
	if cfg.SessionShare == 0 {
		cfg.SessionShare = defaultSessionShare
	}
	cfg.SessionShare = min(cfg.SessionShare, cfg.MaxInFlight-1)
	if cfg.Dial == nil {
		cfg.Dial = defaultDial
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{
		cfg:    cfg,
		log:    cfg.Logger,
		conns:  map[net.Conn]struct{}{},
		tcpPer: map[netip.Addr]int{},
	}
	for _, u := range cfg.Upstreams {
		p.upstreamAddrs = append(p.upstreamAddrs, u.String())
		p.udp = append(p.udp, newUDPPool(u.String(), cfg.Dial, udpSockets, udpSocketQueries))
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.sched = newScheduler(cfg.MaxInFlight, cfg.SessionShare, cfg.Timeout, func() { p.stats.shed.Add(1) })
	p.sessions = newSessionTable()
	return p, nil
}

// ListenAndServe opens UDP and TCP sockets on addr in the caller's network
// namespace and serves them (see Serve).
func (p *Proxy) ListenAndServe(addr netip.AddrPort) error {
	pc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return fmt.Errorf("listen dns udp %s: %w", addr, err)
	}
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(addr))
	if err != nil {
		pc.Close()
		return fmt.Errorf("listen dns tcp %s: %w", addr, err)
	}
	return p.Serve(pc, ln)
}

// Shutdown stops reading queries, waits until the queries in flight are
// answered or ctx ends (then aborts upstream exchanges and closes TCP
// connections), and closes every socket given to Serve. Serve returns
// ErrClosed. Calling it again is harmless.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	now := time.Now()
	for _, c := range p.pconns {
		c.SetReadDeadline(now) // wakes the readers; replies can still be sent
	}
	for _, l := range p.lns {
		l.Close()
	}
	for c := range p.conns {
		c.SetReadDeadline(now)
	}
	p.mu.Unlock()

	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		p.sched.drain()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = fmt.Errorf("shutdown dns proxy: %w", ctx.Err())
		p.cancel()
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		<-done
	}
	p.cancel()
	for _, u := range p.udp {
		u.close()
	}
	p.mu.Lock()
	for _, c := range p.pconns {
		c.Close()
	}
	p.mu.Unlock()
	return err
}
