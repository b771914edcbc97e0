package world

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// startServers starts, inside the simulated internet, the DNS server and on
// every web, metadata and private address an HTTP server (:80), a TCP echo
// (:7) and a UDP echo (:7). Sockets are created inside the namespace; the
// goroutines serving them may run on any thread.
func (w *World) startServers() error {
	w.DNS = newDNSServer(netip.AddrPortFrom(dnsAddr, 53))
	if err := w.DNS.start(w); err != nil {
		return err
	}
	for _, a := range append(append([]netip.Addr{}, webAddrs...), metadataAddr, cloudHostAddr, privateAddr) {
		if err := w.startEchoAndHTTP(a); err != nil {
			return err
		}
	}
	return nil
}

// ListenTCP opens a TCP listener inside the namespace at nsPath.
func ListenTCP(nsPath string, addr netip.AddrPort) (net.Listener, error) {
	var l net.Listener
	err := DoPath(nsPath, func() (err error) {
		l, err = net.Listen(family("tcp4", addr.Addr()), addr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen tcp %s in %s: %w", addr, nsPath, err)
	}
	return l, nil
}

// ListenUDP opens a UDP socket inside the namespace at nsPath.
func ListenUDP(nsPath string, addr netip.AddrPort) (net.PacketConn, error) {
	var c net.PacketConn
	err := DoPath(nsPath, func() (err error) {
		c, err = net.ListenPacket(family("udp4", addr.Addr()), addr.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen udp %s in %s: %w", addr, nsPath, err)
	}
	return c, nil
}

func (w *World) startEchoAndHTTP(a netip.Addr) error {
	tl, err := ListenTCP(w.NetPath, netip.AddrPortFrom(a, 7))
	if err != nil {
		return err
	}
	w.onClose(tl.Close)
	go ServeTCPEcho(tl)

	ul, err := ListenUDP(w.NetPath, netip.AddrPortFrom(a, 7))
	if err != nil {
		return err
	}
	w.onClose(ul.Close)
	go ServeUDPEcho(ul)

	hl, err := ListenTCP(w.NetPath, netip.AddrPortFrom(a, 80))
	if err != nil {
		return err
	}
	body := "hello from " + a.String() + "\n"
	srv := &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			io.WriteString(rw, body)
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	w.onClose(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return srv.Shutdown(ctx)
	})
	go srv.Serve(hl)
	return nil
}

// ServeTCPEcho echoes every connection accepted on l until l is closed.
func ServeTCPEcho(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			io.Copy(c, c)
		}()
	}
}

// ServeUDPEcho echoes every datagram received on c until c is closed.
func ServeUDPEcho(c net.PacketConn) {
	buf := make([]byte, 65535)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		c.WriteTo(buf[:n], from)
	}
}

// DNSServer is an authoritative server for whatever records a test adds,
// with a log of every query it received.
type DNSServer struct {
	addr netip.AddrPort

	mu      sync.Mutex
	records map[string][]dns.RR // key: lower-case fqdn + "/" + type
	queries []string
}

func newDNSServer(addr netip.AddrPort) *DNSServer {
	return &DNSServer{addr: addr, records: map[string][]dns.RR{}}
}

// Addr is where the server listens (UDP and TCP).
func (d *DNSServer) Addr() netip.AddrPort { return d.addr }

// AddRR adds a record in zone-file syntax, e.g.
// "api.example.test. 60 IN A 198.18.1.10". It panics on a malformed record:
// records are test fixtures.
func (d *DNSServer) AddRR(s string) {
	rr, err := dns.NewRR(s)
	if err != nil || rr == nil {
		panic(fmt.Sprintf("world: bad record %q: %v", s, err))
	}
	key := rrKey(rr.Header().Name, rr.Header().Rrtype)
	d.mu.Lock()
	d.records[key] = append(d.records[key], rr)
	d.mu.Unlock()
}

// AddRRs adds records (signatures among them, e.g. from dns.RRSIG.Sign).
func (d *DNSServer) AddRRs(rrs ...dns.RR) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, rr := range rrs {
		key := rrKey(rr.Header().Name, rr.Header().Rrtype)
		d.records[key] = append(d.records[key], rr)
	}
}

// Queries lists "name. TYPE" for every query received, in order.
func (d *DNSServer) Queries() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.queries...)
}

