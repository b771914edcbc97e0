package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseEntryValid(t *testing.T) {
	tests := []struct {
		in   string
		want Entry
		text string
	}{
		{"api.example.com", Entry{Kind: KindHost, Name: "api.example.com"}, "api.example.com"},
		{"  EXAMPLE.com.  ", Entry{Kind: KindHost, Name: "example.com"}, "example.com"},
		{"api.example.com:443", Entry{Kind: KindHost, Name: "api.example.com", PortSpec: PortSpec{443, ProtoAny}}, "api.example.com:443"},
		{"localhost", Entry{Kind: KindHost, Name: "localhost"}, "localhost"},
		{"*.example.com", Entry{Kind: KindWildcard, Name: "example.com"}, "*.example.com"},
		{"*.Example.COM:443/TCP", Entry{Kind: KindWildcard, Name: "example.com", PortSpec: PortSpec{443, ProtoTCP}}, "*.example.com:443/tcp"},
		{"**.example.com:443/tcp", Entry{Kind: KindMultiWildcard, Name: "example.com", PortSpec: PortSpec{443, ProtoTCP}}, "**.example.com:443/tcp"},
		{"**.co.uk.", Entry{Kind: KindMultiWildcard, Name: "co.uk"}, "**.co.uk"},
		{"Bücher.Example", Entry{Kind: KindHost, Name: "xn--bcher-kva.example"}, "xn--bcher-kva.example"},
		{"*.bücher.example:53/udp", Entry{Kind: KindWildcard, Name: "xn--bcher-kva.example", PortSpec: PortSpec{53, ProtoUDP}}, "*.xn--bcher-kva.example:53/udp"},
		{"xn--bcher-kva.example", Entry{Kind: KindHost, Name: "xn--bcher-kva.example"}, "xn--bcher-kva.example"},
		{"1.2.3.4", Entry{Kind: KindCIDR, Prefix: netip.MustParsePrefix("1.2.3.4/32")}, "1.2.3.4"},
		{"1.2.3.4:53/udp", Entry{Kind: KindCIDR, Prefix: netip.MustParsePrefix("1.2.3.4/32"), PortSpec: PortSpec{53, ProtoUDP}}, "1.2.3.4:53/udp"},
		{"8.8.8.0/24:443/tcp", Entry{Kind: KindCIDR, Prefix: netip.MustParsePrefix("8.8.8.0/24"), PortSpec: PortSpec{443, ProtoTCP}}, "8.8.8.0/24:443/tcp"},
		{"1.2.3.4/32:65535", Entry{Kind: KindCIDR, Prefix: netip.MustParsePrefix("1.2.3.4/32"), PortSpec: PortSpec{65535, ProtoAny}}, "1.2.3.4:65535"},
		{"a.com:1", Entry{Kind: KindHost, Name: "a.com", PortSpec: PortSpec{1, ProtoAny}}, "a.com:1"},
		{strings.Repeat("a", 63) + ".com", Entry{Kind: KindHost, Name: strings.Repeat("a", 63) + ".com"}, strings.Repeat("a", 63) + ".com"},
	}
	for _, tt := range tests {
		got, err := ParseEntry(tt.in, nil)
		if err != nil {
			t.Errorf("ParseEntry(%q): %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseEntry(%q) = %+v, want %+v", tt.in, got, tt.want)
		}
		if got.String() != tt.text {
			t.Errorf("ParseEntry(%q).String() = %q, want %q", tt.in, got.String(), tt.text)
		}
		again, err := ParseEntry(got.String(), nil)
		if err != nil || again != got {
			t.Errorf("round trip of %q: %+v, %v", got.String(), again, err)
		}
	}
}

