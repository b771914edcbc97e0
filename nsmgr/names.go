package nsmgr

import (
	"fmt"
	"strconv"
	"strings"
)

const (
	// MaxPrefixLen bounds the prefix so that "<prefix><slot>h" fits the
	// kernel's 15-character interface names for every slot of a /8 pool
	// (7 digits): 6 + 7 + 1 = 14.
	MaxPrefixLen = 6
	// MaxSessionNameLen bounds session names (the netns file name is
	// "<prefix>-<session>", at most 39 characters).
	MaxSessionNameLen = 32
	// GuestIface is the name of the session's side of the veth pair.
	GuestIface = "eth0"
	// ifNameMax is the kernel's limit on interface names (IFNAMSIZ - 1).
	ifNameMax = 15
)

const (
	prefixWant  = "want 1 to 6 characters of a-z and 0-9, starting with a letter"
	sessionWant = "want 1 to 32 characters of a-z, 0-9 and '-', starting with a letter or digit"
	ifNameWant  = "want 1 to 15 characters without '/', ':' or white space, not \".\" or \"..\""
)

// attachedMark ends the alias of the host veth of an attached session (see
// Manager.Attach): "<prefix>-<session> attached". It tells Recover that the
// session lives in a netns enforcerd did not make, so no netns file of its
// own is expected.
const attachedMark = " attached"

// ValidatePrefix checks a daemon prefix: 1 to 6 characters of [a-z0-9],
// starting with a letter.
func ValidatePrefix(p string) error {
	if p == "" {
		return fmt.Errorf("invalid prefix %q: empty; %s", p, prefixWant)
	}
	for _, r := range p {
		if !isLower(r) && !isDigit(r) {
			return fmt.Errorf("invalid prefix %q: character %q not allowed; %s", p, r, prefixWant)
		}
	}
	if len(p) > MaxPrefixLen {
		return fmt.Errorf("invalid prefix %q: %d characters; %s", p, len(p), prefixWant)
	}
	if !isLower(rune(p[0])) {
		return fmt.Errorf("invalid prefix %q: starts with %q; %s", p, p[0], prefixWant)
	}
	return nil
}

// ValidateSessionName checks a session name: 1 to 32 characters of
// [a-z0-9-], starting with a letter or digit.
func ValidateSessionName(name string) error {
	if name == "" {
		return fmt.Errorf("invalid session name %q: empty; %s", name, sessionWant)
	}
	for _, r := range name {
		if !isLower(r) && !isDigit(r) && r != '-' {
			return fmt.Errorf("invalid session name %q: character %q not allowed; %s", name, r, sessionWant)
		}
	}
	if len(name) > MaxSessionNameLen {
		return fmt.Errorf("invalid session name %q: %d characters; %s", name, len(name), sessionWant)
	}
	if name[0] == '-' {
		return fmt.Errorf("invalid session name %q: starts with '-'; %s", name, sessionWant)
	}
	return nil
}

// ValidateIfName checks the name of the interface an attached session gets
// in its netns by the kernel's rules (dev_valid_name): 1 to 15 bytes, none
// of them '/', ':' or white space, and not "." or "..".
func ValidateIfName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("invalid interface name %q: empty; %s", name, ifNameWant)
	case len(name) > ifNameMax:
		return fmt.Errorf("invalid interface name %q: %d bytes; %s", name, len(name), ifNameWant)
	case name == "." || name == "..":
		return fmt.Errorf("invalid interface name %q: %s", name, ifNameWant)
	}
	for _, r := range name {
		if r == '/' || r == ':' || r == ' ' || (r >= '\t' && r <= '\r') {
			return fmt.Errorf("invalid interface name %q: character %q not allowed; %s", name, r, ifNameWant)
		}
	}
	return nil
}

func isLower(r rune) bool { return r >= 'a' && r <= 'z' }
func isDigit(r rune) bool { return r >= '0' && r <= '9' }

// NetnsName is the name of a session's netns (and of its file under the
// netns directory): "<prefix>-<session>".
func NetnsName(prefix, session string) string { return prefix + "-" + session }

// HostIfaceName is the name of the host-side veth of a slot:
// "<prefix><slot>h".
func HostIfaceName(prefix string, slot int) string {
	return prefix + strconv.Itoa(slot) + "h"
}

// DNSIfaceName is the name of the interface holding the DNS anycast
// address: "<prefix>dns".
func DNSIfaceName(prefix string) string { return prefix + "dns" }

// parseNetnsName returns the session of a netns name of this prefix. The
// prefix never contains '-', so "<prefix>-" delimits it strictly: prefix
// "en" does not claim "enf-x", and "enf" does not claim "enf2-x".
func parseNetnsName(prefix, name string) (session string, ok bool) {
	session, ok = strings.CutPrefix(name, prefix+"-")
	if !ok || ValidateSessionName(session) != nil {
		return "", false
	}
	return session, true
}

// ownerAlias is the alias of a session's host veth, naming its owner.
func ownerAlias(prefix, session string, attached bool) string {
	if attached {
		return NetnsName(prefix, session) + attachedMark
	}
	return NetnsName(prefix, session)
}

// parseOwnerAlias returns the session a host veth's alias names and whether
// it is attached (see ownerAlias).
func parseOwnerAlias(prefix, alias string) (session string, attached, ok bool) {
	alias, _ = strings.CutSuffix(alias, vmMark)
	name, attached := strings.CutSuffix(alias, attachedMark)
	session, ok = parseNetnsName(prefix, name)
	return session, attached && ok, ok
}

// parseHostIfaceName returns the slot of a name of the form
// "<prefix><slot>h" (decimal, no leading zeros). The name alone does not
// prove ownership (see the package comment): callers also check the alias.
func parseHostIfaceName(prefix, name string) (slot int, ok bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	digits, ok := strings.CutSuffix(rest, "h")
	if !ok || digits == "" || len(digits) > 9 || (len(digits) > 1 && digits[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if !isDigit(rune(digits[i])) {
			return 0, false
		}
	}
	n, err := strconv.Atoi(digits)
	if err != nil {
		return 0, false
	}
	return n, true
}
