package daemon

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/netpolicy"
)

// The name check's test is the DNS proxy's: an allow entry matching the
// name with no port or this one, deny entries winning, any name in public
// mode but the denied ones; a name that does not normalise is refused.
func TestNameAllowed(t *testing.T) {
	allow := netpolicy.Policy{Egress: netpolicy.ModeAllowlist, Allow: []netpolicy.Entry{
		netpolicy.MustParseEntry("pkgs.example.org"),
		netpolicy.MustParseEntry("*.cdn.example.com"),
		netpolicy.MustParseEntry("api.example.com:8443"),
		netpolicy.MustParseEntry("dns.example.net:853"),
	}, Deny: []netpolicy.Entry{netpolicy.MustParseEntry("bad.cdn.example.com")}}
	public := netpolicy.Policy{Egress: netpolicy.ModePublic, Deny: allow.Deny}
	for _, c := range []struct {
		p      netpolicy.Policy
		name   string
		port   uint16
		lacked string
	}{
		{allow, "pkgs.example.org", 443, ""},
		{allow, "PKGS.example.org", 443, ""},
		{allow, "evil.example", 443, "evil.example:443"},
		{allow, "x.cdn.example.com", 443, ""},
		{allow, "bad.cdn.example.com", 443, "bad.cdn.example.com:443"},
		{allow, "api.example.com", 8443, ""},
		{allow, "api.example.com", 443, "api.example.com:443"},
		{allow, "pkgs.example.org", 853, "pkgs.example.org:853"}, // a port-less entry never opens 53 or 853
		{allow, "dns.example.net", 853, ""},
		{allow, "pkgs.example.org\x00", 443, "pkgs.example.org\x00:443"},
		{public, "evil.example", 443, ""},
		{public, "bad.cdn.example.com", 443, "bad.cdn.example.com:443"},
	} {
		lacked, ok := nameAllowed(c.p, c.name, c.port, false)
		if ok != (c.lacked == "") || lacked != c.lacked && !ok {
			t.Errorf("%s nameAllowed(%q, %d) = %q %v, want lacked %q", c.p.Egress, c.name, c.port, lacked, ok, c.lacked)
		}
	}
}

// why --sni: refused names answer name-mismatch with the entry lacked;
// the check off, a destination not admitted by a name, an allowed name
// and an address keep the destination's answer.
func TestWhyNameCheck(t *testing.T) {
	p := netpolicy.Policy{Egress: netpolicy.ModeAllowlist, OnDeny: netpolicy.DenyReject,
		Allow: []netpolicy.Entry{netpolicy.MustParseEntry("pkgs.example.org")}}
	d := whyDest{addr: netip.MustParseAddr("198.18.1.10"), port: 443, proto: netpolicy.ProtoTCP}
	attested := api.WhyAnswer{Dest: "198.18.1.10:443", Verdict: api.WhyAllowed, Reason: "attested"}
	if a := whyNameCheck(p, d, attested, "evil.example"); a.Verdict != api.WhyRejected || a.Reason != netpolicy.ReasonNameMismatch || a.Entry != "evil.example:443" {
		t.Errorf("evil.example: %+v", a)
	}
	for _, c := range []struct {
		p    netpolicy.Policy
		ans  api.WhyAnswer
		sni  string
		what string
	}{
		{p, attested, "pkgs.example.org", "allowed name"},
		{p, attested, "198.18.1.10", "address"},
		{netpolicy.Policy{Egress: netpolicy.ModeAllowlist, NameCheck: netpolicy.NameCheckOff}, attested, "evil.example", "check off"},
		{p, api.WhyAnswer{Verdict: api.WhyAllowed, Reason: "static"}, "evil.example", "static"},
		{netpolicy.Policy{Egress: netpolicy.ModePublic}, api.WhyAnswer{Verdict: api.WhyAllowed, Reason: "public"}, "evil.example", "public without deny names"},
	} {
		if a := whyNameCheck(c.p, d, c.ans, c.sni); a.Verdict != api.WhyAllowed || a.Reason != c.ans.Reason {
			t.Errorf("%s: %+v, want the destination's answer", c.what, a)
		}
	}
}

// The server's reset is a valid TCP segment: its checksum over the
// pseudo header sums to zero.
func TestTCPResetChecksum(t *testing.T) {
	g, s := netip.MustParseAddr("10.20.0.2"), netip.MustParseAddr("198.18.1.10")
	p := tcpReset(g, 40000, s, 443, 0xfffffff1)
	ga, sa := g.As4(), s.As4()
	pseudo := append(append(append([]byte{}, ga[:]...), sa[:]...), 0, 6, 0, 20)
	var sum uint32
	for _, b := range [][]byte{pseudo, p[20:]} {
		for i := 0; i < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	if sum != 0xffff || p[33] != 0x04 || !bytes.Equal(p[24:28], []byte{0xff, 0xff, 0xff, 0xf1}) {
		t.Errorf("reset % x: checksum sum %#x (want 0xffff), flags %#x, seq % x", p, sum, p[33], p[24:28])
	}
}

// The v6 server's reset is a valid TCP segment too: its checksum over the
// IPv6 pseudo header sums to zero, and its IPv6 header carries TCP with
// the addresses given.
func TestTCPReset6Checksum(t *testing.T) {
	g, s := netip.MustParseAddr("fd00:20::2"), netip.MustParseAddr("2001:2:0:3::10")
	p := tcpReset6(g, 40000, s, 443, 0xfffffff1)
	ga, sa := g.As16(), s.As16()
	pseudo := append(append(append([]byte{}, ga[:]...), sa[:]...), 0, 0, 0, 20, 0, 0, 0, 6)
	var sum uint32
	for _, b := range [][]byte{pseudo, p[40:]} {
		for i := 0; i < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	if sum != 0xffff || p[0]>>4 != 6 || p[6] != 6 || !bytes.Equal(p[8:24], ga[:]) || !bytes.Equal(p[24:40], sa[:]) || p[53] != 0x04 {
		t.Errorf("v6 reset % x: checksum sum %#x (want 0xffff)", p, sum)
	}
}
