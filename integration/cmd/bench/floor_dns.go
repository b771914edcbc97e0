package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// dnsForwardArg makes this binary figure 4's DNS floor (issue 25): a
// minimal UDP forwarder in Go, no policy, no attest, no log, no cache. One
// socket listens; each query gets a fresh 16-bit ID and goes out on one
// socket connected to the upstream; the answer's ID finds the client and
// its own ID, and the answer goes back from the listening socket. Two
// goroutines, one table lookup per query: what forwarding alone costs in Go,
// so that the proxy's figure over it is what policy and attest cost.
const dnsForwardArg = "dns-forward"

func dnsForwardMain(args []string) int {
	fs := flag.NewFlagSet(dnsForwardArg, flag.ContinueOnError)
	listen := fs.String("listen", "", "address:port to answer on")
	upstream := fs.String("upstream", "", "address:port to forward to")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	la, err1 := netip.ParseAddrPort(*listen)
	ua, err2 := netip.ParseAddrPort(*upstream)
	if err1 != nil || err2 != nil {
		fmt.Fprintf(os.Stderr, "%s: -listen %q, -upstream %q: want address:port each\n", dnsForwardArg, *listen, *upstream)
		return 2
	}
	if err := dnsForward(la, ua); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", dnsForwardArg, err)
		return 1
	}
	return 0
}

// dnsForward serves until SIGTERM.
func dnsForward(listen, upstream netip.AddrPort) error {
	l, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(listen))
	if err != nil {
		return err
	}
	defer l.Close()
	u, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(upstream))
	if err != nil {
		return err
	}
	defer u.Close()
	type pending struct {
		client netip.AddrPort
		id     uint16
	}
	var (
		mu    sync.Mutex
		table [1 << 16]pending
		next  uint16
	)
	go func() { // answers: upstream -> client
		buf := make([]byte, 65535)
		for {
			n, err := u.Read(buf)
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			mu.Lock()
			p := table[binary.BigEndian.Uint16(buf)]
			mu.Unlock()
			if !p.client.IsValid() {
				continue
			}
			binary.BigEndian.PutUint16(buf, p.id)
			l.WriteToUDPAddrPort(buf[:n], p.client)
		}
	}()
	go func() { // queries: client -> upstream
		buf := make([]byte, 65535)
		for {
			n, client, err := l.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if n < 12 {
				continue
			}
			mu.Lock()
			next++
			id := next
			table[id] = pending{client: client, id: binary.BigEndian.Uint16(buf)}
			mu.Unlock()
			binary.BigEndian.PutUint16(buf, id)
			u.Write(buf[:n])
		}
	}()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	<-ctx.Done()
	return nil
}

// goForwarder runs the floor in the simulated host at the sessions' DNS
// address (where dnsmasq answers in its turn), forwarding to the upstream,
// and measures it as the peer is measured.
func (b *dnsBench) goForwarder(ctx context.Context) (dnsRun, error) {
	self, err := os.Executable()
	if err != nil {
		return dnsRun{}, err
	}
	at := netip.AddrPortFrom(b.dnsAddr, 53)
	p, err := startProc("go forwarder", filepath.Join(b.cfg.tmp, "dns-floor.log"), inNS(b.e.w.HostPath,
		self, dnsForwardArg, "-listen", at.String(), "-upstream", upstreamAddr.String())...)
	if err != nil {
		return dnsRun{}, err
	}
	defer p.stop(5 * time.Second)
	if err := b.waitAnswer(at, p); err != nil {
		return dnsRun{}, fmt.Errorf("go forwarder: %w", err)
	}
	return b.measure(ctx, at)
}
