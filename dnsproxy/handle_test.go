package dnsproxy

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/netpolicy"
)

func TestAllowedAnswerIsFilteredAndAttested(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{
		"api.example.test.": {
			"api.example.test. 300 IN A 198.18.1.10",
			"api.example.test. 120 IN A 198.18.1.11",
			"api.example.test. 60 IN A 10.99.0.10",      // private
			"api.example.test. 60 IN A 169.254.169.254", // metadata
			"api.example.test. 60 IN A 127.0.0.1",       // loopback
			"api.example.test. 60 IN A 10.20.0.6",       // another session
			"api.example.test. 60 IN A 100.64.0.1",      // CGNAT
			"api.example.test. 60 IN A 198.18.1.10",     // duplicate
			"other.example.test. 60 IN A 198.18.2.10",   // not in the chain
		},
	}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.MinTTL = 30 * time.Second })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "api.example.test")

	resp := tp.ask(t, guest1, query("API.example.test.", dns.TypeA), false)
	if resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("rcode %s", dns.RcodeToString[resp.Rcode])
	}
	want := mustAddrs("198.18.1.10", "198.18.1.11", "198.18.1.10")
	if got := addrsOf(resp.Answer); !slices.Equal(got, want) {
		t.Fatalf("answer addresses %v, want %v", got, want)
	}
	calls := tp.att.Calls()
	if len(calls) != 1 {
		t.Fatalf("%d attest calls, want 1", len(calls))
	}
	c := calls[0]
	if c.guest != guest1 || !slices.Equal(c.ips, mustAddrs("198.18.1.10", "198.18.1.11")) || c.ttl != 60*time.Second || c.ports != nil {
		t.Fatalf("attest call %+v", c)
	}
	for _, rr := range resp.Answer {
		if rr.Header().Ttl > 59 {
			t.Errorf("ttl %d above the attestation timeout minus margin (59): %s", rr.Header().Ttl, rr)
		}
	}
	ev := tp.events.Last(t)
	if ev.Verdict != VerdictAllowed || ev.Session != "s-10.20.0.2" || ev.Client != guest1 || ev.Type != "A" ||
		ev.Upstream != up.addr.String() || ev.TTL != 60*time.Second || ev.Rcode != "NOERROR" {
		t.Fatalf("event %+v", ev)
	}
	if !slices.Equal(ev.Dropped, mustAddrs("10.99.0.10", "169.254.169.254", "127.0.0.1", "10.20.0.6", "100.64.0.1")) {
		t.Fatalf("dropped %v", ev.Dropped)
	}
	if st := tp.Stats(); st.Verdicts[VerdictAllowed] != 1 || st.Attest.Count != 1 || st.Upstream.Count != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestTTLClamping(t *testing.T) {
	tests := []struct {
		name       string
		recordTTLs []int
		minTTL     time.Duration
		floor      time.Duration // the attester's clamp
		wantAttest time.Duration
		wantMaxTTL uint32
	}{
		{"min of records", []int{300, 100}, 0, 0, 100 * time.Second, 99},
		{"raised to MinTTL", []int{5}, 30 * time.Second, 0, 30 * time.Second, 5},
		{"attester floor lowers no ttl", []int{300}, 0, 2 * time.Second, 300 * time.Second, 299},
		{"zero ttl with a floor", []int{0}, 0, 2 * time.Second, 0, 0},
		{"ttl above effective timeout", []int{3600}, 0, 0, time.Hour, 3599},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rrs []string
			for i, ttl := range tt.recordTTLs {
				rrs = append(rrs, "a.test. "+strconv.Itoa(ttl)+" IN A 198.18.1."+strconv.Itoa(10+i))
			}
			up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": rrs}))
			tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.MinTTL = tt.minTTL })
			tp.att.floor = tt.floor
			tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
			resp := tp.ask(t, guest1, query("a.test.", dns.TypeA), false)
			calls := tp.att.Calls()
			if len(calls) != 1 || calls[0].ttl != tt.wantAttest {
				t.Fatalf("attest calls %+v, want ttl %v", calls, tt.wantAttest)
			}
			eff := max(tt.wantAttest, tt.floor)
			for _, rr := range resp.Answer {
				if got := rr.Header().Ttl; got > tt.wantMaxTTL || time.Duration(got)*time.Second >= eff && eff > 0 {
					t.Errorf("ttl %d, want <= %d and below %v", got, tt.wantMaxTTL, eff)
				}
			}
		})
	}
}

