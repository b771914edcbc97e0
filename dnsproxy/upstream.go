package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// ErrUpstream is wrapped by forward's error when no upstream gave a usable
// answer.
var ErrUpstream = errors.New("all upstreams failed")

// queryBufSize fits any query the proxy sends: a name of at most 255
// bytes, one question, one OPT record.
const queryBufSize = 512

// queryBufs recycles the buffers queries are packed into. Each holds two
// spare bytes in front of the message for the TCP length prefix.
var queryBufs = sync.Pool{New: func() any { b := make([]byte, queryBufSize); return &b }}

// queryFlags are what a client's query asks of the upstream's answer.
type queryFlags struct {
	cd bool // checking disabled: the client validates itself
	do bool // DNSSEC OK: the client wants the signatures
}

// forward asks the upstreams for q: over UDP first, over TCP when the UDP
// answer is truncated, each try bounded by cfg.Timeout, moving to the next
// upstream on an error, a timeout, SERVFAIL or REFUSED. It starts with the
// upstream that answered last, so a dead first upstream does not cost a
// timeout per query. It returns the answer, the index of the upstream that
// gave it and the round trip.
func (p *Proxy) forward(ctx context.Context, q dns.Question, fl queryFlags) (*dns.Msg, int, time.Duration, error) {
	m := dns.Msg{Question: []dns.Question{q}}
	m.RecursionDesired = true
	m.CheckingDisabled = fl.cd
	m.SetEdns0(ednsSize, fl.do)
	bp := queryBufs.Get().(*[]byte)
	defer queryBufs.Put(bp)
	wire, err := m.PackBuffer((*bp)[2:])
	if err != nil {
		return nil, 0, 0, fmt.Errorf("%w: pack query: %w", ErrUpstream, err)
	}
	frame := (*bp)[:2+len(wire)]
	if &frame[2] != &wire[0] {
		// The buffer was too small and PackBuffer allocated: frame it anew.
		frame = append([]byte{0, 0}, wire...)
	}

	n := len(p.cfg.Upstreams)
	first := int(p.preferred.Load()) % n
	var errs []error
	for i := range n {
		idx := (first + i) % n
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		start := time.Now()
		r, err := p.try(ctx, idx, q, frame)
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
		return r, idx, rtt, nil
	}
	return nil, 0, 0, fmt.Errorf("%w: %w", ErrUpstream, errors.Join(errs...))
}

// try is one upstream's attempt: UDP, then TCP if truncated. frame is the
// packed query for q after two spare bytes (try sets them and the query
// id).
func (p *Proxy) try(ctx context.Context, idx int, q dns.Question, frame []byte) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	server := p.upstreamAddrs[idx]
	wire := frame[2:]
	r, err := p.udp[idx].exchange(ctx, wire)
	if err == nil && r.Truncated {
		r, err = p.exchangeTCP(ctx, server, frame)
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
	if len(r.Question) != 1 || !strings.EqualFold(r.Question[0].Name, q.Name) ||
		r.Question[0].Qtype != q.Qtype || r.Question[0].Qclass != q.Qclass {
		return nil, fmt.Errorf("upstream %s: answer for another question", server)
	}
	return r, nil
}

// exchangeTCP sends the query in frame (two spare bytes, then the packed
// query) to server over a fresh TCP connection made by cfg.Dial, and reads
// the answer with the same id. The connection is closed when ctx ends,
// which aborts the exchange (Shutdown relies on this).
func (p *Proxy) exchangeTCP(ctx context.Context, server string, frame []byte) (*dns.Msg, error) {
	conn, err := p.cfg.Dial(ctx, "tcp", server)
	if err != nil {
		return nil, fmt.Errorf("dial upstream %s/tcp: %w", server, err)
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
	binary.BigEndian.PutUint16(frame, uint16(len(frame)-2))
	if _, err := conn.Write(frame); err != nil {
		return nil, fmt.Errorf("query upstream %s/tcp: %w", server, ctxErr(ctx, err))
	}
	var lenBuf [2]byte
	if _, err := io.ReadFull(conn, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("read upstream %s/tcp: %w", server, ctxErr(ctx, err))
	}
	raw := make([]byte, binary.BigEndian.Uint16(lenBuf[:]))
	if _, err := io.ReadFull(conn, raw); err != nil {
		return nil, fmt.Errorf("read upstream %s/tcp: %w", server, ctxErr(ctx, err))
	}
	r := new(dns.Msg)
	if err := r.Unpack(raw); err != nil {
		return nil, fmt.Errorf("read upstream %s/tcp: %w", server, err)
	}
	if r.Id != binary.BigEndian.Uint16(frame[2:]) {
		return nil, fmt.Errorf("read upstream %s/tcp: %w", server, dns.ErrId)
	}
	return r, nil
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