// TestParseEntryErrors pins every validation message: they are user-facing.
func TestParseEntryErrors(t *testing.T) {
	const grammar = "want HOST, *.HOST, **.HOST, A.B.C.D or A.B.C.D/N, optionally followed by :PORT or :PORT/tcp or :PORT/udp"
	long63 := strings.Repeat("a", 63)
	tooLongName := strings.Join([]string{long63, long63, long63, long63}, ".") // 255
	tests := []struct{ in, want string }{
		{"", `allow entry "": empty; ` + grammar},
		{"   ", `allow entry "   ": empty; ` + grammar},
		{":80", `allow entry ":80": empty host; ` + grammar},
		// IPv6
		{"::1", `allow entry "::1": IPv6 is not supported`},
		{"[2001:db8::1]:443", `allow entry "[2001:db8::1]:443": IPv6 is not supported`},
		{"2001:db8::/32", `allow entry "2001:db8::/32": IPv6 is not supported`},
		// ports and protocols
		{"a.com:", `allow entry "a.com:": empty port; want a number from 1 to 65535`},
		{"a.com:0", `allow entry "a.com:0": port 0 is out of range; want 1 to 65535`},
		{"a.com:65536", `allow entry "a.com:65536": port 65536 is out of range; want 1 to 65535`},
		{"a.com:99999999999999999999999", `allow entry "a.com:99999999999999999999999": port 99999999999999999999999 is out of range; want 1 to 65535`},
		{"a.com:http", `allow entry "a.com:http": port "http" is not a number; want 1 to 65535`},
		{"a.com:-1", `allow entry "a.com:-1": port "-1" is not a number; want 1 to 65535`},
		{"a.com:53/sctp", `allow entry "a.com:53/sctp": unknown protocol "sctp"; want tcp or udp`},
		{"a.com:53/", `allow entry "a.com:53/": empty protocol after the port; want tcp or udp`},
		{"a.com/udp", `allow entry "a.com/udp": protocol "udp" needs a port, as in HOST:PORT/udp`},
		{"1.2.3.4/tcp", `allow entry "1.2.3.4/tcp": protocol "tcp" needs a port, as in HOST:PORT/tcp`},
		// addresses and CIDRs
		{"1.2.3", `allow entry "1.2.3": invalid IPv4 address "1.2.3"; want A.B.C.D`},
		{"1234", `allow entry "1234": invalid IPv4 address "1234"; want A.B.C.D`},
		{"01.2.3.4", `allow entry "01.2.3.4": invalid IPv4 address "01.2.3.4"; want A.B.C.D`},
		{"1.2.3.4/33", `allow entry "1.2.3.4/33": invalid IPv4 CIDR "1.2.3.4/33"; want A.B.C.D/N with N from 0 to 32`},
		{"1.2.3.4/24", `allow entry "1.2.3.4/24": host bits set in 1.2.3.4/24; did you mean 1.2.3.0/24?`},
		{"10.1.2.3", `allow entry "10.1.2.3": 10.1.2.3 is inside special-purpose range 10.0.0.0/8 (private-use); only public unicast IPv4 is accepted`},
		{"169.254.169.254:80", `allow entry "169.254.169.254:80": 169.254.169.254 is inside special-purpose range 169.254.0.0/16 (link-local); only public unicast IPv4 is accepted`},
		{"100.64.0.0/10", `allow entry "100.64.0.0/10": 100.64.0.0/10 is inside special-purpose range 100.64.0.0/10 (shared-address-space); only public unicast IPv4 is accepted`},
		{"198.18.1.10", `allow entry "198.18.1.10": 198.18.1.10 is inside special-purpose range 198.18.0.0/15 (benchmarking); only public unicast IPv4 is accepted`},
		{"255.255.255.255", `allow entry "255.255.255.255": 255.255.255.255 is inside special-purpose range 240.0.0.0/4 (reserved); only public unicast IPv4 is accepted`},
		{"8.0.0.0/5", `allow entry "8.0.0.0/5": 8.0.0.0/5 overlaps special-purpose range 10.0.0.0/8 (private-use); only public unicast IPv4 is accepted`},
		{"0.0.0.0/0", `allow entry "0.0.0.0/0": 0.0.0.0/0 overlaps special-purpose range 0.0.0.0/8 (this-network); only public unicast IPv4 is accepted`},
		// wildcards
		{"*", `allow entry "*": a wildcard needs at least two labels after it, as in *.example.com`},
		{"**", `allow entry "**": a wildcard needs at least two labels after it, as in *.example.com`},
		{"*.", `allow entry "*.": a wildcard needs at least two labels after it, as in *.example.com`},
		{"*.com", `allow entry "*.com": a wildcard needs at least two labels after it, as in *.example.com`},
		{"**.com.:443", `allow entry "**.com.:443": a wildcard needs at least two labels after it, as in *.example.com`},
		{"a.*.com", `allow entry "a.*.com": wildcard "*" is only allowed as the whole leftmost label, as in *.example.com or **.example.com`},
		{"foo*.example.com", `allow entry "foo*.example.com": wildcard "*" is only allowed as the whole leftmost label, as in *.example.com or **.example.com`},
		{"*a.example.com", `allow entry "*a.example.com": wildcard "*" is only allowed as the whole leftmost label, as in *.example.com or **.example.com`},
		{"***.example.com", `allow entry "***.example.com": wildcard "*" is only allowed as the whole leftmost label, as in *.example.com or **.example.com`},
		{"*.*.example.com", `allow entry "*.*.example.com": wildcard "*" is only allowed as the whole leftmost label, as in *.example.com or **.example.com`},
		// names
		{"a..b", `allow entry "a..b": empty label in "a..b"`},
		{".a.com", `allow entry ".a.com": empty label in ".a.com"`},
		{"a.com..", `allow entry "a.com..": empty label in "a.com."`},
		{"a_b.com", `allow entry "a_b.com": bad character '_' in label "a_b"; labels use a-z, 0-9 and '-'`},
		{"a b.com", `allow entry "a b.com": bad character ' ' in label "a b"; labels use a-z, 0-9 and '-'`},
		{"a.com/path", `allow entry "a.com/path": bad character '/' in label "com/path"; labels use a-z, 0-9 and '-'`},
		{"-a.com", `allow entry "-a.com": label "-a" starts or ends with '-'`},
		{"a-.com", `allow entry "a-.com": label "a-" starts or ends with '-'`},
		{"²", `allow entry "²": name "2" reads as the IPv4 address 0.0.0.2 in URL parsers; write an address as A.B.C.D`},
		{"host.123", `allow entry "host.123": name "host.123" ends in a numeric label, so URL parsers read it as an IPv4 address, and not a valid one; write an address as A.B.C.D`},
		{long63 + "a.com", `allow entry "` + long63 + `a.com": label "` + long63 + `a" is 64 characters long; at most 63 are allowed`},
		{tooLongName, `allow entry "` + tooLongName + `": name is 255 characters long; at most 253 are allowed`},
		{"ä_ö.com", `allow entry "ä_ö.com": invalid internationalised name "ä_ö.com": idna: disallowed rune U+005F`},
		{"http://a.com", `allow entry "http://a.com": a URL is not an allow entry; want its host, or list the URL as a scope`},
	}
	for _, tt := range tests {
		_, err := ParseEntry(tt.in, nil)
		if err == nil {
			t.Errorf("ParseEntry(%q) succeeded, want %q", tt.in, tt.want)
			continue
		}
		if err.Error() != tt.want {
			t.Errorf("ParseEntry(%q)\n got: %s\nwant: %s", tt.in, err, tt.want)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("ParseEntry(%q): error has more than one line", tt.in)
		}
	}
}

