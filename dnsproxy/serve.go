package dnsproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

const (
	// tcpIdleTimeout bounds the wait for one whole query (its length and
	// its message) on a TCP connection, the first or the next: a client
	// that holds a connection without asking frees its slot this soon.
	tcpIdleTimeout  = 3 * time.Second
	tcpWriteTimeout = 5 * time.Second
	maxTCPConns     = 1024 // open TCP connections, all sessions
	// maxTCPPerClient is one session's share of the TCP slots: the
	// connections open from one guest address. Connections from any other
	// source are closed at once (see trackConn).
	maxTCPPerClient = 8
	udpBatch        = 32   // datagrams per recvmmsg
	udpBufSize      = 4096 // largest query accepted over UDP
	udpReadBuffer   = 4 << 20
)

// Serve answers queries arriving on udp and tcp (either may be nil) until
// Shutdown, then returns ErrClosed; it returns another error when a socket
// fails for good (and closes both sockets). The caller creates the sockets
// (for example inside the daemon's network namespace); from then on the
// proxy owns them: Shutdown closes them once the queries in flight are
// answered. Serve may be called more than once, for several socket pairs.
func (p *Proxy) Serve(udp net.PacketConn, tcp net.Listener) error {
	if udp == nil && tcp == nil {
		return errors.New("serve dns: no socket")
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		closeAll(udp, tcp)
		return ErrClosed
	}
	if udp != nil {
		p.pconns = append(p.pconns, udp)
	}
	if tcp != nil {
		p.lns = append(p.lns, tcp)
	}
	p.wg.Add(1) // this Serve call; Shutdown waits for it
	p.mu.Unlock()
	defer p.wg.Done()

	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	fail := func(err error) {
		once.Do(func() {
			firstErr = err
			closeAll(udp, tcp)
		})
	}
	if uc, ok := udp.(*net.UDPConn); ok {
		p.growReadBuffer(uc)
	}
	if udp != nil {
		readers := min(runtime.GOMAXPROCS(0), 4)
		for range readers {
			p.stats.udpLoops.Add(1)
			wg.Go(func() {
				defer p.stats.udpLoops.Add(-1)
				if err := p.serveUDP(udp); err != nil {
					fail(err)
				}
			})
		}
	}
	if tcp != nil {
		p.stats.tcpLoops.Add(1)
		wg.Go(func() {
			defer p.stats.tcpLoops.Add(-1)
			if err := p.serveTCP(tcp); err != nil {
				fail(err)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ErrClosed
}

func closeAll(udp net.PacketConn, tcp net.Listener) {
	if udp != nil {
		udp.Close()
	}
	if tcp != nil {
		tcp.Close()
	}
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// serveUDP is one reader of a UDP socket. Shutdown wakes it with a read
// deadline; it returns nil then, and an error only when the socket fails
// for good. A real UDP socket is read in batches (recvmmsg), other packet
// conns (test fakes) one datagram at a time.
func (p *Proxy) serveUDP(pc net.PacketConn) error {
	read := p.singleReader(pc)
	if uc, ok := pc.(*net.UDPConn); ok {
		read = p.batchReader(uc)
	}
	rs := newReplySocket(pc)
	failures := 0
	for {
		err := read(func(data []byte, addr net.Addr) {
			src, ok := addrPortOf(addr)
			if !ok {
				return
			}
			p.serveQuery(rs, src.Addr(), addr, data)
		})
		if err == nil {
			failures = 0
			continue
		}
		if p.isClosed() {
			return nil
		}
		if errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("read dns udp %s: %w", pc.LocalAddr(), err)
		}
		if failures++; failures > 100 {
			return fmt.Errorf("read dns udp %s: %w", pc.LocalAddr(), err)
		}
		p.log.Warn("dnsproxy: udp read failed", "addr", pc.LocalAddr(), "err", err)
		time.Sleep(10 * time.Millisecond)
	}
}

// A udpRead reads at least one datagram and passes each to fn (data is
// reused after fn returns).
type udpRead func(fn func(data []byte, addr net.Addr)) error

func (p *Proxy) singleReader(pc net.PacketConn) udpRead {
	buf := make([]byte, udpBufSize)
	return func(fn func([]byte, net.Addr)) error {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		fn(buf[:n], addr)
		return nil
	}
}

// batchReader reads up to udpBatch datagrams per system call: under a
// flood the reader must outrun the senders, or the kernel drops queries of
// every session alike when the socket buffer fills.
func (p *Proxy) batchReader(uc *net.UDPConn) udpRead {
	bc := ipv4.NewPacketConn(uc)
	ms := make([]ipv4.Message, udpBatch)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, udpBufSize)}
	}
	return func(fn func([]byte, net.Addr)) error {
		n, err := bc.ReadBatch(ms, 0)
		if err != nil {
			return err
		}
		for i := range n {
			m := &ms[i]
			if m.Flags&unix.MSG_TRUNC != 0 {
				p.stats.malformed.Add(1) // larger than any sane query
				continue
			}
			fn(m.Buffers[0][:m.N], m.Addr)
		}
		return nil
	}
}

// growReadBuffer raises the socket's receive buffer to absorb bursts,
// beyond net.core.rmem_max when the process may (CAP_NET_ADMIN).
func (p *Proxy) growReadBuffer(uc *net.UDPConn) {
	rc, err := uc.SyscallConn()
	if err == nil {
		var serr error
		err = rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, udpReadBuffer)
		})
		if err == nil && serr == nil {
			return
		}
	}
	if err := uc.SetReadBuffer(udpReadBuffer); err != nil {
		p.log.Warn("dnsproxy: cannot raise the udp receive buffer", "addr", uc.LocalAddr(), "err", err)
	}
}

