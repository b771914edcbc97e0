package dnsproxy

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/netpolicy"
)

func TestNewErrors(t *testing.T) {
	up := []netip.AddrPort{netip.MustParseAddrPort("198.18.0.53:53")}
	g := netpolicy.DefaultGuard()
	a := &fakeAttester{}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no upstream", Config{Guard: g, Attester: a}, "new dns proxy: no upstream resolvers: want at least one address:port"},
		{"port 0", Config{Upstreams: []netip.AddrPort{netip.MustParseAddrPort("1.1.1.1:0")}, Guard: g, Attester: a}, `new dns proxy: upstream "1.1.1.1:0": want address:port`},
		{"no guard", Config{Upstreams: up, Attester: a}, "new dns proxy: no guard"},
		{"no attester", Config{Upstreams: up, Guard: g}, "new dns proxy: no attester"},
		{"negative", Config{Upstreams: up, Guard: g, Attester: a, Timeout: -1}, "new dns proxy: negative timeout, min ttl, session share or max in flight"},
		{"negative answer cap", Config{Upstreams: up, Guard: g, Attester: a, MaxAnswerAddrs: -1}, "new dns proxy: max answer addresses -1: want at least 1 (0: the default, 32)"},
		{"one slot", Config{Upstreams: up, Guard: g, Attester: a, MaxInFlight: 1}, "new dns proxy: max in flight 1: want at least 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v, want %s", err, tt.want)
			}
		})
	}
	p, err := New(Config{Upstreams: up, Guard: g, Attester: a, MaxInFlight: 8, SessionShare: 100})
	if err != nil {
		t.Fatal(err)
	}
	if p.cfg.Timeout != 2*time.Second || p.cfg.SessionShare != 7 || p.cfg.MaxAnswerAddrs != 32 || p.cfg.Dial == nil || p.log == nil {
		t.Fatalf("defaults not applied: %+v", p.cfg)
	}
}

func TestRegisterErrors(t *testing.T) {
	tp := newTestProxy(t, []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9")}, nil)
	tests := []struct {
		name string
		sp   SessionPolicy
		want string
	}{
		{"no guest", SessionPolicy{Name: "s1", Mode: netpolicy.ModeAllowlist},
			`register session "s1": guest address "invalid IP": bad session policy: want an IPv4 address`},
		{"ipv6 guest", SessionPolicy{Name: "s1", Guest: netip.MustParseAddr("fd00::2"), Mode: netpolicy.ModeAllowlist},
			`register session "s1": guest address "fd00::2": bad session policy: want an IPv4 address`},
		{"bad mode", SessionPolicy{Name: "s1", Guest: guest1, Mode: "open"},
			`register session "s1": mode open: bad session policy: want none, allowlist or public`},
		{"bad entry", SessionPolicy{Name: "s1", Guest: guest1, Mode: netpolicy.ModeAllowlist, Allow: []netpolicy.Entry{{Kind: netpolicy.KindHost, Name: "-x.test"}}},
			`register session "s1": bad session policy: allow entry "-x.test": label "-x" starts or ends with '-'`},
		{"bad pinned name", SessionPolicy{Name: "s1", Guest: guest1, Mode: netpolicy.ModeAllowlist, Pinned: map[string][]netip.Addr{"": nil}},
			`register session "s1": pinned name "": bad session policy: empty name`},
		{"ipv6 pinned", SessionPolicy{Name: "s1", Guest: guest1, Mode: netpolicy.ModeAllowlist, Pinned: map[string][]netip.Addr{"a.test": {netip.MustParseAddr("2001:db8::1")}}},
			`register session "s1": pinned address "2001:db8::1" for a.test: bad session policy: want IPv4`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tp.Register(tt.sp)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v, want %s", err, tt.want)
			}
		})
	}
	if st := tp.Stats(); st.Sessions != 0 {
		t.Fatalf("%d sessions after failed registers", st.Sessions)
	}
}

