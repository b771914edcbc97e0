package netpolicy

import (
	"strings"
	"testing"
)

func TestStripUserinfo(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:pw@api.example.com/v1": "https://api.example.com/v1",
		"https://user:p@ss@api.example.com":  "https://api.example.com",
		"HTTPS://tok@api.example.com:8443/":  "HTTPS://api.example.com:8443/",
		"//u:p@api.example.com":              "//api.example.com",
		"user:pw@api.example.com:8443":       "api.example.com:8443",
		"  https://u@h.example  ":            "https://h.example",
		"https://api.example.com/a@b":        "https://api.example.com/a@b",
		"https://api.example.com?x=@y":       "https://api.example.com?x=@y",
		`https://example.com\@evil.com/`:     `https://example.com\@evil.com/`,
		"api.example.com":                    "api.example.com",
		"":                                   "",
	} {
		if got := StripUserinfo(in); got != want {
			t.Errorf("StripUserinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestParseScopeErrorsHideUserinfo: a refused scope's error names the URL
// without its credentials.
func TestParseScopeErrorsHideUserinfo(t *testing.T) {
	for _, in := range []string{
		"https://user:secret@a@b.example/",
		"user:secret@host",
		`https://user:secret@host\x`,
		"https://user:secret@*.example.com",
	} {
		_, err := ParseScope(in, nil)
		if err == nil {
			t.Errorf("ParseScope(%q) accepted", in)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseScope(%q): %v names the credential", in, err)
		}
	}
	// The parse itself sees the userinfo: stripping first would accept
	// what is ambiguous.
	if _, err := ParseScope("http://a@b@c.example/", nil); err == nil {
		t.Error("two '@' accepted")
	}
}
