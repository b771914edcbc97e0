package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// heldUpstream answers a.test with 198.18.1.10 once the test releases it.
func heldUpstream(t *testing.T) (*upstream, chan struct{}) {
	release := make(chan struct{})
	zone := zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}})
	up := startUpstream(t, func(w dns.ResponseWriter, req *dns.Msg, tcp bool) *dns.Msg {
		select {
		case <-release:
		case <-time.After(10 * time.Second):
		}
		return zone(w, req, tcp)
	})
	return up, release
}

// waitQueries waits until the upstream has seen n queries.
func waitQueries(t *testing.T, up *upstream, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); len(up.Queries()) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("upstream saw %v, want %d queries", up.Queries(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func goAsk(t *testing.T, tp *testProxy, src netip.Addr) chan *dns.Msg {
	ch := make(chan *dns.Msg, 1)
	go func() { ch <- tp.ask(t, src, query("a.test.", dns.TypeA), false) }()
	return ch
}

func recv(t *testing.T, ch chan *dns.Msg, within time.Duration) *dns.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(within):
		t.Fatalf("no reply within %v", within)
		return nil
	}
}

// TestUnregisterCancelsUpstreamWait: a query waiting for its upstream when
// its session is unregistered gets SERVFAIL at once, is never attested,
// and its event names the cause; Unregister does not wait for the
// upstream. Positive control: another session's query waiting at the same
// time is answered and attested.
func TestUnregisterCancelsUpstreamWait(t *testing.T) {
	up, release := heldUpstream(t)
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.Timeout = 5 * time.Second })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	tp.register(t, guest2, netpolicy.ModeAllowlist, "a.test")
	gone, stays := goAsk(t, tp, guest1), goAsk(t, tp, guest2)
	waitQueries(t, up, 2)

	start := time.Now()
	tp.Unregister(guest1)
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("Unregister took %v: it waited for the upstream", d)
	}
	resp := recv(t, gone, time.Second)
	if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
		t.Fatalf("reply to the unregistered session: %v", resp)
	}
	close(release)
	if resp := recv(t, stays, 5*time.Second); !slices.Equal(addrsOf(resp.Answer), mustAddrs("198.18.1.10")) {
		t.Fatalf("control reply: %v", resp)
	}
	calls := tp.att.Calls()
	if len(calls) != 1 || calls[0].guest != guest2 {
		t.Fatalf("attest calls %+v, want one, for %s", calls, guest2)
	}
	var ev Event
	for _, e := range tp.events.All() {
		if e.Client == guest1 {
			ev = e
		}
	}
	if ev.Verdict != VerdictServfail || !strings.Contains(ev.Err, ErrSessionGone.Error()) || !strings.Contains(ev.Err, guest1.String()) {
		t.Fatalf("event %+v", ev)
	}
	if st := tp.Stats(); st.SessionGone != 1 {
		t.Fatalf("session gone %d, want 1", st.SessionGone)
	}
}

// TestRegisterReplacingEndsTheOldRegistration: a Register for the same
// guest ends the old registration as Unregister does; the new one answers.
func TestRegisterReplacingEndsTheOldRegistration(t *testing.T) {
	up, release := heldUpstream(t)
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.Timeout = 5 * time.Second })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	old := goAsk(t, tp, guest1)
	waitQueries(t, up, 1)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test", "b.test")
	if resp := recv(t, old, time.Second); resp.Rcode != dns.RcodeServerFailure {
		t.Fatalf("reply under the replaced registration: %v", resp)
	}
	close(release)
	if resp := recv(t, goAsk(t, tp, guest1), 5*time.Second); !slices.Equal(addrsOf(resp.Answer), mustAddrs("198.18.1.10")) {
		t.Fatalf("reply under the new registration: %v", resp)
	}
	if n := len(tp.att.Calls()); n != 1 {
		t.Fatalf("%d attest calls, want 1 (the new registration's)", n)
	}
}

// gateAttester blocks every Attest until released, after telling the test
// it was entered.
type gateAttester struct {
	entered chan struct{}
	release chan struct{}
	done    atomic.Int32
}

