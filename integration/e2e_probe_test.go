package integration

// Probes of the end-to-end tests. A probe runs from a session's network
// namespace with the world's probes (a socket made inside the namespace,
// the reply verified), which says precisely what was reached; or from
// inside the sandbox with busybox through `enforcerd session exec`, which
// is what a user's code does. A "blocked" probe must end in what the
// session's --on-deny answers, never in just any error: rejected (the
// default) is EHOSTUNREACH within the block timeout, the kernel's reading
// of the table's ICMP administratively prohibited; dropped is a timeout (a
// silent drop: --on-deny drop, and what is never answered, as a ping a raw
// socket waits for). Unroutable is declared (egress none: no route at all).

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/integration/world"
)

// e2eAnycastDNS is the DNS proxy's address for the default pool.
var e2eAnycastDNS = netip.MustParseAddrPort("10.20.255.254:53")

// e2eWant is what a probe must find.
type e2eWant int

const (
	e2eReach       e2eWant = iota // reached, reply verified
	e2eDropped                    // a timeout: silently dropped
	e2eUnreachable                // any error: no route, nothing to reach
	e2eRejected                   // EHOSTUNREACH at once: the table answered admin-prohibited
)

func (w e2eWant) String() string {
	return [...]string{"reach", "dropped", "unreachable", "rejected"}[w]
}

// e2eProbe is one attempt to reach something.
type e2eProbe struct {
	what string
	want e2eWant
	run  func(timeout time.Duration) error
}

// e2eTCP, e2eUDP, e2eHTTP and e2ePing reach a world echo server
// (TCP/UDP :7), its HTTP server (:80, body checked) or answer pings, from
// the namespace at ns.
func e2eTCP(ns string, dst string, w e2eWant) e2eProbe {
	ap := netip.MustParseAddrPort(dst)
	return e2eProbe{fmt.Sprintf("tcp %s from %s", dst, ns), w, func(to time.Duration) error {
		return world.TCPEcho(ns, ap, to)
	}}
}

func e2eUDP(ns string, dst string, w e2eWant) e2eProbe {
	ap := netip.MustParseAddrPort(dst)
	return e2eProbe{fmt.Sprintf("udp %s from %s", dst, ns), w, func(to time.Duration) error {
		return world.UDPEcho(ns, ap, to)
	}}
}

func e2eHTTP(ns string, ip string, w e2eWant) e2eProbe {
	return e2eProbe{fmt.Sprintf("http %s from %s", ip, ns), w, func(to time.Duration) error {
		body, err := world.HTTPGet(ns, "http://"+ip+"/", to)
		if err != nil {
			return err
		}
		if body != "hello from "+ip+"\n" {
			return fmt.Errorf("http %s: unexpected body %q", ip, body)
		}
		return nil
	}}
}

func e2ePing(ns string, ip string, w e2eWant) e2eProbe {
	a := netip.MustParseAddr(ip)
	return e2eProbe{fmt.Sprintf("ping %s from %s", ip, ns), w, func(to time.Duration) error {
		return world.Ping(ns, a, to)
	}}
}

// e2eDNS asks the resolver at server for name's A records from ns; it
// reaches when an answer (any rcode) comes back.
func e2eDNS(ns string, server netip.AddrPort, name string, w e2eWant) e2eProbe {
	return e2eProbe{fmt.Sprintf("dns %s via %s from %s", name, server, ns), w, func(to time.Duration) error {
		_, err := world.Lookup(ns, server, name, dns.TypeA, false, to)
		return err
	}}
}

// e2eRejectWait bounds a rejected probe's attempts. The kernel sends ICMP
// errors to one destination (a session's guest) at most 6 at once and 1
// per second after (net.ipv4.icmp_ratelimit): an attempt whose answer the
// limit swallowed times out, and the next one, a token later, is
// answered.
const e2eRejectWait = 5 * time.Second

// e2eExpect runs the probes concurrently and checks each. The rejected
// ones run one after another (the ICMP rate limit is per session), each
// attempted again while it times out, until e2eRejectWait: a timeout is
// never taken for a rejection, and a reach or any other error ends it.
func e2eExpect(t *testing.T, probes ...e2eProbe) {
	t.Helper()
	errs := make([]error, len(probes))
	var wg sync.WaitGroup
	var rejected []int
	for i, p := range probes {
		if p.want == e2eRejected {
			rejected = append(rejected, i)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			to := world.ReachTimeout
			if p.want == e2eDropped {
				to = world.BlockTimeout
			}
			errs[i] = p.run(to)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, i := range rejected {
			deadline := time.Now().Add(e2eRejectWait)
			for {
				errs[i] = probes[i].run(world.BlockTimeout)
				if !world.IsTimeout(errs[i]) || time.Now().After(deadline) {
					break
				}
			}
		}
	}()
	wg.Wait()
	for i, p := range probes {
		err := errs[i]
		switch {
		case p.want == e2eReach && err != nil:
			t.Errorf("%s: want reached, got %v", p.what, err)
		case p.want != e2eReach && err == nil:
			t.Errorf("%s: want %s, but it was reached", p.what, p.want)
		case p.want == e2eDropped && !world.IsTimeout(err):
			t.Errorf("%s: want a silent drop (timeout), got %v", p.what, err)
		case p.want == e2eRejected && !errors.Is(err, syscall.EHOSTUNREACH):
			t.Errorf("%s: want rejected (EHOSTUNREACH, no route to host), got %v", p.what, err)
		}
	}
}

// e2eLookup resolves name through the DNS proxy from ns and returns the
// rcode and the A addresses.
func e2eLookup(t *testing.T, ns, name string) (int, []string) {
	t.Helper()
	m, err := world.Lookup(ns, e2eAnycastDNS, name, dns.TypeA, false, world.ReachTimeout)
	if err != nil {
		t.Fatalf("look up %s through %s from %s: %v", name, e2eAnycastDNS, ns, err)
	}
	var addrs []string
	for _, a := range world.AddrsOf(m) {
		addrs = append(addrs, a.String())
	}
	return m.Rcode, addrs
}

// wget fetches http://ip/ from inside a session's sandbox with busybox
// (wrapped in timeout: busybox 1.35's own wget -T crashes) and reports
// whether the world's server answered.
func (e *e2eEnv) wget(name, ip string) bool {
	e.t.Helper()
	out, _, code := e.sh(name, "timeout 2 wget -q -O - http://"+ip+"/")
	return code == 0 && out == "hello from "+ip+"\n"
}

// nslookup resolves name inside a session's sandbox with busybox (through
// the resolver of its /etc/resolv.conf) and returns the output and exit
// status.
func (e *e2eEnv) nslookup(session, name string) (string, int) {
	e.t.Helper()
	out, errOut, code := e.sh(session, "timeout 3 nslookup -type=a "+name)
	return out + errOut, code
}

// e2eServeTCPEcho runs a TCP echo server on addr inside the namespace at
// ns until it is closed or the test ends (closed before the environment's
// cleanup, so no socket keeps a removed namespace alive).
func e2eServeTCPEcho(t *testing.T, ns string, addr netip.AddrPort) io.Closer {
	t.Helper()
	l, err := world.ListenTCP(ns, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go world.ServeTCPEcho(l)
	return l
}
