package dnsproxy

import (
	"bytes"
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

// asyncQueryBufSize fits the query of a name of up to about 100 bytes:
// the buffer of an asyncQuery (a longer name's is allocated).
const asyncQueryBufSize = 128

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
	bp := queryBufs.Get().(*[]byte)
	defer queryBufs.Put(bp)
	frame, err := packUpstreamQuery(q, fl, *bp)
	if err != nil {
		return nil, 0, 0, err
	}
	return p.forwardFrame(ctx, q, frame, int(p.preferred.Load())%len(p.cfg.Upstreams), nil)
}

// packUpstreamQuery packs the upstream query for q into buf (or a new
// buffer when buf is too small): frame is two spare bytes, then the query.
// The query is written directly (header, the one question, an OPT record
// advertising ednsSize with DO as asked): the same bytes dns.Msg would
// pack (TestPackUpstreamQueryWire), without a message, an OPT record and
// a compression pass per query.
func packUpstreamQuery(q dns.Question, fl queryFlags, buf []byte) (frame []byte, err error) {
	const optLen = 11 // root name, type, class (payload size), ttl (ext. rcode, version, flags), rdlength
	if need := 2 + headerLen + len(q.Name) + 1 + 4 + optLen; len(buf) < need {
		buf = make([]byte, need+8) // a name with escapes packs shorter than its text
	}
	b := buf[2:]
	clear(b[:headerLen])
	flags := uint16(0x0100) // RD
	if fl.cd {
		flags |= 0x0010 // CD
	}
	binary.BigEndian.PutUint16(b[2:], flags)
	binary.BigEndian.PutUint16(b[4:], 1)  // qdcount
	binary.BigEndian.PutUint16(b[10:], 1) // arcount: the OPT record
	off, err := dns.PackDomainName(q.Name, b, headerLen, nil, false)
	if err != nil {
		return nil, fmt.Errorf("%w: pack query: %w", ErrUpstream, err)
	}
	if off+4+optLen > len(b) {
		return nil, fmt.Errorf("%w: pack query %q: %w", ErrUpstream, q.Name, dns.ErrBuf)
	}
	binary.BigEndian.PutUint16(b[off:], q.Qtype)
	binary.BigEndian.PutUint16(b[off+2:], q.Qclass)
	off += 4
	o := b[off : off+optLen]
	o[0] = 0 // the root name
	binary.BigEndian.PutUint16(o[1:], dns.TypeOPT)
	binary.BigEndian.PutUint16(o[3:], ednsSize)
	ttl := uint32(0) // extended rcode 0, version 0
	if fl.do {
		ttl |= 0x8000 // DO
	}
	binary.BigEndian.PutUint32(o[5:], ttl)
	binary.BigEndian.PutUint16(o[9:], 0) // no options
	return buf[:2+off+optLen], nil
}

// udpTry is the first UDP exchange of an upstream's try, made elsewhere
// (see forwardAsync): its context (the try's deadline; cancel is called
// once the try ends), its start, its outcome and the sockets it used.
type udpTry struct {
	ctx    context.Context
	cancel context.CancelFunc
	start  time.Time
	r      *dns.Msg
	err    error
	tries  int
}

