package daemon

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

func TestParseWhyDest(t *testing.T) {
	for _, tc := range []struct {
		in    string
		want  whyDest
		error string
	}{
		{in: "api.example.com", want: whyDest{name: "api.example.com"}},
		{in: "API.Example.com:443", want: whyDest{name: "api.example.com", port: 443, proto: netpolicy.ProtoTCP}},
		{in: "198.18.1.10:53/udp", want: whyDest{addr: netip.MustParseAddr("198.18.1.10"), port: 53, proto: netpolicy.ProtoUDP}},
		{in: "198.18.1.10", want: whyDest{addr: netip.MustParseAddr("198.18.1.10")}},
		{in: "198.18.1.10:0", error: `destination "198.18.1.10:0": port "0": want 1 to 65535`},
		{in: "198.18.1.10/tcp", error: `destination "198.18.1.10/tcp": a protocol needs a port, e.g. 198.18.1.10:443/tcp`},
		{in: "a.test:80/icmp", error: `destination "a.test:80/icmp": protocol "icmp": want tcp or udp`},
		{in: "2001:db8::1", want: whyDest{addr: netip.MustParseAddr("2001:db8::1")}},
		{in: "[2001:2::10]:443", want: whyDest{addr: netip.MustParseAddr("2001:2::10"), port: 443, proto: netpolicy.ProtoTCP}},
		{in: "[2001:2::10]:53/udp", want: whyDest{addr: netip.MustParseAddr("2001:2::10"), port: 53, proto: netpolicy.ProtoUDP}},
		{in: "[2001:2::10]", want: whyDest{addr: netip.MustParseAddr("2001:2::10")}},
		{in: "[2001:2::10]x", error: "want [IPv6]:PORT"},
		{in: "[::ffff:198.18.1.10]:80", error: "want one without a zone, not v4-mapped"},
		{in: "[fe80::1%eth0]:80", error: "want one without a zone, not v4-mapped"},
		{in: "2001:2::10:443", want: whyDest{addr: netip.MustParseAddr("2001:2::10:443")}},
		{in: "bad name!", error: "want a name or an IPv4 address"},
	} {
		got, err := parseWhyDest(tc.in)
		switch {
		case tc.error != "":
			if err == nil || !strings.Contains(err.Error(), tc.error) {
				t.Errorf("parseWhyDest(%q) = %+v, %v; want error %q", tc.in, got, err, tc.error)
			}
		case err != nil || got != tc.want:
			t.Errorf("parseWhyDest(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// The answer's own verdict is the destination's as asked: a name allowed
// on port 80 asked on 8080 is refused there at every address, and .verdict
// says so (not "allowed" with the truth only in addrs); "rejected" when the
// session's on-deny answers; an address a DNS answer opened names the name
// and the record type that opened it.
func TestWhyVerdictIsTheDestinations(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	addr := smPinned["example.com"][0]
	for _, c := range []struct{ onDeny, refused string }{{"drop", api.WhyDropped}, {"reject", api.WhyRejected}} {
		name := "why" + c.onDeny
		info, err := w.d.Create(ctx, api.CreateRequest{Name: name, NetworkOnly: true, Allow: []string{"example.com:80"}, OnDeny: c.onDeny})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		why := func(dest string) api.WhyAnswer {
			t.Helper()
			a, err := w.d.Why(ctx, name, dest, "")
			if err != nil {
				t.Fatalf("why %s %s: %v", name, dest, err)
			}
			return a
		}
		if a := why("example.com:80"); a.Verdict != api.WhyAllowed || len(a.Addrs) != 1 || a.Addrs[0].Verdict != api.WhyAllowed {
			t.Errorf("%s: why example.com:80 = %+v, want allowed", name, a)
		}
		a := why("example.com:8080")
		if a.Verdict != c.refused || a.Reason != "port" || a.Entry != "example.com:80" {
			t.Errorf("%s: why example.com:8080 = %q %q entry %q, want %s port entry example.com:80", name, a.Verdict, a.Reason, a.Entry, c.refused)
		}
		if len(a.Addrs) != 1 || a.Addrs[0].Verdict != c.refused {
			t.Errorf("%s: why example.com:8080 addrs = %+v, want one %s", name, a.Addrs, c.refused)
		}
		if want := "every address it resolves to is " + c.refused + " on 8080/tcp: " + addr.String(); !strings.Contains(a.Detail, want) {
			t.Errorf("%s: detail %q, want it to contain %q", name, a.Detail, want)
		}
		for dest, reason := range map[string]string{addr.String() + ":8080": "not-allowed", "10.99.0.1:80": "special-purpose", "93.184.216.50:53/udp": "resolver"} {
			if a := why(dest); a.Verdict != c.refused || a.Reason != reason {
				t.Errorf("%s: why %s = %q %q, want %s %s", name, dest, a.Verdict, a.Reason, c.refused, reason)
			}
		}
		if a := why("other.example.org"); a.Verdict != api.WhyNXDomain {
			t.Errorf("%s: why other.example.org = %q, want nxdomain whatever the on-deny", name, a.Verdict)
		}

		// An address an HTTPS answer's ipv4hint opened.
		hint := netip.MustParseAddr("93.184.216.99")
		guest := netip.MustParseAddr(info.GuestIP)
		w.d.names.remember(name, "svc.example.com.", "HTTPS", []netip.Addr{hint})
		w.fw.attested = map[netip.Addr][]nft.AttestedAddr{guest: {{IP: hint, Port: 443, Proto: netpolicy.ProtoTCP, Expires: time.Minute}}}
		a = why(hint.String() + ":443")
		if a.Verdict != api.WhyAllowed || a.Reason != "attested" || a.AttestedName != "svc.example.com" || a.AttestedType != "HTTPS" || !strings.Contains(a.Detail, "attested by the HTTPS answer for svc.example.com until") {
			t.Errorf("%s: why %s:443 = %+v, want attested by the HTTPS answer for svc.example.com", name, hint, a)
		}
		w.fw.attested = nil
	}
}

// destVerdict: one address the guest gets refused on the port makes the
// destination refused; addresses the proxy removes decide only when the
// guest gets none.
func TestDestVerdict(t *testing.T) {
	ok := func(ip string) api.WhyAddr { return api.WhyAddr{IP: ip, Verdict: api.WhyAllowed, Reason: "attested"} }
	bad := func(ip string) api.WhyAddr {
		return api.WhyAddr{IP: ip, Verdict: api.WhyRejected, Reason: "port", Detail: "allowed on other ports only: " + ip + ":80/tcp"}
	}
	d := whyDest{name: "a.test", port: 8080, proto: netpolicy.ProtoTCP}
	for _, c := range []struct {
		what           string
		given, removed []api.WhyAddr
		verdict        string
		detail         string
	}{
		{"all allowed", []api.WhyAddr{ok("198.18.1.1"), ok("198.18.1.2")}, nil, api.WhyAllowed, "allowed by x"},
		{"one of two", []api.WhyAddr{ok("198.18.1.1"), bad("198.18.1.2")}, nil, api.WhyRejected, "allowed by x, but 1 of its 2 addresses are rejected on 8080/tcp: 198.18.1.2 allowed on other ports only: 198.18.1.2:80/tcp"},
		{"removed only matter alone", []api.WhyAddr{ok("198.18.1.1")}, []api.WhyAddr{{IP: "10.0.0.1", Verdict: api.WhyDropped, Reason: "special-purpose"}}, api.WhyAllowed, "allowed by x"},
		{"all removed", nil, []api.WhyAddr{{IP: "10.0.0.1", Verdict: api.WhyDropped, Reason: "special-purpose", Detail: "special"}}, api.WhyDropped, "allowed by x, but every address it resolves to is dropped on 8080/tcp: 10.0.0.1 special"},
	} {
		ans := api.WhyAnswer{Verdict: api.WhyAllowed, Reason: "allowed", Detail: "allowed by x"}
		destVerdict(&ans, d, c.given, c.removed)
		if ans.Verdict != c.verdict || ans.Detail != c.detail {
			t.Errorf("%s: %q %q, want %q %q", c.what, ans.Verdict, ans.Detail, c.verdict, c.detail)
		}
	}
}
