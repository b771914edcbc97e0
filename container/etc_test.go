package container

import (
	"net/netip"
	"testing"
)

func TestResolvConf(t *testing.T) {
	got := resolvConf(netip.MustParseAddr("10.20.255.254"))
	want := "# written by enforcerd: the session's DNS proxy, no search domains\n" +
		"nameserver 10.20.255.254\n" +
		"options ndots:0\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	got = resolvConf(netip.Addr{})
	want = "# written by enforcerd: the session's DNS proxy, no search domains\noptions ndots:0\n"
	if got != want {
		t.Errorf("no DNS: got\n%s\nwant\n%s", got, want)
	}
	if got := resolvConf(netip.MustParseAddr("::ffff:10.0.0.1")); got != "# written by enforcerd: the session's DNS proxy, no search domains\nnameserver 10.0.0.1\noptions ndots:0\n" {
		t.Errorf("mapped address not unmapped: %q", got)
	}
}

func TestHostsFile(t *testing.T) {
	got := hostsFile("s1", map[string][]netip.Addr{
		"b.example.test":  {netip.MustParseAddr("198.18.1.11")},
		"A.Example.test.": {netip.MustParseAddr("198.18.1.10"), netip.MustParseAddr("198.18.2.10")},
	})
	want := "# written by enforcerd\n" +
		"127.0.0.1\tlocalhost\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"127.0.1.1\ts1\n" +
		"198.18.1.10\ta.example.test\n" +
		"198.18.2.10\ta.example.test\n" +
		"198.18.1.11\tb.example.test\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestValidHostname(t *testing.T) {
	for s, want := range map[string]bool{
		"api.example.test": true, "x": true, "a-b_c.d.": true, "": false, ".": false,
		"a..b": false, "a b": false, "a\nb": false, "#x": false, "a/b": false,
		string(make([]byte, 64)): false,
	} {
		if got := validHostname(s); got != want {
			t.Errorf("validHostname(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestValidatePinned(t *testing.T) {
	ip := netip.MustParseAddr("198.18.1.10")
	tests := []struct {
		in   map[string][]netip.Addr
		want string
	}{
		{map[string][]netip.Addr{"ok.test": {ip}}, ""},
		{map[string][]netip.Addr{"bad name": {ip}}, `pinned host "bad name": not a DNS name; use letters, digits, '-', '_' and dots`},
		{map[string][]netip.Addr{"x.test\n1.2.3.4 evil": {ip}}, `pinned host "x.test\n1.2.3.4 evil": not a DNS name; use letters, digits, '-', '_' and dots`},
		{map[string][]netip.Addr{"x.test": nil}, `pinned host "x.test": no address; want at least one`},
		{map[string][]netip.Addr{"x.test": {{}}}, `pinned host "x.test": invalid address; want IPv4 or IPv6 addresses`},
	}
	for _, tt := range tests {
		err := validatePinned(tt.in)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("validatePinned(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
