package netpolicy

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/net/idna"
)

const (
	maxNameLen  = 253
	maxLabelLen = 63
)

// NormalizeName returns the canonical form of a DNS host name: lower-case,
// one trailing dot removed (an ASCII dot, or an ideographic or full-width
// one, which IDNA maps to it), internationalised labels converted to
// punycode (IDNA 2008 / UTS 46 lookup rules, nontransitional; A-labels are
// decoded and checked by the same rules), and then checked as an ASCII host
// name: 1 to 63 characters per label from a-z, 0-9 and '-', no label
// starting or ending with '-', at most 253 characters in total.
//
// A name that a URL parser would read as an IPv4 address (WHATWG's "ends in
// a number": the last label all digits, or 0x and hex digits) is refused, as
// is a name with a character whose UTS 46 mapping changed after the Unicode
// version of the tables we ship (see skewRunes). Errors are one line and
// name the offending label or character.
func NormalizeName(s string) (string, error) {
	name := s
	if !utf8.ValidString(name) {
		return "", fmt.Errorf("name %q is not valid UTF-8", s)
	}
	if !isASCII(name) || strings.Contains(strings.ToLower(name), "xn--") {
		if r, ok := skewRune(name); ok {
			return "", fmt.Errorf("name %q has %U, which IDNA tables since Unicode 15.1 map differently from ours (Unicode %s); write the name as its A-label (xn--...)", s, r, idna.UnicodeVersion)
		}
		a, err := idna.Lookup.ToASCII(name)
		if err != nil {
			return "", fmt.Errorf("invalid internationalised name %q: %w", s, err)
		}
		name = a
	}
	name = strings.TrimSuffix(name, ".")
	if name == "" {
		return "", fmt.Errorf("empty name")
	}
	name = strings.ToLower(name)
	if len(name) > maxNameLen {
		return "", fmt.Errorf("name is %d characters long; at most %d are allowed", len(name), maxNameLen)
	}
	labels := strings.Split(name, ".")
	for _, label := range labels {
		if err := checkLabel(label, name); err != nil {
			return "", err
		}
	}
	// A name whose last label is a number reads as (part of) an IPv4
	// address to every URL parser (WHATWG "ends in a number", which curl
	// and browsers follow: 0x7f000001 is 127.0.0.1), after IDNA too ("²"
	// maps to "2"); top-level domains are never numeric, so refusing keeps
	// names and addresses apart.
	if endsInNumber(labels[len(labels)-1]) {
		if a, ok := whatwgIPv4(name); ok {
			return "", fmt.Errorf("name %q reads as the IPv4 address %s in URL parsers; write an address as A.B.C.D", name, a)
		}
		return "", fmt.Errorf("name %q ends in a numeric label, so URL parsers read it as an IPv4 address, and not a valid one; write an address as A.B.C.D", name)
	}
	return name, nil
}

// endsInNumber is WHATWG's test on the last label: all ASCII digits, or
// "0x"/"0X" followed by hex digits (possibly none).
func endsInNumber(label string) bool {
	if allDigits(label) {
		return true
	}
	if len(label) >= 2 && label[0] == '0' && (label[1] == 'x' || label[1] == 'X') {
		return strings.Trim(label[2:], "0123456789abcdefABCDEF") == ""
	}
	return false
}

// whatwgIPv4 is the WHATWG IPv4 parser (1 to 4 parts, each decimal, 0x hex
// or 0-prefixed octal; the last part fills the remaining bytes). It is used
// only to say in an error which address a refused name reads as.
func whatwgIPv4(name string) (string, bool) {
	parts := strings.Split(name, ".")
	if len(parts) > 4 {
		return "", false
	}
	nums := make([]uint64, len(parts))
	for i, p := range parts {
		base := 10
		switch {
		case len(p) >= 2 && (p[:2] == "0x" || p[:2] == "0X"):
			base, p = 16, p[2:]
		case len(p) >= 2 && p[0] == '0':
			base, p = 8, p[1:]
		}
		if p == "" {
			if base == 10 {
				return "", false // an empty part
			}
			nums[i] = 0
			continue
		}
		n, err := strconv.ParseUint(p, base, 64)
		if err != nil {
			return "", false
		}
		nums[i] = n
	}
	last := len(nums) - 1
	for _, n := range nums[:last] {
		if n > 255 {
			return "", false
		}
	}
	if nums[last] >= 1<<(8*(5-len(nums))) {
		return "", false
	}
	v := nums[last]
	for i, n := range nums[:last] {
		v += n << (8 * (3 - i))
	}
	return u32ToAddr(uint32(v)).String(), true
}

// skewRunes are the characters that our IDNA tables (x/net/idna built for
// Unicode 15.0.0) accept but map differently from the current UTS 46
// tables (17.0.0): the names they produce would be a different host than
// a current browser's. Derived by running every code point, alone and
// between letters, through x/net/idna's 15.0.0 and 17.0.0 tables and
// keeping those the 15.0.0 tables accept with a different result;
// TestIDNAUnicodeVersionPinned fails when the shipped tables change, so
// this list is re-derived then.
//
// U+1E9E LATIN CAPITAL LETTER SHARP S maps to "ss" in 15.0 and to "ß"
// since 15.1: faẞ.de is fass.de to us and xn--fa-hia.de to a browser.
var skewRunes = []rune{0x1E9E}

func skewRune(s string) (rune, bool) {
	for _, r := range s {
		for _, k := range skewRunes {
			if r == k {
				return r, true
			}
		}
	}
	return 0, false
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

func checkLabel(label, name string) error {
	if label == "" {
		return fmt.Errorf("empty label in %q", name)
	}
	if len(label) > maxLabelLen {
		return fmt.Errorf("label %q is %d characters long; at most %d are allowed", label, len(label), maxLabelLen)
	}
	for _, c := range []byte(label) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("bad character %q in label %q; labels use a-z, 0-9 and '-'", rune(c), label)
		}
	}
	if label[0] == '-' || label[len(label)-1] == '-' {
		return fmt.Errorf("label %q starts or ends with '-'", label)
	}
	return nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
