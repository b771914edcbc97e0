package netpolicy

import (
	"net/netip"
	"slices"
	"testing"
)

func TestParseScope(t *testing.T) {
	tests := []struct{ in, want string }{
		{"https://Example.com:8443/app/#/login", "example.com:8443"},
		{"https://example.com/#/login", "example.com"},
		{"http://example.com", "example.com"},
		{"example.com/path?q=1", "example.com"},
		{"example.com", "example.com"},
		{"//a.com:/x", "a.com"},
		{"https://user:pw@Example.com/", "example.com"},
		{"https://user@host.example:443", "host.example:443"},
		{"HTTP://Bücher.example:443?q=1", "xn--bcher-kva.example:443"},
		{"http://1.2.3.4:8080/x", "1.2.3.4:8080"},
		{"ftp://files.example.org./pub", "files.example.org"},
		{"  https://a.example  ", "a.example"},
	}
	for _, tt := range tests {
		e, err := ParseScope(tt.in, nil)
		if err != nil {
			t.Errorf("ParseScope(%q): %v", tt.in, err)
			continue
		}
		if e.String() != tt.want {
			t.Errorf("ParseScope(%q) = %q, want %q", tt.in, e.String(), tt.want)
		}
		if e.Kind == KindWildcard || e.Kind == KindMultiWildcard || e.Proto != ProtoAny {
			t.Errorf("ParseScope(%q) = %+v: a scope is a host with at most a port", tt.in, e)
		}
	}
}

func TestParseScopeErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", `scope "": empty; want a URL such as https://example.com:8443/path or a host`},
		{"https://", `scope "https://": no host`},
		{"https:///path", `scope "https:///path": no host`},
		{"http://[::1]:80/", `scope "http://[::1]:80/": IPv6 is not supported`},
		{"https://*.a.com/", `scope "https://*.a.com/": a scope names one host; wildcards belong in allow entries`},
		{"http://10.0.0.1/", `scope "http://10.0.0.1/": 10.0.0.1 is inside special-purpose range 10.0.0.0/8 (private-use); only public unicast IPv4 is accepted`},
		{"a.com:0/x", `scope "a.com:0/x": port 0 is out of range; want 1 to 65535`},
		{"https://a_b.com/", `scope "https://a_b.com/": bad character '_' in label "a_b"; labels use a-z, 0-9 and '-'`},
	}
	for _, tt := range tests {
		_, err := ParseScope(tt.in, nil)
		if err == nil || err.Error() != tt.want {
			t.Errorf("ParseScope(%q)\n got: %v\nwant: %s", tt.in, err, tt.want)
		}
	}
}

func TestParseScopeWithGuard(t *testing.T) {
	g, err := NewGuard(pool16, []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")})
	if err != nil {
		t.Fatal(err)
	}
	e, err := ParseScope("http://198.18.1.10/", g)
	if err != nil || e.Prefix != netip.MustParsePrefix("198.18.1.10/32") {
		t.Errorf("scope in a public override: %+v %v", e, err)
	}
}

func TestDedupEntries(t *testing.T) {
	var in []Entry
	for _, s := range []string{"https://Example.com/a", "example.com/b", "EXAMPLE.COM.", "https://example.com:443/", "example.com:443", "a.example"} {
		e, err := ParseScope(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		in = append(in, e)
	}
	var got []string
	for _, e := range DedupEntries(in) {
		got = append(got, e.String())
	}
	if want := []string{"example.com", "example.com:443", "a.example"}; !slices.Equal(got, want) {
		t.Errorf("DedupEntries = %v, want %v", got, want)
	}
}
