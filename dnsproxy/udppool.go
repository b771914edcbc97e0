package dnsproxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

const (
	// udpSockets is how many connected UDP sockets the proxy keeps open to
	// each upstream. Queries are spread over them round-robin.
	udpSockets = 4
	// udpSocketQueries is how many queries one socket carries before a fresh
	// socket (a new source port) replaces it, so that a long-lived socket
	// does not hand an off-path spoofer a fixed port to aim at.
	udpSocketQueries = 4096
	// maxUDPAnswer is the read buffer of each socket (allocated once per
	// socket): an upstream that ignores the size we advertise must not turn
	// a good answer into a parse error.
	maxUDPAnswer = 65535
	// idTries bounds the draws of a random query id not in flight.
	idTries = 32
	// udpTries is how many sockets one query is sent on when the socket it
	// waits on fails (a read or write error, such as the ECONNREFUSED a
	// single ICMP port unreachable leaves on a connected socket, which an
	// off-path sender can forge). Each retry goes to a usable socket (the
	// failed one is replaced when its slot is next used); an upstream that
	// really refuses fails after udpTries quick round trips.
	udpTries = 3
)

// errNoID is returned when no free query id was found on a socket.
var errNoID = errors.New("no free query id")

// errSocketFailed is wrapped by the error a query gets when the socket it
// waited on failed under it: the query is worth asking again elsewhere.
var errSocketFailed = errors.New("upstream socket failed")

// udpPool is the long-lived UDP sockets to one upstream. A socket is made
// with the proxy's Dial function when a query first needs it (so the
// caller's network-namespace seam still applies), replaced after an error
// or after udpSocketQueries queries, and closed by close.
type udpPool struct {
	addr       string // the upstream's address:port, for Dial and errors
	dial       func(ctx context.Context, network, addr string) (net.Conn, error)
	maxQueries int // queries per socket before it is replaced
	next       atomic.Uint32
	closed     atomic.Bool // set by close; no socket is opened after it
	slots      []udpSlot
}

// udpSlot holds the socket new queries of one slot go to; mu protects cur
// and is held while a replacement is dialled.
type udpSlot struct {
	mu  sync.Mutex
	cur *udpSock
}

// newUDPPool returns a pool of size sockets to addr, each replaced after
// maxQueries queries. It opens no socket yet.
func newUDPPool(addr string, dial func(ctx context.Context, network, addr string) (net.Conn, error), size, maxQueries int) *udpPool {
	return &udpPool{addr: addr, dial: dial, maxQueries: maxQueries, slots: make([]udpSlot, size)}
}

// exchange sends query (a packed message whose id it overwrites) over one of
// the pool's sockets and waits for the answer that carries the same id and
// the same question, or for ctx to end. Answers that match no query in
// flight are dropped. When the socket fails under the query, the query is
// sent again on another (up to udpTries sockets in all): one broken socket
// fails no query that another socket could answer.
func (p *udpPool) exchange(ctx context.Context, query []byte) (*dns.Msg, error) {
	return p.exchangeTries(ctx, query, udpTries)
}

// exchangeTries is exchange on at most tries sockets.
func (p *udpPool) exchangeTries(ctx context.Context, query []byte, tries int) (*dns.Msg, error) {
	q, ok := wireQuestion(query)
	if !ok {
		return nil, fmt.Errorf("query upstream %s/udp: %w", p.addr, dns.ErrBuf)
	}
	err := fmt.Errorf("query upstream %s/udp: no try left", p.addr)
	for range tries {
		var r *dns.Msg
		r, err = p.exchangeOnce(ctx, query, q)
		if err == nil || !errors.Is(err, errSocketFailed) || ctx.Err() != nil {
			return r, err
		}
	}
	return nil, err
}

// exchangeOnce is one try of exchange on one socket; q is query's wire
// question.
func (p *udpPool) exchangeOnce(ctx context.Context, query, q []byte) (*dns.Msg, error) {
	s, w, err := p.register(ctx, query, q, nil)
	if err != nil {
		return nil, err
	}
	if _, err := s.conn.Write(query); err != nil {
		err = fmt.Errorf("query upstream %s/udp: %w: %w", p.addr, errSocketFailed, ctxErr(ctx, err))
		s.fail(err) // the socket is unusable: fail its queries, ours included
		return nil, err
	}
	select {
	case res := <-w.done:
		if res.err != nil {
			return nil, res.err
		}
		r := new(dns.Msg)
		if err := r.Unpack(res.raw); err != nil {
			return nil, fmt.Errorf("read upstream %s/udp: %w", p.addr, err)
		}
		return r, nil
	case <-ctx.Done():
		s.forget(w)
		return nil, fmt.Errorf("read upstream %s/udp: %w", p.addr, ctx.Err())
	}
}