func TestCNAMEChain(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{
		"www.example.test.": {
			"www.example.test. 300 IN CNAME edge.cdn.test.",
			"edge.cdn.test. 300 IN CNAME host.cdn2.test.",
			"host.cdn2.test. 40 IN A 198.18.2.10",
			"host.cdn2.test. 40 IN A 10.99.0.10",
			"unrelated.test. 40 IN A 198.18.1.11",
			"unrelated.test. 40 IN CNAME x.test.",
		},
	}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "www.example.test")
	resp := tp.ask(t, guest1, query("www.example.test.", dns.TypeA), false)
	if got := addrsOf(resp.Answer); !slices.Equal(got, mustAddrs("198.18.2.10")) {
		t.Fatalf("addresses %v", got)
	}
	cnames := 0
	for _, rr := range resp.Answer {
		if rr.Header().Rrtype == dns.TypeCNAME {
			cnames++
			if rr.Header().Ttl > 39 {
				t.Errorf("cname ttl %d not lowered", rr.Header().Ttl)
			}
		}
	}
	if cnames != 3 {
		t.Fatalf("%d CNAMEs passed, want 3 (other types pass unchanged): %v", cnames, resp.Answer)
	}
	if calls := tp.att.Calls(); len(calls) != 1 || !slices.Equal(calls[0].ips, mustAddrs("198.18.2.10")) {
		t.Fatalf("attest calls %+v", calls)
	}
}

func TestAAAAEmptied(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{
		"v6.test.": {"v6.test. 60 IN CNAME real.v6.test.", "real.v6.test. 60 IN AAAA 2001:db8::1"},
	}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "v6.test")
	resp := tp.ask(t, guest1, query("v6.test.", dns.TypeAAAA), false)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].Header().Rrtype != dns.TypeCNAME {
		t.Fatalf("answer %v", resp)
	}
	if calls := tp.att.Calls(); len(calls) != 0 {
		t.Fatalf("attest calls %+v for an answer with no address", calls)
	}
}

func TestSVCBHints(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{
		"svc.test.": {
			`svc.test. 100 IN HTTPS 1 . alpn="h2" ipv4hint="198.18.1.10,10.99.0.10" ipv6hint="2001:db8::1"`,
			`svc.test. 80 IN SVCB 1 . port="853" ipv4hint="169.254.169.254" ipv6hint="2001:db8::2"`,
			`other.test. 80 IN HTTPS 1 . ipv4hint="198.18.2.10"`,
			`svc.test. 80 IN TXT "hello"`,
		},
	}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "svc.test")
	resp := tp.ask(t, guest1, query("svc.test.", dns.TypeHTTPS), false)
	want := []string{
		"svc.test.\t99\tIN\tHTTPS\t1 . alpn=\"h2\" ipv4hint=\"198.18.1.10\"",
		"svc.test.\t80\tIN\tSVCB\t1 . port=\"853\"",
		"other.test.\t80\tIN\tHTTPS\t1 .",
		"svc.test.\t80\tIN\tTXT\t\"hello\"",
	}
	var got []string
	for _, rr := range resp.Answer {
		got = append(got, rr.String())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("answer\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	calls := tp.att.Calls()
	if len(calls) != 1 || !slices.Equal(calls[0].ips, mustAddrs("198.18.1.10")) || calls[0].ttl != 100*time.Second {
		t.Fatalf("attest calls %+v", calls)
	}
	if ev := tp.events.Last(t); !slices.Equal(ev.Dropped, mustAddrs("10.99.0.10", "169.254.169.254")) {
		t.Fatalf("dropped %v", ev.Dropped)
	}
}

func TestAuthorityAndAdditionalLoseAddresses(t *testing.T) {
	up := startUpstream(t, func(_ dns.ResponseWriter, req *dns.Msg, _ bool) *dns.Msg {
		resp := new(dns.Msg)
		resp.SetReply(req)
		resp.Answer = []dns.RR{mustRR("mx.test. 60 IN MX 10 mail.test.")}
		resp.Ns = []dns.RR{mustRR("test. 60 IN NS ns.test."), mustRR("ns.test. 60 IN A 198.18.1.10")}
		resp.Extra = []dns.RR{mustRR("mail.test. 60 IN A 198.18.1.11"), mustRR("mail.test. 60 IN AAAA 2001:db8::1"),
			mustRR(`mail.test. 60 IN HTTPS 1 . ipv4hint="198.18.1.11"`)}
		return resp
	})
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "mx.test")
	resp := tp.ask(t, guest1, query("mx.test.", dns.TypeMX), false)
	if len(resp.Answer) != 1 || len(resp.Ns) != 1 || len(resp.Extra) != 1 {
		t.Fatalf("reply %v", resp)
	}
	if s := resp.Extra[0].String(); s != "mail.test.\t60\tIN\tHTTPS\t1 ." {
		t.Fatalf("extra %s", s)
	}
	if calls := tp.att.Calls(); len(calls) != 0 {
		t.Fatalf("attest calls %+v", calls)
	}
}