// QueriedName reports whether any query for name (any type) was received.
func (d *DNSServer) QueriedName(name string) bool {
	name = strings.ToLower(dns.Fqdn(name))
	for _, q := range d.Queries() {
		if strings.HasPrefix(q, name+" ") {
			return true
		}
	}
	return false
}

func rrKey(name string, t uint16) string {
	return strings.ToLower(dns.Fqdn(name)) + "/" + dns.TypeToString[t]
}

func (d *DNSServer) ServeDNS(rw dns.ResponseWriter, req *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.Authoritative = true
	if len(req.Question) != 1 {
		resp.Rcode = dns.RcodeFormatError
		rw.WriteMsg(resp)
		return
	}
	q := req.Question[0]
	d.mu.Lock()
	d.queries = append(d.queries, strings.ToLower(q.Name)+" "+dns.TypeToString[q.Qtype])
	answer := d.resolveLocked(q.Name, q.Qtype, 0)
	known := d.knownLocked(q.Name)
	d.mu.Unlock()
	resp.Answer = answer
	if opt := req.IsEdns0(); opt != nil && opt.Do() {
		// A signed zone: the RRSIGs held for the answer's RRsets go with
		// them, as a signing server sends them to a DO query.
		resp.SetEdns0(opt.UDPSize(), true)
		d.mu.Lock()
		covered := map[string]bool{}
		for _, rr := range answer {
			h := rr.Header()
			k := rrKey(h.Name, h.Rrtype)
			if covered[k] {
				continue
			}
			covered[k] = true
			for _, sig := range d.records[rrKey(h.Name, dns.TypeRRSIG)] {
				if sig.(*dns.RRSIG).TypeCovered == h.Rrtype {
					resp.Answer = append(resp.Answer, sig)
				}
			}
		}
		d.mu.Unlock()
	}
	if len(answer) == 0 && !known {
		resp.Rcode = dns.RcodeNameError
	}
	if _, isTCP := rw.RemoteAddr().(*net.TCPAddr); !isTCP {
		size := 512
		if opt := req.IsEdns0(); opt != nil {
			size = int(opt.UDPSize())
		}
		resp.Truncate(size)
	}
	rw.WriteMsg(resp)
}

// resolveLocked answers name/type, following CNAMEs it holds.
func (d *DNSServer) resolveLocked(name string, t uint16, depth int) []dns.RR {
	if depth > 8 {
		return nil
	}
	if rrs := d.records[rrKey(name, t)]; len(rrs) > 0 {
		return copyRRs(rrs)
	}
	if t == dns.TypeCNAME {
		return nil
	}
	cn := d.records[rrKey(name, dns.TypeCNAME)]
	if len(cn) == 0 {
		return nil
	}
	out := copyRRs(cn)
	return append(out, d.resolveLocked(cn[0].(*dns.CNAME).Target, t, depth+1)...)
}

func (d *DNSServer) knownLocked(name string) bool {
	prefix := strings.ToLower(dns.Fqdn(name)) + "/"
	for k := range d.records {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

func copyRRs(rrs []dns.RR) []dns.RR {
	out := make([]dns.RR, len(rrs))
	for i, rr := range rrs {
		out[i] = dns.Copy(rr)
	}
	return out
}

func (d *DNSServer) start(w *World) error {
	pc, err := ListenUDP(w.NetPath, d.addr)
	if err != nil {
		return err
	}
	l, err := ListenTCP(w.NetPath, d.addr)
	if err != nil {
		pc.Close()
		return err
	}
	udp := &dns.Server{PacketConn: pc, Handler: d}
	tcp := &dns.Server{Listener: l, Handler: d}
	started := make(chan struct{}, 2)
	udp.NotifyStartedFunc = func() { started <- struct{}{} }
	tcp.NotifyStartedFunc = func() { started <- struct{}{} }
	go udp.ActivateAndServe()
	go tcp.ActivateAndServe()
	for i := 0; i < 2; i++ {
		select {
		case <-started:
		case <-time.After(5 * time.Second):
			return errors.New("world dns server did not start")
		}
	}
	w.onClose(func() error {
		udp.Shutdown()
		tcp.Shutdown()
		return nil
	})
	return nil
}
