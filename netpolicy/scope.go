package netpolicy

import (
	"fmt"
	"strings"
)

// ParseScope reduces a scope endpoint to an allow entry for its host:
// "https://Example.com:8443/app/#/login" becomes the host entry example.com
// with port 8443. The scheme, user info, path, query and fragment are dropped;
// the host is normalised like any entry (lower-case, punycode). Without an
// explicit port the entry has no port constraint (a scope names a host, and
// the scheme's default port would be a guess). A bare "example.com/path" is
// accepted. Wildcards are not hosts and are rejected. An IPv4 host becomes a
// /32 entry and is checked against g (nil means DefaultGuard). Errors are one
// line: `scope "X": reason`.
func ParseScope(rawURL string, g *Guard) (Entry, error) {
	e, err := parseScope(strings.TrimSpace(rawURL), g)
	if err != nil {
		return Entry{}, fmt.Errorf("scope %q: %w", rawURL, err)
	}
	return e, nil
}

func parseScope(s string, g *Guard) (Entry, error) {
	if s == "" {
		return Entry{}, fmt.Errorf("empty; expected a URL such as https://example.com:8443/path or a host")
	}
	if _, rest, ok := strings.Cut(s, "://"); ok {
		s = rest
	} else {
		s = strings.TrimPrefix(s, "//")
	}
	if i := strings.IndexAny(s, "/?#"); i >= 0 {
		s = s[:i]
	}
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		s = s[i+1:]
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

// DedupEntries returns entries without exact duplicates (same canonical
// text), keeping the first occurrence and the original order.
func DedupEntries(entries []Entry) []Entry {
	seen := make(map[string]bool, len(entries))
	out := make([]Entry, 0, len(entries))
	for _, e := range entries {
		k := e.String()
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, e)
	}
	return out
}