func mustRR(s string) dns.RR {
	rr, err := dns.NewRR(s)
	if err != nil {
		panic(err)
	}
	return rr
}

func TestAttestFailureIsServfail(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.att.err = errInjected
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	resp := tp.ask(t, guest1, query("a.test.", dns.TypeA), false)
	if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 || len(resp.Extra) != 0 || len(resp.Ns) != 0 {
		t.Fatalf("reply %v", resp)
	}
	ev := tp.events.Last(t)
	want := "attest failed: 1 addresses for 10.20.0.2: injected failure"
	if ev.Verdict != VerdictServfail || ev.Err != want || ev.Addrs != nil {
		t.Fatalf("event %+v, want err %q", ev, want)
	}
	if st := tp.Stats(); st.AttestErrors != 1 || st.Verdicts[VerdictServfail] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestEveryAnswerReattests(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	for range 3 {
		tp.ask(t, guest1, query("a.test.", dns.TypeA), false)
	}
	if n := len(tp.att.Calls()); n != 3 {
		t.Fatalf("%d attest calls for 3 answers", n)
	}
	if n := len(up.Queries()); n != 3 {
		t.Fatalf("%d upstream queries for 3 answers (no cache)", n)
	}
}

func TestPortsFromMatchedEntries(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{
		"api.p.test.": {"api.p.test. 60 IN A 198.18.1.10"},
		"www.p.test.": {"www.p.test. 60 IN A 198.18.1.11"},
	}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "api.p.test:443", "*.p.test:8080/tcp", "www.p.test")
	tp.ask(t, guest1, query("api.p.test.", dns.TypeA), false)
	tp.ask(t, guest1, query("www.p.test.", dns.TypeA), false)
	calls := tp.att.Calls()
	want := []netpolicy.PortSpec{{Port: 443}, {Port: 8080, Proto: netpolicy.ProtoTCP}} // sorted
	if len(calls) != 2 || !slices.Equal(calls[0].ports, want) || calls[1].ports != nil {
		t.Fatalf("attest calls %+v", calls)
	}
}