// An upstreamAnswer takes the outcome of a query sent with send.
type upstreamAnswer interface {
	upstreamAnswer(raw []byte, err error)
}

// send is exchangeOnce without the wait: it sends query (overwriting its
// id) on one socket and returns; h.upstreamAnswer is then called exactly
// once, on the socket's reader goroutine with the answer (valid only
// during the call), or with an error: the socket failed (wrapping
// errSocketFailed), timeout passed or ctx ended (from a goroutine of their
// own). When send itself returns an error h is never called. (A timer and
// a function registered with ctx, not a context of its own per query: that
// would cost a context, its timer and its children map for every query.)
func (p *udpPool) send(ctx context.Context, timeout time.Duration, query []byte, h upstreamAnswer) error {
	q, ok := wireQuestion(query)
	if !ok {
		return fmt.Errorf("query upstream %s/udp: %w", p.addr, dns.ErrBuf)
	}
	s, w, err := p.register(ctx, query, q, h)
	if err != nil {
		return err
	}
	w.ctx = ctx
	stop := waitStop{
		ctx:   context.AfterFunc(ctx, w.ctxDone),
		timer: time.AfterFunc(timeout, w.timedOut),
	}
	if !s.arm(w, stop) {
		stop.stop() // already answered or failed: h has run or runs now
	}
	if err := s.write(query); err != nil {
		s.fail(fmt.Errorf("query upstream %s/udp: %w: %w", p.addr, errSocketFailed, ctxErr(ctx, err)))
	}
	return nil
}

// register adds a waiter for question q (of query, whose id it sets) to a
// usable socket, opening one when the slot has none. A waiter with h has
// its result passed to h (see send); one without, sent on its done
// channel.
func (p *udpPool) register(ctx context.Context, query, q []byte, h upstreamAnswer) (*udpSock, *udpWaiter, error) {
	slot := &p.slots[int(p.next.Add(1)%uint32(len(p.slots)))]
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if p.closed.Load() {
		return nil, nil, fmt.Errorf("query upstream %s/udp: %w", p.addr, ErrClosed)
	}
	for range 2 { // a socket that fails between the checks gets one replacement
		s := slot.cur
		if s == nil || !s.usable(p.maxQueries) {
			if s != nil {
				s.retire()
			}
			conn, err := p.dial(ctx, "udp", p.addr)
			if err != nil {
				return nil, nil, fmt.Errorf("dial upstream %s/udp: %w", p.addr, err)
			}
			s = newUDPSock(p.addr, conn)
			slot.cur = s
			go s.read()
		}
		w, err := s.add(query, q, h)
		if err == nil {
			return s, w, nil
		}
		if errors.Is(err, errNoID) {
			return nil, nil, fmt.Errorf("query upstream %s/udp: %w", p.addr, err)
		}
	}
	return nil, nil, fmt.Errorf("query upstream %s/udp: socket keeps failing", p.addr)
}

// close closes every socket; queries still waiting get an error.
func (p *udpPool) close() {
	p.closed.Store(true)
	for i := range p.slots {
		slot := &p.slots[i]
		slot.mu.Lock()
		if slot.cur != nil {
			slot.cur.fail(fmt.Errorf("query upstream %s/udp: %w", p.addr, ErrClosed))
			slot.cur = nil
		}
		slot.mu.Unlock()
	}
}