// forwardFrame is forward for the packed query in frame, starting with
// upstream first; when ft is not nil the first upstream's try has begun
// with ft and is carried on from there.
func (p *Proxy) forwardFrame(ctx context.Context, q dns.Question, frame []byte, first int, ft *udpTry) (*dns.Msg, int, time.Duration, error) {
	n := len(p.cfg.Upstreams)
	var errs []error
	for i := range n {
		idx := (first + i) % n
		var (
			r   *dns.Msg
			err error
			rtt time.Duration
		)
		if i == 0 && ft != nil {
			r, err = p.tryRest(ft.ctx, idx, q, frame, ft.r, ft.err, ft.tries)
			ft.cancel()
			rtt = time.Since(ft.start)
		} else {
			if err := ctx.Err(); err != nil {
				errs = append(errs, err)
				break
			}
			start := time.Now()
			r, err = p.try(ctx, idx, q, frame)
			rtt = time.Since(start)
		}
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
	r, err := p.udp[idx].exchange(ctx, frame[2:])
	return p.tryRest(ctx, idx, q, frame, r, err, udpTries)
}

// tryRest carries on a try whose UDP exchange gave (r, err) after using
// tries sockets: asks again on another socket when the socket failed under
// the query (up to udpTries in all), over TCP when the answer is truncated,
// and checks the answer.
func (p *Proxy) tryRest(ctx context.Context, idx int, q dns.Question, frame []byte, r *dns.Msg, err error, tries int) (*dns.Msg, error) {
	if err != nil && errors.Is(err, errSocketFailed) && ctx.Err() == nil && tries < udpTries {
		r, err = p.udp[idx].exchangeTries(ctx, frame[2:], udpTries-tries)
	}
	server := p.upstreamAddrs[idx]
	if err == nil && r.Truncated {
		r, err = p.exchangeTCP(ctx, server, frame)
	}
	if err != nil {
		return nil, err
	}
	if err := p.checkAnswer(server, q, r); err != nil {
		return nil, err
	}
	return r, nil
}

// checkAnswer rejects an answer the try must not return: truncated (over
// TCP), SERVFAIL or REFUSED, or for another question.
func (p *Proxy) checkAnswer(server string, q dns.Question, r *dns.Msg) error {
	if r.Truncated {
		return fmt.Errorf("upstream %s: truncated answer over tcp", server)
	}
	if r.Rcode == dns.RcodeServerFailure || r.Rcode == dns.RcodeRefused {
		return fmt.Errorf("upstream %s: %s", server, dns.RcodeToString[r.Rcode])
	}
	if len(r.Question) != 1 || !strings.EqualFold(r.Question[0].Name, q.Name) ||
		r.Question[0].Qtype != q.Qtype || r.Question[0].Qclass != q.Qclass {
		return fmt.Errorf("upstream %s: answer for another question", server)
	}
	return nil
}

// forwardAsync is forward without waiting: it sends the query for a.q to
// the preferred upstream over UDP and returns; a.done is called exactly
// once with forward's results. When that first exchange brings a usable
// answer (the common case), a.done runs on the upstream socket's reader
// goroutine, so no goroutine is woken for it; anything else (a failed
// socket, a truncated or refused answer, a timeout, the session's end)
// carries the query on as forward would, on a goroutine of its own. The
// upstream waits end with a.ctx (the session's) as in forward. The caller
// sets a.ctx, a.q, a.flags and a.done; a is the query's state on the
// socket from then on (one object, no closure per query).
func (p *Proxy) forwardAsync(a *asyncQuery) {
	a.p = p
	// The frame is this query's own (not from queryBufs): the socket's
	// reader may finish the query while send's write still reads it.
	frame, err := packUpstreamQuery(a.q, a.flags, a.buf[:])
	if err != nil {
		a.done.forwarded(nil, 0, 0, err)
		return
	}
	a.frame = frame
	a.first = int(p.preferred.Load()) % len(p.cfg.Upstreams)
	if a.ctx.Err() != nil {
		go func() { a.done.forwarded(p.forwardFrame(a.ctx, a.q, frame, a.first, nil)) }()
		return
	}
	a.start = time.Now()
	if err := p.udp[a.first].send(a.ctx, p.cfg.Timeout, frame[2:], a); err != nil {
		a.carryOn(nil, err)
	}
}

// asyncQuery is one query forwardAsync sends: what it was asked, the
// packed query (buf holds a name of up to about 100 bytes; a longer one
// gets a buffer of its own) and where its outcome goes.
type asyncQuery struct {
	p     *Proxy
	ctx   context.Context
	q     dns.Question
	flags queryFlags
	done  forwardDone
	first int       // the upstream asked first
	start time.Time // when it was asked
	frame []byte
	buf   [asyncQueryBufSize]byte
}

// A forwardDone takes forward's results for an asyncQuery.
type forwardDone interface {
	forwarded(r *dns.Msg, idx int, rtt time.Duration, err error)
}

// upstreamAnswer takes the first exchange's outcome (see udpPool.send).
func (a *asyncQuery) upstreamAnswer(raw []byte, err error) {
	p := a.p
	if err != nil {
		a.carryOn(nil, err)
		return
	}
	r := new(dns.Msg)
	if err := r.Unpack(raw); err != nil {
		a.carryOn(nil, fmt.Errorf("read upstream %s/udp: %w", p.upstreamAddrs[a.first], err))
		return
	}
	if r.Truncated || p.checkAnswer(p.upstreamAddrs[a.first], a.q, r) != nil {
		a.carryOn(r, nil)
		return
	}
	rtt := time.Since(a.start)
	p.stats.upstream.observe(rtt)
	a.done.forwarded(r, a.first, rtt, nil)
}

// carryOn finishes the query as forward would, from the first exchange's
// outcome, on a goroutine of its own.
func (a *asyncQuery) carryOn(r *dns.Msg, err error) {
	p := a.p
	// A copy: the retries write new ids into it while send's write may
	// still read the first one.
	frame := bytes.Clone(a.frame)
	go func() {
		// The rest of the try keeps the try's deadline.
		tctx, cancel := context.WithDeadline(a.ctx, a.start.Add(p.cfg.Timeout))
		a.done.forwarded(p.forwardFrame(a.ctx, a.q, frame, a.first, &udpTry{ctx: tctx, cancel: cancel, start: a.start, r: r, err: err, tries: 1}))
	}()
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