func TestDeniedNeverReachesUpstream(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"secret.evil.test.": {"secret.evil.test. 60 IN A 198.18.1.10"}}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "example.test", "*.ok.test")
	tp.register(t, guest2, netpolicy.ModeNone)
	for _, c := range []struct {
		src  netip.Addr
		name string
	}{
		{guest1, "secret.evil.test."},
		{guest1, "evilexample.test."},
		{guest1, "b.a.ok.test."},
		{guest1, "ok.test."},
		{guest2, "example.test."},
	} {
		for _, qt := range []uint16{dns.TypeA, dns.TypeTXT, dns.TypeAAAA} {
			resp := tp.ask(t, c.src, query(c.name, qt), false)
			if resp.Rcode != dns.RcodeNameError || len(resp.Answer) != 0 {
				t.Fatalf("%s %s from %s: %v", c.name, dns.TypeToString[qt], c.src, resp)
			}
		}
	}
	if q := up.Queries(); len(q) != 0 {
		t.Fatalf("upstream saw %v", q)
	}
	if ev := tp.events.Last(t); ev.Verdict != VerdictDenied || ev.Session != "s-10.20.0.6" || ev.Name != "example.test." {
		t.Fatalf("event %+v", ev)
	}
	if n := len(tp.att.Calls()); n != 0 {
		t.Fatalf("%d attest calls", n)
	}
}

func TestPublicModeForwardsEveryName(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{
		"any.test.":     {"any.test. 60 IN A 198.18.1.10"},
		"private.test.": {"private.test. 60 IN A 10.99.0.10"},
	}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModePublic)
	if resp := tp.ask(t, guest1, query("any.test.", dns.TypeA), false); len(addrsOf(resp.Answer)) != 1 {
		t.Fatalf("public: %v", resp)
	}
	resp := tp.ask(t, guest1, query("private.test.", dns.TypeA), false)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
		t.Fatalf("private address in public mode: %v", resp)
	}
	if resp := tp.ask(t, guest1, query("missing.test.", dns.TypeA), false); resp.Rcode != dns.RcodeNameError {
		t.Fatalf("upstream NXDOMAIN not passed: %v", resp)
	}
	// The public set accepts a public session's traffic: nothing to attest.
	if calls := tp.att.Calls(); len(calls) != 0 {
		t.Fatalf("attest calls %+v, want none in public mode", calls)
	}
	if ev := tp.events.All()[0]; ev.Verdict != VerdictAllowed || !slices.Equal(ev.Addrs, mustAddrs("198.18.1.10")) || ev.TTL != 0 {
		t.Fatalf("event %+v", ev)
	}
}

func TestPinned(t *testing.T) {
	up := startUpstream(t, zoneHandler(nil))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.MinTTL = 10 * time.Second })
	err := tp.Register(SessionPolicy{Name: "pin", Guest: guest1, Mode: netpolicy.ModeAllowlist,
		Pinned: map[string][]netip.Addr{"Target.Example.": mustAddrs("198.18.1.10", "10.99.0.10", "198.18.1.11")}})
	if err != nil {
		t.Fatal(err)
	}
	resp := tp.ask(t, guest1, query("target.EXAMPLE.", dns.TypeA), false)
	if got := addrsOf(resp.Answer); !slices.Equal(got, mustAddrs("198.18.1.10", "198.18.1.11")) {
		t.Fatalf("pinned answer %v", resp)
	}
	if ttl := resp.Answer[0].Header().Ttl; ttl != 9 {
		t.Fatalf("pinned ttl %d, want 9", ttl)
	}
	if resp.Answer[0].Header().Name != "target.EXAMPLE." {
		t.Fatalf("owner %q", resp.Answer[0].Header().Name)
	}
	aaaa := tp.ask(t, guest1, query("target.example.", dns.TypeAAAA), false)
	if aaaa.Rcode != dns.RcodeSuccess || len(aaaa.Answer) != 0 {
		t.Fatalf("pinned AAAA %v", aaaa)
	}
	if q := up.Queries(); len(q) != 0 {
		t.Fatalf("upstream saw %v", q)
	}
	// Pinned addresses are in the static sets with their entry's port
	// constraint: attesting them (port-less) would open every port.
	if calls := tp.att.Calls(); len(calls) != 0 {
		t.Fatalf("attest calls %+v, want none for a pinned name", calls)
	}
	if ev := tp.events.All()[0]; ev.Verdict != VerdictPinned || !slices.Equal(ev.Dropped, mustAddrs("10.99.0.10")) ||
		!slices.Equal(ev.Addrs, mustAddrs("198.18.1.10", "198.18.1.11")) {
		t.Fatalf("event %+v", ev)
	}
}