// udpSock is one connected UDP socket and the queries waiting on it. One
// goroutine (read) reads it and hands each answer to the waiter whose id
// and question it matches.
//
// mu protects every field below it. Invariants: a waiter is in pending
// from before its query is written until it is handed a result (by
// deliver or fail, which remove it first, so it gets at most one) or gives
// up (forget); once dead is set or the socket is retired no waiter is
// added; a retired socket is closed as soon as pending is empty.
type udpSock struct {
	addr string // the upstream's address:port, for errors
	conn net.Conn
	raw  syscall.RawConn // conn's descriptor (nil: not a system socket); see rawwrite.go

	mu      sync.Mutex
	pending map[uint16]*udpWaiter
	sent    int   // waiters ever added
	retired bool  // replaced in its slot: closes when pending empties
	dead    error // the socket failed (or was closed): no new waiter
	ids     [64]byte
	idsLeft int // unused random bytes at the end of ids
}

// udpWaiter is one query in flight on a socket. Its result goes to h
// when it has one (called outside the socket's lock; stop, set by arm
// under it, is called first), else on done.
type udpWaiter struct {
	id       uint16
	question []byte         // wire question (name, type, class) of the query
	done     chan udpResult // buffered: one send never blocks
	h        upstreamAnswer
	stop     waitStop        // ends the wait for a timeout and ctx (see send)
	sock     *udpSock        // the socket the query waits on
	ctx      context.Context // send's: its end ends the wait (ctxDone)
}

// ctxDone and timedOut end a send's wait: h gets the error, unless the
// answer (or another error) came first.
func (w *udpWaiter) ctxDone()  { w.expire(w.ctx.Err()) }
func (w *udpWaiter) timedOut() { w.expire(context.DeadlineExceeded) }

func (w *udpWaiter) expire(err error) {
	if w.sock.forget(w) {
		w.h.upstreamAnswer(nil, fmt.Errorf("read upstream %s/udp: %w", w.sock.addr, err))
	}
}

// waitStop is what ends a send's wait: its timer and its function
// registered with ctx.
type waitStop struct {
	ctx   func() bool
	timer *time.Timer
}

func (ws waitStop) stop() {
	if ws.ctx != nil {
		ws.ctx()
		ws.timer.Stop()
	}
}

// result hands w its result (once: the caller removed w from pending).
// stop is w.stop as read under the socket's lock.
func (w *udpWaiter) result(stop waitStop, raw []byte, err error) {
	if w.h == nil {
		if raw != nil {
			raw = bytes.Clone(raw)
		}
		w.done <- udpResult{raw: raw, err: err}
		return
	}
	stop.stop()
	w.h.upstreamAnswer(raw, err)
}

type udpResult struct {
	raw []byte // the answer, owned by the waiter
	err error
}

func newUDPSock(addr string, conn net.Conn) *udpSock {
	return &udpSock{addr: addr, conn: conn, raw: rawSocket(conn), pending: map[uint16]*udpWaiter{}}
}

// write sends query on the socket (a raw write when it is a system
// socket: rawwrite.go).
func (s *udpSock) write(query []byte) error {
	if s.raw != nil {
		return rawWrite(s.raw, query)
	}
	_, err := s.conn.Write(query)
	return err
}

// usable reports whether new queries may go to s, which may carry
// maxQueries in all.
func (s *udpSock) usable(maxQueries int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead == nil && !s.retired && s.sent < maxQueries
}

// add registers a waiter for question q under a random id not in flight,
// and writes the id into query (under the lock, so that whoever gets the
// waiter's result finds it written).
func (s *udpSock) add(query, q []byte, h upstreamAnswer) (*udpWaiter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead != nil {
		return nil, s.dead
	}
	for range idTries {
		id, err := s.randomIDLocked()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errNoID, err)
		}
		if _, taken := s.pending[id]; taken {
			continue
		}
		w := &udpWaiter{id: id, question: q, h: h, sock: s}
		if h == nil {
			w.done = make(chan udpResult, 1)
		}
		binary.BigEndian.PutUint16(query, id)
		s.pending[id] = w
		s.sent++
		return w, nil
	}
	return nil, errNoID
}

// randomIDLocked draws a query id from the system's cryptographic random
// source (fetched a few dozen ids at a time).
func (s *udpSock) randomIDLocked() (uint16, error) {
	if s.idsLeft < 2 {
		if _, err := rand.Read(s.ids[:]); err != nil {
			return 0, err
		}
		s.idsLeft = len(s.ids)
	}
	s.idsLeft -= 2
	return binary.BigEndian.Uint16(s.ids[s.idsLeft:]), nil
}

