package netpolicy

import (
	"fmt"
	"strings"

	"golang.org/x/net/idna"
)

const (
	maxNameLen  = 253
	maxLabelLen = 63
)

// NormalizeName returns the canonical form of a DNS host name: lower-case,
// one trailing dot removed, internationalised labels converted to punycode
// (IDNA 2008 / UTS 46 lookup rules), and then checked as an ASCII host name:
// 1 to 63 characters per label from a-z, 0-9 and '-', no label starting or
// ending with '-', at most 253 characters in total. Errors are one line and
// name the offending label or character.
func NormalizeName(s string) (string, error) {
	name := strings.TrimSuffix(s, ".")
	if name == "" {
		return "", fmt.Errorf("empty name")
	}
	if !isASCII(name) {
		a, err := idna.Lookup.ToASCII(name)
		if err != nil {
			return "", fmt.Errorf("invalid internationalised name %q: %w", s, err)
		}
		name = a
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
	// A name whose last label is all digits reads as (part of) an IPv4
	// address, after IDNA too ("²" maps to "2"); top-level domains are
	// never numeric, so refusing keeps names and addresses apart.
	if allDigits(labels[len(labels)-1]) {
		return "", fmt.Errorf("name %q ends in an all-numeric label; write an address as A.B.C.D", name)
	}
	return name, nil
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