func TestProtocolErrors(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")

	two := query("a.test.", dns.TypeA)
	two.Question = append(two.Question, dns.Question{Name: "b.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	none := query("a.test.", dns.TypeA)
	none.Question = nil
	notify := query("a.test.", dns.TypeSOA)
	notify.Opcode = dns.OpcodeNotify
	badVers := query("a.test.", dns.TypeA)
	badVers.SetEdns0(1232, false)
	badVers.IsEdns0().SetVersion(1)
	chaos := query("version.bind.", dns.TypeTXT)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	axfr := query("a.test.", dns.TypeAXFR)

	tests := []struct {
		name    string
		src     netip.Addr
		msg     *dns.Msg
		rcode   int
		verdict string
	}{
		{"unknown source", netip.MustParseAddr("10.20.0.10"), query("a.test.", dns.TypeA), dns.RcodeRefused, VerdictRefused},
		{"two questions", guest1, two, dns.RcodeFormatError, VerdictFormerr},
		{"no question", guest1, none, dns.RcodeFormatError, VerdictFormerr},
		{"notify", guest1, notify, dns.RcodeNotImplemented, VerdictNotImp},
		{"edns version 1", guest1, badVers, dns.RcodeBadVers, VerdictFormerr},
		{"chaos class", guest1, chaos, dns.RcodeRefused, VerdictRefused},
		{"zone transfer", guest1, axfr, dns.RcodeRefused, VerdictRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := tp.ask(t, tt.src, tt.msg, false)
			if resp == nil || resp.Rcode != tt.rcode || len(resp.Answer) != 0 {
				t.Fatalf("reply %v, want rcode %s", resp, dns.RcodeToString[tt.rcode])
			}
			if ev := tp.events.Last(t); ev.Verdict != tt.verdict {
				t.Fatalf("verdict %s, want %s", ev.Verdict, tt.verdict)
			}
		})
	}
	if q := up.Queries(); len(q) != 0 {
		t.Fatalf("upstream saw %v", q)
	}
}

func TestMalformedDropped(t *testing.T) {
	tp := newTestProxy(t, []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:9")}, nil)
	tp.register(t, guest1, netpolicy.ModePublic)
	resp := query("a.test.", dns.TypeA)
	resp.Response = true
	raw, _ := resp.Pack()
	good, _ := query("a.test.", dns.TypeA).Pack()
	for i, pkt := range [][]byte{nil, {0}, good[:11], good[:len(good)-1], raw, append(good[:12:12], 0xc0, 0x0c, 0, 1, 0, 1)} {
		if out := tp.handle(t.Context(), guest1, pkt, false); out != nil {
			t.Errorf("packet %d: answered %x", i, out)
		}
	}
	if st := tp.Stats(); st.Malformed != 6 || len(tp.events.All()) != 0 {
		t.Fatalf("malformed %d, events %d", st.Malformed, len(tp.events.All()))
	}
}

// bigZone returns 60 A records for big.test.: about 1 KiB on the wire.
func bigZone() map[string][]string {
	var rrs []string
	for i := range 60 {
		rrs = append(rrs, "big.test. 60 IN A 198.18.3."+strconv.Itoa(i+1))
	}
	return map[string][]string{"big.test.": rrs}
}

func TestEDNSSizeHonoured(t *testing.T) {
	up := startUpstream(t, zoneHandler(bigZone()))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, func(c *Config) { c.MaxAnswerAddrs = 100 })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "big.test")

	plain := tp.ask(t, guest1, query("big.test.", dns.TypeA), false)
	if !plain.Truncated || len(plain.Answer) == 60 {
		t.Fatalf("512-byte client: truncated=%v with %d records", plain.Truncated, len(plain.Answer))
	}
	e := query("big.test.", dns.TypeA)
	e.SetEdns0(4096, false)
	big := tp.ask(t, guest1, e, false)
	if big.Truncated || len(big.Answer) != 60 || big.IsEdns0() == nil {
		t.Fatalf("4096-byte client: truncated=%v with %d records", big.Truncated, len(big.Answer))
	}
	tcp := tp.ask(t, guest1, query("big.test.", dns.TypeA), true)
	if tcp.Truncated || len(tcp.Answer) != 60 {
		t.Fatalf("tcp: truncated=%v with %d records", tcp.Truncated, len(tcp.Answer))
	}
	for _, c := range tp.att.Calls() {
		if len(c.ips) != 60 {
			t.Fatalf("attested %d addresses, want all 60 (no silent cap)", len(c.ips))
		}
	}
}