// forget removes a waiter that gave up; a later answer for it is dropped.
// It reports whether w was still waiting (no result was handed to it).
func (s *udpSock) forget(w *udpWaiter) bool {
	s.mu.Lock()
	waiting := s.pending[w.id] == w
	if waiting {
		delete(s.pending, w.id)
	}
	closeNow := s.retired && len(s.pending) == 0
	s.mu.Unlock()
	if closeNow {
		s.conn.Close()
	}
	return waiting
}

// arm records stop as the function that ends w's wait for its context; it
// reports false when w has its result already.
func (s *udpSock) arm(w *udpWaiter, stop waitStop) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending[w.id] != w {
		return false
	}
	w.stop = stop
	return true
}

// retire stops new queries on s and closes it once none is waiting.
func (s *udpSock) retire() {
	s.mu.Lock()
	s.retired = true
	closeNow := len(s.pending) == 0
	s.mu.Unlock()
	if closeNow {
		s.conn.Close()
	}
}

// fail marks s dead, closes it and hands err to every waiter.
func (s *udpSock) fail(err error) {
	s.mu.Lock()
	if s.dead == nil {
		s.dead = err
	}
	type failed struct {
		w    *udpWaiter
		stop waitStop
	}
	waiters := make([]failed, 0, len(s.pending))
	for _, w := range s.pending {
		waiters = append(waiters, failed{w, w.stop})
	}
	s.pending = map[uint16]*udpWaiter{}
	s.mu.Unlock()
	s.conn.Close()
	for _, f := range waiters {
		f.w.result(f.stop, nil, err)
	}
}

// read is the socket's only reader: it runs until the socket fails or is
// closed.
func (s *udpSock) read() {
	buf := make([]byte, maxUDPAnswer)
	for {
		n, err := s.conn.Read(buf)
		if err != nil {
			s.fail(fmt.Errorf("read upstream %s/udp: %w: %w", s.conn.RemoteAddr(), errSocketFailed, err))
			return
		}
		s.deliver(buf[:n])
	}
}

// deliver hands pkt to the waiter with its id, if pkt is an answer to that
// waiter's question; anything else (a late answer to a query that gave up,
// a mismatched question, garbage) is dropped.
func (s *udpSock) deliver(pkt []byte) {
	if len(pkt) < headerLen || pkt[2]&0x80 == 0 { // too short, or not a response
		return
	}
	id := binary.BigEndian.Uint16(pkt)
	s.mu.Lock()
	w := s.pending[id]
	if w == nil || !sameQuestion(pkt, w.question) {
		s.mu.Unlock()
		return
	}
	delete(s.pending, id)
	stop := w.stop
	closeNow := s.retired && len(s.pending) == 0
	s.mu.Unlock()
	w.result(stop, pkt, nil)
	if closeNow {
		s.conn.Close()
	}
}

// headerLen is the size of a DNS message header.
const headerLen = 12

// wireQuestion returns the question (name, type, class) of a packed query
// that has exactly one, uncompressed, as it is on the wire.
func wireQuestion(msg []byte) ([]byte, bool) {
	if len(msg) < headerLen || binary.BigEndian.Uint16(msg[4:]) != 1 {
		return nil, false
	}
	i := headerLen
	for i < len(msg) && msg[i] != 0 {
		if msg[i] > 63 {
			return nil, false // a compression pointer or a reserved label type
		}
		i += int(msg[i]) + 1
	}
	end := i + 1 + 4 // root label, type, class
	if end > len(msg) {
		return nil, false
	}
	return msg[headerLen:end], true
}

// sameQuestion reports whether the answer pkt carries exactly one question
// equal to q: the name compared without regard to ASCII case (resolvers
// may echo it with other case), type and class byte for byte.
func sameQuestion(pkt, q []byte) bool {
	got, ok := wireQuestion(pkt)
	if !ok || len(got) != len(q) {
		return false
	}
	nameEnd := len(q) - 4
	for i := range nameEnd {
		// Label length bytes are below 64, so folding letters alone
		// cannot make two different names equal.
		if lowerByte(got[i]) != lowerByte(q[i]) {
			return false
		}
	}
	return bytes.Equal(got[nameEnd:], q[nameEnd:])
}

func lowerByte(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + ('a' - 'A')
	}
	return b
}