func TestParseEntryWithGuard(t *testing.T) {
	g, err := NewGuard(netip.MustParsePrefix("10.20.0.0/16"), []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")})
	if err != nil {
		t.Fatal(err)
	}
	e, err := ParseEntry("198.18.1.0/24:80", g)
	if err != nil || e.Prefix != netip.MustParsePrefix("198.18.1.0/24") {
		t.Errorf("override range rejected: %+v %v", e, err)
	}
	_, err = ParseEntry("10.20.0.6", g)
	if want := `allow entry "10.20.0.6": 10.20.0.6 is inside special-purpose range 10.0.0.0/8 (private-use); only public unicast IPv4 is accepted`; err == nil || err.Error() != want {
		t.Errorf("pool address: %v, want %s", err, want)
	}
	// A pool outside the table is named as the session pool.
	g2, err := NewGuard(netip.MustParsePrefix("100.64.0.0/16"), []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10")})
	if err == nil {
		t.Fatalf("override containing the pool accepted: %v", g2)
	}
	g3, err := NewGuard(netip.MustParsePrefix("100.64.0.0/16"), []netip.Prefix{netip.MustParsePrefix("100.65.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseEntry("100.65.1.1", g3); err != nil {
		t.Errorf("overridden part of 100.64/10: %v", err)
	}
	_, err = ParseEntry("100.64.0.0/15", g3)
	if want := `allow entry "100.64.0.0/15": 100.64.0.0/15 is inside special-purpose range 100.64.0.0/10 (shared-address-space); only public unicast IPv4 is accepted`; err == nil || err.Error() != want {
		t.Errorf("got %v, want %s", err, want)
	}
}

func TestNormalizeName(t *testing.T) {
	tests := []struct{ in, want, err string }{
		{"Example.COM.", "example.com", ""},
		{"münchen.de", "xn--mnchen-3ya.de", ""},
		{"MÜNCHEN.DE", "xn--mnchen-3ya.de", ""},
		{"faß.de", "xn--fa-hia.de", ""}, // IDNA 2008: ß is kept, not mapped to ss
		{"例え.テスト", "xn--r8jz45g.xn--zckzah", ""},
		{"a-b.c0", "a-b.c0", ""},
		{"", "", "empty name"},
		{".", "", "empty name"},
		{"a..", "", `empty label in "a."`},
		{"\xb0", "", `name "\xb0" is not valid UTF-8`},
		{"a\x00b", "", `bad character '\x00' in label "a\x00b"; labels use a-z, 0-9 and '-'`},
	}
	for _, tt := range tests {
		got, err := NormalizeName(tt.in)
		if tt.err != "" {
			if err == nil || err.Error() != tt.err {
				t.Errorf("NormalizeName(%q) error = %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("NormalizeName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestMatchesName(t *testing.T) {
	tests := []struct {
		entry string
		name  string
		want  bool
	}{
		{"example.com", "example.com", true},
		{"example.com", "EXAMPLE.com.", true},
		{"example.com", "a.example.com", false},
		{"*.example.com", "a.example.com", true},
		{"*.example.com", "A.Example.Com.", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "a.b.example.com", false},
		{"*.example.com", "aexample.com", false},
		{"*.example.com", ".example.com", false},
		{"**.example.com", "a.example.com", true},
		{"**.example.com", "a.b.c.example.com", true},
		{"**.example.com", "example.com", false},
		{"**.example.com", "badexample.com", false},
		{"**.example.com", "a..example.com", false},
		{"**.example.com", ".a.example.com", false},
		{"api.example.com:443", "api.example.com", true},
		{"1.2.3.4", "1.2.3.4", false},
		// Wire labels (item 6): an escaped dot is inside a label, escapes
		// name bytes, and only ASCII letters fold.
		{"*.miek.nl", `www\.miek.nl.`, false},
		{"**.miek.nl", `www\.miek.nl.`, false},
		{"miek.nl", `miek\.nl`, false},
		{"*.miek.nl", `a\.b.miek.nl`, true},
		{"**.miek.nl", `a\.b.c.miek.nl`, true},
		{"*.miek.nl", `\119ww.miek.nl.`, true},
		{"*.miek.nl", `w\ww.MIEK.nl`, true},
		{"miek.nl", `\077iek.nl`, true},
		{"kelvin.example", "\u212aelvin.example", false},
		{"kelvin.example", `\226\132\170elvin.example`, false},
		{"example.com", `example.com\.`, false},
		{"example.com", `example.com\`, false},
		{"example.com", `exampl\999.com`, false},
		{"example.com", "example.com..", false},
	}
	for _, tt := range tests {
		e := MustParseEntry(tt.entry)
		if got := e.MatchesName(tt.name); got != tt.want {
			t.Errorf("%q.MatchesName(%q) = %v, want %v", tt.entry, tt.name, got, tt.want)
		}
	}
}

// FuzzParseEntry: whatever parses prints back to text that parses to the
// same entry, and errors stay on one line.
func FuzzParseEntry(f *testing.F) {
	for _, s := range []string{"a.com", "*.a.com:443/tcp", "**.b.c", "1.2.3.4/32:53/udp", "8.8.0.0/16", "bücher.de", "::1", "a..b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEntry(s, nil)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("multi-line error for %q: %v", s, err)
			}
			return
		}
		if err := e.check(); err != nil {
			t.Fatalf("ParseEntry(%q) broke an invariant: %v", s, err)
		}
		again, err := ParseEntry(e.String(), nil)
		if err != nil || again != e {
			t.Fatalf("round trip %q -> %q: %+v %v", s, e.String(), again, err)
		}
	})
}