func TestTruncatedUpstreamRetriedOverTCP(t *testing.T) {
	zone := zoneHandler(map[string][]string{"tc.test.": {"tc.test. 60 IN A 198.18.1.10", "tc.test. 60 IN A 198.18.1.11"}})
	up := startUpstream(t, func(w dns.ResponseWriter, req *dns.Msg, tcp bool) *dns.Msg {
		resp := zone(w, req, tcp)
		if !tcp {
			resp.Answer = resp.Answer[:1]
			resp.Truncated = true
		}
		return resp
	})
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "tc.test")
	resp := tp.ask(t, guest1, query("tc.test.", dns.TypeA), false)
	if resp.Truncated || len(addrsOf(resp.Answer)) != 2 {
		t.Fatalf("reply %v", resp)
	}
	if q := up.Queries(); !slices.Equal(q, []string{"tc.test. A udp", "tc.test. A tcp"}) {
		t.Fatalf("upstream queries %v", q)
	}
}

func TestUpstreamFailover(t *testing.T) {
	good := startUpstream(t, zoneHandler(map[string][]string{"a.test.": {"a.test. 60 IN A 198.18.1.10"}}))
	failing := startUpstream(t, func(_ dns.ResponseWriter, req *dns.Msg, _ bool) *dns.Msg {
		resp := new(dns.Msg)
		resp.SetRcode(req, dns.RcodeServerFailure)
		return resp
	})
	silent := startUpstream(t, func(dns.ResponseWriter, *dns.Msg, bool) *dns.Msg { return nil })
	tp := newTestProxy(t, []netip.AddrPort{silent.addr, failing.addr, good.addr}, func(c *Config) { c.Timeout = 200 * time.Millisecond })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")

	start := time.Now()
	resp := tp.ask(t, guest1, query("a.test.", dns.TypeA), false)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Fatalf("reply %v", resp)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 2*time.Second {
		t.Fatalf("failover took %v, want about one timeout", d)
	}
	if len(silent.Queries()) != 1 || len(failing.Queries()) != 1 || len(good.Queries()) != 1 {
		t.Fatalf("queries: silent %v failing %v good %v", silent.Queries(), failing.Queries(), good.Queries())
	}
	if ev := tp.events.Last(t); ev.Upstream != good.addr.String() {
		t.Fatalf("upstream %q", ev.Upstream)
	}
	// The next query starts with the upstream that answered.
	start = time.Now()
	tp.ask(t, guest1, query("a.test.", dns.TypeA), false)
	if d := time.Since(start); d > 150*time.Millisecond {
		t.Fatalf("second query took %v: did not start with the good upstream", d)
	}
	if st := tp.Stats(); st.UpstreamErrors != 2 {
		t.Fatalf("upstream errors %d", st.UpstreamErrors)
	}
}

func TestAllUpstreamsFailPromptly(t *testing.T) {
	silent := startUpstream(t, func(dns.ResponseWriter, *dns.Msg, bool) *dns.Msg { return nil })
	// A port with no listener: connection refused.
	refused := netip.MustParseAddrPort("127.0.0.1:1")
	tp := newTestProxy(t, []netip.AddrPort{refused, silent.addr}, func(c *Config) { c.Timeout = 300 * time.Millisecond })
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	start := time.Now()
	resp := tp.ask(t, guest1, query("a.test.", dns.TypeA), false)
	d := time.Since(start)
	if resp.Rcode != dns.RcodeServerFailure || len(resp.Answer) != 0 {
		t.Fatalf("reply %v", resp)
	}
	if d > time.Second {
		t.Fatalf("SERVFAIL after %v, want within the 2 tries", d)
	}
	ev := tp.events.Last(t)
	if ev.Verdict != VerdictServfail || !strings.HasPrefix(ev.Err, "all upstreams failed: ") {
		t.Fatalf("event %+v", ev)
	}
}

