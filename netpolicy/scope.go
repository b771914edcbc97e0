package netpolicy

import (
	"fmt"
	"strings"
)

// ParseScope reduces a scope endpoint to an allow entry for its host:
// "https://Example.com:8443/app/#/login" becomes the host entry example.com
// with port 8443. The scheme, user info, path, query and fragment are dropped;
// the host is normalised like any entry (lower-case, punycode). Without an
// explicit port the entry has no port constraint: it allows every port (a
// scope names a host, and the scheme's default port would be a guess). A
// bare "example.com/path" or "example.com:8443" is accepted. Wildcards are
// not hosts and are rejected. An IPv4 host becomes a /32 entry and is
// checked against g (nil means DefaultGuard). Errors are one line:
// `scope "X": reason`.
//
// The host is the one every URL parser agrees on, or the scope is refused:
// a '\' in the authority (WHATWG reads it as '/', RFC 3986 as a character
// of the user info or host), a special scheme not followed by exactly "//"
// (WHATWG skips any run of '/' and '\'; RFC 3986 reads a path), more than
// one '@', a tab or newline (WHATWG deletes them), and file: URLs.
func ParseScope(rawURL string, g *Guard) (Entry, error) {
	e, err := parseScope(strings.TrimSpace(rawURL), g)
	if err != nil {
		return Entry{}, fmt.Errorf("scope %q: %w", StripUserinfo(rawURL), err)
	}
	e.NoHints = e.Kind == KindHost
	return e, nil
}

// specialSchemes are WHATWG's special schemes: for them a browser reads
// '\' as '/' and finds the host after any run of slashes.
var specialSchemes = map[string]bool{"http": true, "https": true, "ws": true, "wss": true, "ftp": true, "file": true}

func parseScope(s string, g *Guard) (Entry, error) {
	if s == "" {
		return Entry{}, fmt.Errorf("empty; want a URL such as https://example.com:8443/path or a host")
	}
	if strings.ContainsAny(s, "\t\r\n") {
		return Entry{}, fmt.Errorf("a tab or newline in the URL; browsers delete them, which can join two words into one host")
	}
	scheme, rest, hasScheme := cutScheme(s)
	switch {
	case hasScheme && strings.HasPrefix(rest, "//"):
		if scheme == "file" {
			return Entry{}, fmt.Errorf("a file: URL names no network host")
		}
		s = rest[2:]
	case hasScheme && specialSchemes[scheme]:
		return Entry{}, fmt.Errorf(`"%s:" must be followed by "//" and the host; browsers find the host after any run of '/' and '\', other parsers read a path`, scheme)
	case hasScheme && (rest == "" || rest[0] < '0' || rest[0] > '9'):
		// "mailto:x", "blob:https://...", "host:" are neither
		// scheme://host nor host:port.
		return Entry{}, fmt.Errorf(`%q is neither scheme://host nor host:port`, StripUserinfo(s))
	default:
		s = strings.TrimPrefix(s, "//")
	}
	if i := strings.IndexAny(s, "/?#"); i >= 0 {
		s = s[:i]
	}
	if strings.Contains(s, `\`) {
		return Entry{}, fmt.Errorf(`'\' in the host part %q; browsers read it as '/', other parsers as part of the host, so they would connect to different hosts`, StripUserinfo(s))
	}
	switch strings.Count(s, "@") {
	case 0:
	case 1:
		s = s[strings.IndexByte(s, '@')+1:]
	default:
		return Entry{}, fmt.Errorf("more than one '@' before the host %q; parsers disagree on where the host starts", StripUserinfo(s))
	}
	s = strings.TrimSuffix(s, ":") // "host:" has an empty, hence default, port
	if s == "" {
		return Entry{}, fmt.Errorf("no host")
	}
	if strings.Contains(s, "*") {
		return Entry{}, fmt.Errorf("a scope names one host; wildcards belong in allow entries")
	}
	return parseEntry(s, g)
}

// cutScheme splits "scheme:rest" where scheme is RFC 3986's ALPHA *( ALPHA
// / DIGIT / "+" / "-" / "." ), lower-cased.
func cutScheme(s string) (scheme, rest string, ok bool) {
	i := strings.IndexByte(s, ':')
	if i <= 0 {
		return "", s, false
	}
	for j := 0; j < i; j++ {
		c := s[j]
		alpha := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !alpha && (j == 0 || !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return "", s, false
		}
	}
	return strings.ToLower(s[:i]), s[i+1:], true
}

// DedupEntries returns entries without exact duplicates (same canonical
// text), keeping the first occurrence and the original order.
func DedupEntries(entries []Entry) []Entry {
	seen := make(map[string]int, len(entries))
	out := make([]Entry, 0, len(entries))
	for _, e := range entries {
		k := e.String()
		if i, dup := seen[k]; dup {
			// The same reach given twice: hints are attested if either
			// entry allows them (an --allow beside a --scope of one host).
			out[i].NoHints = out[i].NoHints && e.NoHints
			continue
		}
		seen[k] = len(out)
		out = append(out, e)
	}
	return out
}
