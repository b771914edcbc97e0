package netpolicy

import "strings"

// StripUserinfo returns a scope URL without the userinfo of its authority
// ("https://user:pw@host/x" is "https://host/x"; "user@host:8443" is
// "host:8443"), so that a credential in a scope is never stored, logged or
// shown. The authority ends at the first '/', '?', '#' or '\' after the
// scheme's "//" (or the start), and its userinfo runs to its last '@', so
// a password holding a bare '@' goes whole. A URL without userinfo comes
// back unchanged but for surrounding white space.
func StripUserinfo(rawURL string) string {
	s := strings.TrimSpace(rawURL)
	start := 0
	if _, rest, ok := cutScheme(s); ok && strings.HasPrefix(rest, "//") {
		start = len(s) - len(rest) + 2
	} else if strings.HasPrefix(s, "//") {
		start = 2
	}
	auth := s[start:]
	if i := strings.IndexAny(auth, `/?#\`); i >= 0 {
		auth = auth[:i]
	}
	at := strings.LastIndexByte(auth, '@')
	if at < 0 {
		return s
	}
	return s[:start] + s[start+at+1:]
}
