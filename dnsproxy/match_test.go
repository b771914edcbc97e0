package dnsproxy

import (
	"slices"
	"testing"

	"github.com/enforcerd/enforcerd/netpolicy"
)

func TestMatcher(t *testing.T) {
	m, err := newMatcher(entries(
		"example.com",
		"*.one.example.org",
		"**.many.example.net",
		"api.ports.test:443",
		"api.ports.test:53/udp",
		"*.mixed.test:443",
		"**.mixed.test",
		"bücher.example",
		"93.184.216.0/24",
		"ns.resolver.test",
		"ns.resolver.test:53",
		"*.resolver.test:853/tcp",
		"**.resolver.test:8080",
	))
	if err != nil {
		t.Fatal(err)
	}
	tcp443 := netpolicy.PortSpec{Port: 443}
	udp53 := netpolicy.PortSpec{Port: 53, Proto: netpolicy.ProtoUDP}
	tests := []struct {
		name  string
		want  bool
		ports []netpolicy.PortSpec
	}{
		{"example.com", true, nil},
		{"example.com.", true, nil},
		{"EXAMPLE.Com.", true, nil},
		{"www.example.com.", false, nil},       // exact only
		{"evilexample.com.", false, nil},       // suffix but not a label boundary
		{"example.com.evil.test.", false, nil}, // prefix
		{"com.", false, nil},
		{".", false, nil},
		{"", false, nil},
		{"one.example.org.", false, nil},     // *. needs one more label
		{"a.one.example.org.", true, nil},    // exactly one
		{"A.ONE.example.org", true, nil},     // case
		{"b.a.one.example.org.", false, nil}, // not two
		{"aone.example.org.", false, nil},
		{"many.example.net.", false, nil},    // **. needs at least one
		{"x.many.example.net.", true, nil},   // one
		{"y.x.many.example.net.", true, nil}, // or more
		{"xmany.example.net.", false, nil},
		{"api.ports.test.", true, []netpolicy.PortSpec{udp53, tcp443}}, // sorted by port
		{"a.mixed.test.", true, nil},                                   // *.:443 and **. (any port): any wins
		// Any port wins but over the resolver ports, which a port-less
		// element never opens: those named beside it are kept.
		{"ns.resolver.test.", true, []netpolicy.PortSpec{{Port: 0, Proto: netpolicy.ProtoAny}, {Port: 53}, {Port: 853, Proto: netpolicy.ProtoTCP}}}, // *. matches it too
		{"x.resolver.test.", true, []netpolicy.PortSpec{{Port: 853, Proto: netpolicy.ProtoTCP}, {Port: 8080}}},
		{"b.a.mixed.test.", true, nil},
		{"xn--bcher-kva.example.", true, nil}, // punycode of bücher.example
		{"XN--BCHER-KVA.example.", true, nil},
		{"93.184.216.0.", false, nil},        // CIDR entries are not names
		{`a\.b.one.example.org.`, true, nil}, // one label with a dot in it
		{`a\.one.example.org.`, false, nil},  // one label "a.one" under example.org
		{`a\046b.one.example.org.`, true, nil},
		{"a..one.example.org.", false, nil},
		{".a.one.example.org.", false, nil},
		{".x.many.example.net.", false, nil},
		{"x..many.example.net.", false, nil},
	}
	for _, tt := range tests {
		ok, ports, _ := m.match(tt.name)
		if ok != tt.want || !slices.Equal(ports, tt.ports) {
			t.Errorf("match(%q) = %v %v, want %v %v", tt.name, ok, ports, tt.want, tt.ports)
		}
	}
}

func TestMatcherEmpty(t *testing.T) {
	m, err := newMatcher(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"example.com.", ".", "", "a.b.c.d."} {
		if ok, _, _ := m.match(n); ok {
			t.Errorf("empty matcher matched %q", n)
		}
	}
}

func TestMatcherBadEntry(t *testing.T) {
	_, err := newMatcher([]netpolicy.Entry{{Kind: netpolicy.KindHost, Name: "bad_name.example"}})
	want := `allow entry "bad_name.example": bad character '_' in label "bad_name"; labels use a-z, 0-9 and '-'`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
}