func TestRegisterReplacesPolicy(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{
		"a.test.": {"a.test. 60 IN A 198.18.1.10"},
		"b.test.": {"b.test. 60 IN A 198.18.1.11"},
	}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	if r := tp.ask(t, guest1, query("b.test.", dns.TypeA), false); r.Rcode != dns.RcodeNameError {
		t.Fatalf("b before: %v", r)
	}
	tp.register(t, guest1, netpolicy.ModeAllowlist, "b.test")
	if r := tp.ask(t, guest1, query("b.test.", dns.TypeA), false); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("b after: %v", r)
	}
	if r := tp.ask(t, guest1, query("a.test.", dns.TypeA), false); r.Rcode != dns.RcodeNameError {
		t.Fatalf("a after: %v", r)
	}
	if st := tp.Stats(); st.Sessions != 1 {
		t.Fatalf("sessions %d", st.Sessions)
	}
}

// TestConcurrentRegisterAndAnswer runs under -race: sessions come and go
// while queries are answered.
func TestConcurrentRegisterAndAnswer(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 200 {
			g := netip.AddrFrom4([4]byte{10, 20, byte(i / 64), byte(i%64*4 + 2)})
			if g == guest1 {
				continue
			}
			tp.register(t, g, netpolicy.ModePublic)
			tp.Unregister(g)
		}
	})
	for range 4 {
		wg.Go(func() {
			for range 25 {
				if r := tp.ask(t, guest1, query("a.test.", dns.TypeA), false); r.Rcode != dns.RcodeSuccess {
					t.Errorf("reply %v", r)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestEventJSON(t *testing.T) {
	ev := Event{
		Time: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC), Session: "s1", Client: guest1, Name: "a.test.", Type: "A",
		Verdict: VerdictAllowed, Rcode: "NOERROR", Addrs: mustAddrs("198.18.1.10"), Dropped: mustAddrs("10.99.0.10"),
		Upstream: "198.18.0.53:53", Latency: time.Millisecond, TTL: 2 * time.Second,
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"time":"2025-01-02T03:04:05Z","session":"s1","client":"10.20.0.2","name":"a.test.","type":"A","verdict":"allowed",` +
		`"rcode":"NOERROR","addrs":["198.18.1.10"],"dropped":["10.99.0.10"],"upstream":"198.18.0.53:53","latency_ns":1000000,"attest_ttl_ns":2000000000}`
	if string(b) != want {
		t.Fatalf("json\n%s\nwant\n%s", b, want)
	}
}

func TestStatsCountEveryVerdict(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	for i := range 3 {
		tp.ask(t, guest1, query("a.test.", dns.TypeA), false)
		tp.ask(t, guest1, query("x"+strconv.Itoa(i)+".test.", dns.TypeA), false)
	}
	tp.ask(t, guest2, query("a.test.", dns.TypeA), false)
	st := tp.Stats()
	want := map[string]uint64{VerdictAllowed: 3, VerdictDenied: 3, VerdictRefused: 1, VerdictServfail: 0, VerdictPinned: 0, VerdictFormerr: 0, VerdictNotImp: 0}
	for k, v := range want {
		if st.Verdicts[k] != v {
			t.Errorf("verdict %s: %d, want %d", k, st.Verdicts[k], v)
		}
	}
	if st.Attest.Count != 3 || st.Attest.Counts[len(st.Attest.Counts)-1] != 3 || st.Attest.Max <= 0 {
		t.Errorf("attest histogram %+v", st.Attest)
	}
	if len(tp.events.All()) != 7 {
		t.Errorf("%d events, want 7", len(tp.events.All()))
	}
}

func TestDebugLogPerDecision(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tp := newTestProxy(t, []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9")}, func(c *Config) { c.Logger = logger })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	tp.ask(t, guest1, query("denied.test.", dns.TypeA), false)
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(buf.String(), `msg="dnsproxy: decision" session=s-10.20.0.2 client=10.20.0.2 name=denied.test. type=A verdict=denied rcode=NXDOMAIN`) {
		t.Fatalf("log:\n%s", buf.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
