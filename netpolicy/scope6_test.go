package netpolicy

import (
	"net/netip"
	"strings"
	"testing"
)

// scopeGuard6 is a dual-stack guard whose IPv6 half treats the
// documentation range 2001:db8::/32 as public (as a --public-override
// would), so that the vectors below can name public-looking addresses
// without leaving the documentation ranges.
func scopeGuard6(t *testing.T) *Guard {
	t.Helper()
	g, err := NewDualStackGuard(netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("fd00:20::/112"),
		[]netip.Prefix{netip.MustParsePrefix("2001:db8::/32")})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// url6Vectors are WHATWG-style IPv6 host vectors (the forms of
// web-platform-tests' urltestdata.json IPv6 cases, moved into
// 2001:db8::/32): the input, whether WHATWG fails it, and the host[:port]
// a browser connects to, serialized as WHATWG does (compressed, lower case).
var url6Vectors = []struct {
	in      string
	failure bool
	host    string
}{
	{"https://[2001:db8::1]:8443/x", false, "[2001:db8::1]:8443"},
	{"https://[2001:DB8::1]/", false, "[2001:db8::1]"},
	{"https://[2001:0db8:0000:0000:0000:0000:0000:0001]/", false, "[2001:db8::1]"},
	{"http://[2001:db8:0:0:0:0:0:1]:8080", false, "[2001:db8::1]:8080"},
	{"http://[2001:db8:0:0:1:0:0:1]/", false, "[2001:db8::1:0:0:1]"},
	{"http://[2001:db8:1:0:0:0:0:0]/", false, "[2001:db8:1::]"},
	{"http://[2001:db8:0:1:0:1:0:1]/", false, "[2001:db8:0:1:0:1:0:1]"},
	{"http://[2001:db8::1.2.3.4]/", false, "[2001:db8::102:304]"},
	{"ws://user:pw@[2001:db8::a]:9000/p?q#f", false, "[2001:db8::a]:9000"},
	{"non-special://[2001:db8::3]:80/", false, "[2001:db8::3]:80"},
	{"https://[2001:db8::1]:/", false, "[2001:db8::1]"},
	{"https://[2001:db8::1]?q", false, "[2001:db8::1]"},
	{"https://[2001:db8::1]#f", false, "[2001:db8::1]"},
	// Refused by WHATWG's IPv6 parser.
	{"https://[2001:db8::1::2]/", true, ""},
	{"https://[2001:db8:0:0:0:0:0:1:2]/", true, ""},
	{"https://[2001:db8::1.2.3.]/", true, ""},
	{"https://[2001:db8::1.2.]/", true, ""},
	{"https://[2001:db8::1.2.3.4x]/", true, ""},
	{"https://[2001:db8::1.290.0.0]/", true, ""},
	{"https://[2001:db8::1.00.0.0]/", true, ""},
	{"https://[2001:db8:0:0:0:0:0:1.2.3.4]/", true, ""},
	{"https://[2001:db8:]/", true, ""},
	{"https://[:2001:db8::1]/", true, ""},
	{"https://[2001:db8::1%25eth0]/", true, ""},
	{"https://[2001:db8::1%eth0]/", true, ""},
	{"https://[2001:db8::1/", true, ""},
	{"https://2001:db8::1]/", true, ""},
	{"https://[2001:db8::1]x/", true, ""},
	{"https://[2001:db8::1]:99999/", true, ""},
	{"https://[2001:db8::1]:8443:1/", true, ""},
	{"https://[www.example.com]/", true, ""},
	{"https://[]/", true, ""},
	{"https://[2001:db8::g]/", true, ""},
}

// TestScope6Vectors: on a dual-stack daemon a scope URL with a bracketed
// IPv6 host becomes that address's entry (with the URL's port), as a
// browser reads it; every URL WHATWG fails is refused, with one line
// naming the value.
func TestScope6Vectors(t *testing.T) {
	g := scopeGuard6(t)
	for _, v := range url6Vectors {
		e, err := ParseScope(v.in, g)
		want := v.host // an entry without a port is written without brackets
		if strings.HasPrefix(want, "[") && strings.HasSuffix(want, "]") {
			want = want[1 : len(want)-1]
		}
		switch {
		case v.failure && err == nil:
			t.Errorf("ParseScope(%q) = %q; WHATWG fails this URL", v.in, e)
		case v.failure:
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "scope ") {
				t.Errorf("ParseScope(%q): error is not one line naming the scope: %q", v.in, msg)
			}
		case err != nil:
			t.Errorf("ParseScope(%q): %v; a browser connects to %s", v.in, err, v.host)
		case e.String() != want:
			t.Errorf("ParseScope(%q) = %q; a browser connects to %q", v.in, e, v.host)
		case e.NoHints:
			t.Errorf("ParseScope(%q): an address entry marked NoHints", v.in)
		}
	}
}