func (g *gateAttester) Attest(netip.Addr, []netip.Addr, time.Duration, []netpolicy.PortSpec) (time.Duration, error) {
	g.entered <- struct{}{}
	<-g.release
	g.done.Add(1)
	return time.Minute, nil
}

// TestUnregisterWaitsForAttestInProgress: an attest already running when
// the session is unregistered finishes before Unregister returns (the
// caller then removes the session's firewall elements, that one included).
func TestUnregisterWaitsForAttestInProgress(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	g := &gateAttester{entered: make(chan struct{}, 1), release: make(chan struct{})}
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.Attester = g })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	reply := goAsk(t, tp, guest1)
	<-g.entered
	unregistered := make(chan struct{})
	go func() {
		tp.Unregister(guest1)
		close(unregistered)
	}()
	select {
	case <-unregistered:
		t.Fatal("Unregister returned while an attest of the session was in progress")
	case <-time.After(50 * time.Millisecond):
	}
	close(g.release)
	<-unregistered
	if g.done.Load() != 1 {
		t.Fatal("Unregister returned before the attest did")
	}
	recv(t, reply, time.Second)
}

// raceAttester records any Attest that starts for a guest after its
// Unregister returned.
type raceAttester struct {
	mu       sync.Mutex
	gone     map[netip.Addr]bool
	late     []netip.Addr
	attested atomic.Int64
}

func (r *raceAttester) Attest(guest netip.Addr, _ []netip.Addr, ttl time.Duration, _ []netpolicy.PortSpec) (time.Duration, error) {
	r.mu.Lock()
	if r.gone[guest] {
		r.late = append(r.late, guest)
	}
	r.mu.Unlock()
	r.attested.Add(1)
	time.Sleep(50 * time.Microsecond) // an attest takes a kernel round trip
	return ttl, nil
}

// TestNoAttestAfterUnregister races queries against Unregister: once
// Unregister(guest) has returned, no Attest for that guest ever starts.
func TestNoAttestAfterUnregister(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	ra := &raceAttester{gone: map[netip.Addr]bool{}}
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.Attester = ra })
	var wg sync.WaitGroup
	for i := range 40 {
		guest := netip.AddrFrom4([4]byte{10, 20, 1, byte(4*i + 2)})
		tp.register(t, guest, netpolicy.ModeAllowlist, "a.test")
		for range 8 {
			wg.Go(func() {
				raw, _ := query("a.test.", dns.TypeA).Pack()
				tp.handle(context.Background(), guest, raw, false)
			})
		}
		wg.Go(func() {
			// Some before any answer, some after all. The second half waits
			// for a first attest (bounded) so that a loaded machine, whose
			// upstream answers slower than 40 ms, still races some.
			if i >= 20 {
				for deadline := time.Now().Add(5 * time.Second); ra.attested.Load() == 0 && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
			}
			time.Sleep(time.Duration(i) * time.Millisecond)
			tp.Unregister(guest)
			ra.mu.Lock()
			ra.gone[guest] = true
			ra.mu.Unlock()
		})
	}
	wg.Wait()
	if len(ra.late) > 0 {
		t.Fatalf("attests started after Unregister returned, for %v", ra.late)
	}
	if ra.attested.Load() == 0 {
		t.Fatal("nothing attested at all: the race proves nothing")
	}
	t.Logf("%d attests, %d answers after unregistration", ra.attested.Load(), tp.Stats().SessionGone)
}