// serveQuery answers one UDP query (data, valid only during the call) from
// src. A registered session's query goes through the scheduler; when it
// may start at once it starts on the reader's goroutine, which parses and
// decides it and sends it upstream without waiting (data is not copied):
// the upstream socket's reader finishes it (filter, attest, reply) and
// only then releases its slot (handleAsync). A query that needs no
// upstream is answered at once. A query that must wait keeps a copy of
// data. A query from an unknown source gets REFUSED inline (handleAsync
// too: should the source register meanwhile, its query still never holds
// up the reader).
func (p *Proxy) serveQuery(rs *replySocket, src netip.Addr, addr net.Addr, data []byte) {
	if p.session(src) == nil {
		p.handleAsync(src, data, &udpReply{rs: rs, addr: addr})
		return
	}
	if t, ok := p.sched.tryStart(src); ok {
		p.handleAsync(src, data, &udpReply{rs: rs, addr: addr, t: t})
		return
	}
	// The job runs after this returns (queued): it keeps its own copy.
	pkt := bytes.Clone(data)
	p.sched.submitTicket(src, func(t ticket) {
		p.handleAsync(src, pkt, &udpReply{rs: rs, addr: addr, t: t})
	}, nil, false)
}

// udpReply sends a UDP query's reply to its client from the socket the
// query came in on, then frees the query's slot (t; none for an unknown
// source).
type udpReply struct {
	rs   *replySocket
	addr net.Addr
	t    ticket
}

func (r *udpReply) send(out []byte) {
	if out != nil {
		r.rs.writeTo(out, r.addr)
	}
}

func (r *udpReply) done() {
	if r.t.s != nil {
		r.t.release()
	}
}

// dispatch runs fn for a query from src: through the scheduler for a
// registered session, inline (it needs no upstream: REFUSED) otherwise.
func (p *Proxy) dispatch(src netip.Addr, fn func(context.Context), shed func()) {
	if p.session(src) == nil {
		fn(p.ctx)
		return
	}
	p.sched.submit(src.Unmap(), func() { fn(p.ctx) }, shed)
}

// serveTCP accepts connections until the listener is closed.
func (p *Proxy) serveTCP(ln net.Listener) error {
	backoff := 5 * time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) || isTemporary(err) {
				p.log.Warn("dnsproxy: tcp accept failed", "addr", ln.Addr(), "err", err)
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
				continue
			}
			return fmt.Errorf("accept dns tcp %s: %w", ln.Addr(), err)
		}
		backoff = 5 * time.Millisecond
		src, ok := addrPortOf(c.RemoteAddr())
		if !ok || !p.trackConn(c, src.Addr()) {
			c.Close()
			continue
		}
		go p.serveTCPConn(c, src.Addr())
	}
}

// isTemporary reports accept errors worth retrying (descriptor or buffer
// exhaustion, a connection aborted before it was accepted).
func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// trackConn registers an accepted connection, refusing it when the proxy
// is closed, when src is no registered session's guest address, or when
// the connection limits are reached. A source that is no session would get
// nothing but REFUSED, and counting every source alike would let a local
// user holding idle connections from all of 127.0.0.0/8 take every slot
// from the sessions. It adds the connection to p.wg; untrackConn releases
// it.
func (p *Proxy) trackConn(c net.Conn, src netip.Addr) bool {
	if p.session(src) == nil {
		p.stats.tcpRefused.Add(1)
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.conns) >= maxTCPConns || p.tcpPer[src] >= maxTCPPerClient {
		p.stats.tcpRefused.Add(1)
		return false
	}
	p.conns[c] = struct{}{}
	p.tcpPer[src]++
	p.wg.Add(1)
	return true
}

func (p *Proxy) untrackConn(c net.Conn, src netip.Addr) {
	p.mu.Lock()
	delete(p.conns, c)
	if p.tcpPer[src]--; p.tcpPer[src] <= 0 {
		delete(p.tcpPer, src)
	}
	p.mu.Unlock()
	c.Close()
	p.wg.Done()
}

// serveTCPConn answers the queries of one connection, one at a time. It
// closes the connection when idle, on a read error, when a query is shed,
// and at Shutdown.
func (p *Proxy) serveTCPConn(c net.Conn, src netip.Addr) {
	defer p.untrackConn(c, src)
	var lenBuf [2]byte
	for {
		if p.isClosed() {
			return
		}
		c.SetReadDeadline(time.Now().Add(tcpIdleTimeout))
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		msg := make([]byte, binary.BigEndian.Uint16(lenBuf[:]))
		if _, err := io.ReadFull(c, msg); err != nil {
			return
		}
		reply := make(chan []byte, 1)
		p.dispatch(src, func(ctx context.Context) {
			reply <- p.handle(ctx, src, msg, true)
		}, func() { reply <- nil })
		out := <-reply
		if out == nil {
			// Shed or malformed: close, so that a client waiting for
			// this answer does not wait forever.
			return
		}
		c.SetWriteDeadline(time.Now().Add(tcpWriteTimeout))
		frame := make([]byte, 2+len(out))
		binary.BigEndian.PutUint16(frame, uint16(len(out)))
		copy(frame[2:], out)
		if _, err := c.Write(frame); err != nil {
			return
		}
	}
}

// addrPortOf extracts the source address of a packet or connection.
func addrPortOf(a net.Addr) (netip.AddrPort, bool) {
	switch a := a.(type) {
	case *net.UDPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), ap.IsValid()
	case *net.TCPAddr:
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), ap.IsValid()
	case nil:
		return netip.AddrPort{}, false
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
	}
}