func TestUpstreamAnswerForAnotherQuestionRejected(t *testing.T) {
	up := startUpstream(t, func(_ dns.ResponseWriter, req *dns.Msg, _ bool) *dns.Msg {
		resp := new(dns.Msg)
		resp.SetReply(req)
		resp.Question[0].Name = "evil.test."
		resp.Answer = []dns.RR{mustRR("evil.test. 60 IN A 198.18.1.10")}
		return resp
	})
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "a.test")
	if resp := tp.ask(t, guest1, query("a.test.", dns.TypeA), false); resp.Rcode != dns.RcodeServerFailure {
		t.Fatalf("reply %v", resp)
	}
	if n := len(tp.att.Calls()); n != 0 {
		t.Fatalf("%d attest calls", n)
	}
}

// A scope entry allows its host's A records and nothing else: the hints of
// its HTTPS records are removed, not attested. The same name given as an
// --allow entry too gets them back.
func TestSVCBHintsNotAttestedForScope(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{
		"svc.test.": {
			`svc.test. 100 IN HTTPS 1 . alpn="h2" ipv4hint="198.18.1.10"`,
			`svc.test. 100 IN A 198.18.1.20`,
		},
	}))
	scope, err := netpolicy.ParseScope("https://svc.test/", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		allow []netpolicy.Entry
		want  []netip.Addr
	}{
		{"scope only", []netpolicy.Entry{scope}, mustAddrs("198.18.1.20")},
		{"scope and allow", netpolicy.DedupEntries(append(entries("svc.test:443/tcp"), scope)), mustAddrs("198.18.1.10", "198.18.1.20")},
		{"allow and scope", netpolicy.DedupEntries(append([]netpolicy.Entry{scope}, entries("svc.test:443/tcp")...)), mustAddrs("198.18.1.10", "198.18.1.20")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
			if err := tp.Register(SessionPolicy{Name: "s", Guest: guest1, Mode: netpolicy.ModeAllowlist, Allow: tc.allow}); err != nil {
				t.Fatal(err)
			}
			resp := tp.ask(t, guest1, query("svc.test.", dns.TypeHTTPS), false)
			var got []netip.Addr
			for _, c := range tp.att.Calls() {
				got = append(got, c.ips...)
			}
			slices.SortFunc(got, netip.Addr.Compare)
			if !slices.Equal(got, tc.want) {
				t.Errorf("attested %v, want %v (answer %v)", got, tc.want, resp.Answer)
			}
			for _, rr := range resp.Answer {
				if h, ok := rr.(*dns.HTTPS); ok && len(tc.want) == 1 && strings.Contains(h.String(), "ipv4hint") {
					t.Errorf("a hint that was not attested reached the session: %s", h)
				}
			}
		})
	}
}