// TestAnswerCap: an answer with more addresses than MaxAnswerAddrs carries
// and attests only the first ones, in answer order; the A records and
// hints of the others are removed; the event and the stats name the cap.
func TestAnswerCap(t *testing.T) {
	var recs []string
	for i := 1; i <= 6; i++ {
		recs = append(recs, fmt.Sprintf("many.test. 60 IN A 198.18.3.%d", i))
	}
	recs = append(recs, `many.test. 60 IN HTTPS 1 . alpn="h2" ipv4hint="198.18.3.1,198.18.3.9"`)
	up := startUpstream(t, zoneHandler(map[string][]string{"many.test.": recs}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.MaxAnswerAddrs = 4 })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "many.test")
	resp := tp.ask(t, guest1, query("many.test.", dns.TypeA), true)
	want := mustAddrs("198.18.3.1", "198.18.3.2", "198.18.3.3", "198.18.3.4")
	if got := addrsOf(resp.Answer); !slices.Equal(got, want) {
		t.Fatalf("answer %v, want %v", got, want)
	}
	var https *dns.HTTPS
	for _, rr := range resp.Answer {
		if h, ok := rr.(*dns.HTTPS); ok {
			https = h
		}
	}
	if https == nil || !slices.EqualFunc(hints(t, https.Value), []net.IP{net.ParseIP("198.18.3.1")}, func(a, b net.IP) bool { return a.Equal(b) }) {
		t.Fatalf("https record %v: want the kept hint only", https)
	}
	if calls := tp.att.Calls(); len(calls) != 1 || !slices.Equal(calls[0].ips, want) {
		t.Fatalf("attest calls %+v", calls)
	}
	ev := tp.events.Last(t)
	if ev.Verdict != VerdictAllowed || ev.Capped != 3 || !slices.Equal(ev.Addrs, want) {
		t.Fatalf("event %+v", ev)
	}
	if st := tp.Stats(); st.AnswerCap != 1 {
		t.Fatalf("answer cap count %d", st.AnswerCap)
	}
	// Positive control: an answer within the cap is left whole.
	tp.register(t, guest2, netpolicy.ModeAllowlist, "many.test")
	tp.cfg.MaxAnswerAddrs = 100 // not shared with a running query: the test owns tp
	if got := addrsOf(tp.ask(t, guest2, query("many.test.", dns.TypeA), true).Answer); len(got) != 6 {
		t.Fatalf("answer within the cap: %v", got)
	}
}

// TestAttestCapIsServfail: the firewall's per-session cap fails the answer
// (never released unattested), counted apart and named in the event.
func TestAttestCapIsServfail(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	if resp := tp.ask(t, guest1, query("a.test.", dns.TypeA), false); len(resp.Answer) != 1 {
		t.Fatalf("control: %v", resp)
	}
	tp.att.err = fmt.Errorf("attest 1 addresses for %s: %w", guest1, netpolicy.ErrAttestCap)
	resp := tp.ask(t, guest1, query("a.test.", dns.TypeA), false)
	if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
		t.Fatalf("reply at the cap: %v", resp)
	}
	ev := tp.events.Last(t)
	if ev.Verdict != VerdictServfail || !strings.Contains(ev.Err, netpolicy.ErrAttestCap.Error()) {
		t.Fatalf("event %+v", ev)
	}
	tp.att.err = errInjected
	tp.ask(t, guest1, query("a.test.", dns.TypeA), false)
	if st := tp.Stats(); st.AttestCap != 1 || st.AttestErrors != 2 {
		t.Fatalf("attest cap %d, attest errors %d; want 1, 2", st.AttestCap, st.AttestErrors)
	}
}

// TestServeTCPClosesUnknownSources: a TCP connection from an address that
// is no session is closed as soon as it is accepted (it takes no slot);
// the session's own connection is served.
func TestServeTCPClosesUnknownSources(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, netip.MustParseAddr("127.0.0.1"), netpolicy.ModeAllowlist, "a.test")
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go tp.Serve(nil, ln)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	stranger, err := d.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	stranger.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := stranger.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		t.Fatalf("connection from an unknown source: read %v, want closed", err)
	}
	c := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	r, _, err := c.Exchange(query("a.test.", dns.TypeA), ln.Addr().String())
	if err != nil || len(r.Answer) != 1 {
		t.Fatalf("session over tcp: %v, %v", r, err)
	}
	if st := tp.Stats(); st.TCPRefused != 1 {
		t.Fatalf("tcp refused %d, want 1", st.TCPRefused)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
