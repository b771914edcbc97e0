package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// ErrUpstream is wrapped by forward's error when no upstream gave a usable
// answer.
var ErrUpstream = errors.New("all upstreams failed")

// forward asks the upstreams for q: over UDP first, over TCP when the UDP
// answer is truncated, each try bounded by cfg.Timeout, moving to the next
// upstream on an error, a timeout, SERVFAIL or REFUSED. It starts with the
// upstream that answered last, so a dead first upstream does not cost a
// timeout per query.
func (p *Proxy) forward(ctx context.Context, q dns.Question, cd bool) (*dns.Msg, netip.AddrPort, time.Duration, error) {
	m := new(dns.Msg)
	m.Id = dns.Id()
	m.RecursionDesired = true
	m.CheckingDisabled = cd
	m.Question = []dns.Question{q}
	m.SetEdns0(ednsSize, false)

	n := len(p.cfg.Upstreams)
	first := int(p.preferred.Load()) % n
	var errs []error
	for i := range n {
		idx := (first + i) % n
		server := p.cfg.Upstreams[idx]
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		start := time.Now()
		r, err := p.try(ctx, m, server)
		rtt := time.Since(start)
		if err != nil {
			p.stats.upstreamErrors.Add(1)
			errs = append(errs, err)
			continue
		}
		p.stats.upstream.observe(rtt)
		if idx != first {
			p.preferred.Store(uint32(idx))
		}
		return r, server, rtt, nil
	}
	return nil, netip.AddrPort{}, 0, fmt.Errorf("%w: %w", ErrUpstream, errors.Join(errs...))
}

// try is one upstream's attempt: UDP, then TCP if truncated.
func (p *Proxy) try(ctx context.Context, m *dns.Msg, server netip.AddrPort) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	r, err := p.exchange(ctx, "udp", m, server)
	if err == nil && r.Truncated {
		r, err = p.exchange(ctx, "tcp", m, server)
	}
	if err != nil {
		return nil, err
	}
	if r.Truncated {
		return nil, fmt.Errorf("upstream %s: truncated answer over tcp", server)
	}
	if r.Rcode == dns.RcodeServerFailure || r.Rcode == dns.RcodeRefused {
		return nil, fmt.Errorf("upstream %s: %s", server, dns.RcodeToString[r.Rcode])
	}
	if len(r.Question) != 1 || !strings.EqualFold(r.Question[0].Name, m.Question[0].Name) ||
		r.Question[0].Qtype != m.Question[0].Qtype || r.Question[0].Qclass != m.Question[0].Qclass {
		return nil, fmt.Errorf("upstream %s: answer for another question", server)
	}
	return r, nil
}

// exchange sends m to server over network on a fresh socket made by
// cfg.Dial, and reads the answer with the same id. The socket is closed
// when ctx ends, which aborts the exchange (Shutdown relies on this).
func (p *Proxy) exchange(ctx context.Context, network string, m *dns.Msg, server netip.AddrPort) (*dns.Msg, error) {
	conn, err := p.cfg.Dial(ctx, network, server.String())
	if err != nil {
		return nil, fmt.Errorf("dial upstream %s/%s: %w", server, network, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer func() {
		if stop() {
			conn.Close()
		}
	}()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	// Read with a full-size buffer: an upstream that ignores our advertised
	// size must not turn a good answer into a parse error.
	co := &dns.Conn{Conn: conn, UDPSize: dns.MaxMsgSize}
	if err := co.WriteMsg(m); err != nil {
		return nil, fmt.Errorf("query upstream %s/%s: %w", server, network, ctxErr(ctx, err))
	}
	for {
		r, err := co.ReadMsg()
		if err != nil {
			return nil, fmt.Errorf("read upstream %s/%s: %w", server, network, ctxErr(ctx, err))
		}
		if r.Id == m.Id {
			return r, nil
		}
		if network == "tcp" {
			return nil, fmt.Errorf("read upstream %s/%s: %w", server, network, dns.ErrId)
		}
		// UDP: a late answer to an earlier query on a reused port; skip it.
	}
}

// ctxErr prefers the context's error (timeout, shutdown) over the socket
// error it caused.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}

// defaultDial makes upstream sockets in the caller's network namespace.
func defaultDial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}