// DNSSEC: a query with DO is forwarded with DO; the signatures of RRsets
// that pass unchanged are returned (and the upstream's AD bit with them
// when nothing changed); a signature over a changed RRset is removed.
func TestDNSSECSignaturesPassWhenUnchanged(t *testing.T) {
	var sawDO []bool
	var mu sync.Mutex
	up := startUpstream(t, func(_ dns.ResponseWriter, req *dns.Msg, _ bool) *dns.Msg {
		opt := req.IsEdns0()
		mu.Lock()
		sawDO = append(sawDO, opt != nil && opt.Do())
		mu.Unlock()
		resp := new(dns.Msg)
		resp.SetReply(req)
		resp.AuthenticatedData = true
		resp.Answer = []dns.RR{
			mustRR("signed.test. 60 IN A 198.18.1.10"),
			mustRR("signed.test. 60 IN RRSIG A 13 2 60 20300101000000 20200101000000 12345 signed.test. c2lnbmF0dXJl"),
		}
		if req.Question[0].Name == "mixed.test." {
			resp.Answer = []dns.RR{
				mustRR("mixed.test. 60 IN A 198.18.1.10"),
				mustRR("mixed.test. 60 IN A 10.0.0.1"), // dropped by the guard: the A RRset changed
				mustRR("mixed.test. 60 IN RRSIG A 13 2 60 20300101000000 20200101000000 12345 mixed.test. c2lnbmF0dXJl"),
				mustRR(`mixed.test. 60 IN TXT "kept"`),
				mustRR("mixed.test. 60 IN RRSIG TXT 13 2 60 20300101000000 20200101000000 12345 mixed.test. c2lnbmF0dXJl"),
			}
		}
		return resp
	})
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "signed.test", "mixed.test")
	withDO := func(name string) *dns.Msg {
		q := query(name, dns.TypeA)
		q.SetEdns0(1232, true)
		return q
	}
	sigs := func(m *dns.Msg) (out []string) {
		for _, rr := range m.Answer {
			if s, ok := rr.(*dns.RRSIG); ok {
				out = append(out, dns.TypeToString[s.TypeCovered])
			}
		}
		return out
	}
	resp := tp.ask(t, guest1, withDO("signed.test."), false)
	if got := sigs(resp); !slices.Equal(got, []string{"A"}) || !resp.AuthenticatedData || resp.IsEdns0() == nil || !resp.IsEdns0().Do() {
		t.Errorf("unchanged signed answer: signatures %v AD %v opt %v", got, resp.AuthenticatedData, resp.IsEdns0())
	}
	resp = tp.ask(t, guest1, withDO("mixed.test."), false)
	if got := sigs(resp); !slices.Equal(got, []string{"TXT"}) || resp.AuthenticatedData {
		t.Errorf("changed answer: signatures %v (want only TXT's) AD %v (want false)", got, resp.AuthenticatedData)
	}
	tp.ask(t, guest1, query("signed.test.", dns.TypeA), false)
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(sawDO, []bool{true, true, false}) {
		t.Errorf("DO seen upstream %v, want the client's [true true false]", sawDO)
	}
}

// The ech parameter of HTTPS and SVCB answers is removed (the name check
// reads the name a client sends in the clear; an ECH client's outer name
// is its provider's), the other parameters kept; a session with
// KeepECH (its name check off) keeps it.
func TestECHStripped(t *testing.T) {
	up := startUpstream(t, zoneHandler(map[string][]string{
		"ech.test.": {`ech.test. 100 IN HTTPS 1 . alpn="h2" ech="AEX+DQBBpQAgACCW2/dfOBZAtQU55/znsBFhpGgmOOyR4oBWYkWB1dDZAAQAAQABABJjbG91ZGZsYXJlLWVjaC5jb20AAA==" ipv4hint="198.18.1.10"`},
	}))
	tp := newTestProxy(t, []netip.AddrPort{up.addr}, nil)
	tp.register(t, guest1, netpolicy.ModeAllowlist, "ech.test")
	if err := tp.Register(SessionPolicy{Name: "keep", Guest: guest2, Mode: netpolicy.ModeAllowlist, Allow: entries("ech.test"), KeepECH: true}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		guest   netip.Addr
		wantECH bool
	}{{guest1, false}, {guest2, true}} {
		resp := tp.ask(t, c.guest, query("ech.test.", dns.TypeHTTPS), false)
		if len(resp.Answer) != 1 {
			t.Fatalf("answer %v", resp)
		}
		s := resp.Answer[0].String()
		if strings.Contains(s, "ech=") != c.wantECH || !strings.Contains(s, `alpn="h2"`) || !strings.Contains(s, "ipv4hint") {
			t.Errorf("guest %s: %s, want ech %v, alpn and ipv4hint kept", c.guest, s, c.wantECH)
		}
	}
}