// TestScope6Refusals: bracketed hosts a browser connects to but a scope
// must not admit (v4-mapped, v4-compatible, loopback, ULA, link-local with
// or without a zone, NAT64), each one line naming the value; and the
// same URL that a dual-stack daemon admits is refused without --pool6.
func TestScope6Refusals(t *testing.T) {
	g := scopeGuard6(t)
	for _, in := range []string{
		"https://[::ffff:1.2.3.4]/", "https://[::ffff:102:304]:443/", "http://[::127.0.0.1]/",
		"http://[::1]/", "http://[fd00::1]:8443/", "http://[fe80::1]/", "http://[fe80::1%25eth0]/",
		"http://[64:ff9b::808:808]/", "http://[2002:808:808::1]/", "http://[fd00:20::2]/",
	} {
		e, err := ParseScope(in, g)
		if err == nil {
			t.Errorf("ParseScope(%q) = %q, want refused", in, e)
			continue
		}
		if msg := err.Error(); strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "scope "+`"`+in+`"`) {
			t.Errorf("ParseScope(%q): error is not one line naming the scope: %q", in, msg)
		}
	}
	// Control: the dual-stack guard admits the public one.
	if e, err := ParseScope("https://[2001:db8::1]:8443/x", g); err != nil || e.String() != "[2001:db8::1]:8443" {
		t.Fatalf("control: ParseScope on a dual-stack daemon = %q, %v", e, err)
	}
	v4only, err := NewGuard(netip.MustParsePrefix("10.20.0.0/16"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range []string{"https://[2001:db8::1]:8443/x", "https://[2001:4860::8888]/"} {
		for _, guard := range []*Guard{v4only, nil} {
			_, err := ParseScope(in, guard)
			if err == nil {
				t.Errorf("ParseScope(%q) without --pool6: accepted", in)
				continue
			}
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.HasPrefix(msg, `scope "`+in+`": `) {
				t.Errorf("ParseScope(%q) without --pool6: error is not one line naming the scope: %q", in, msg)
			}
			t.Logf("without --pool6: %v", err)
		}
	}
}

// TestURLVectorsDualStack runs the whole WHATWG suite against a
// dual-stack guard: every vector is refused (fail closed), agrees with the
// browser, or differs for a reason of urlDiffersOnPurpose; none is
// accepted as another host, none that WHATWG fails is accepted.
func TestURLVectorsDualStack(t *testing.T) {
	g := scopeGuard6(t)
	var agree, refused int
	for _, v := range urlVectors {
		e, err := ParseScope(v.in, g)
		_, listed := urlDiffersOnPurpose[v.in]
		switch {
		case err != nil:
			refused++
		case !v.failure && e.String() == v.host:
			agree++
		case listed:
		case v.failure:
			t.Errorf("ParseScope(%q) = %q; WHATWG fails this URL", v.in, e)
		default:
			t.Errorf("ParseScope(%q) = %q; a browser connects to %q", v.in, e, v.host)
		}
	}
	t.Logf("%d WHATWG vectors on a dual-stack guard: %d agree, %d refused", len(urlVectors), agree, refused)
}
