package container

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// resolvConf is the guest's /etc/resolv.conf: one nameserver (the DNS anycast address) and no
// search domains, so every name the guest looks up reaches the proxy exactly as typed. Without
// an address the file names none (the resolver then tries the guest's own loopback, which has
// no server: lookups fail, which is right for a session with no DNS).
func resolvConf(dns netip.Addr) string {
	var b strings.Builder
	b.WriteString("# written by enforcerd: the session's DNS proxy, no search domains\n")
	if dns.IsValid() {
		fmt.Fprintf(&b, "nameserver %s\n", dns.Unmap())
	}
	b.WriteString("options ndots:0\n")
	return b.String()
}

// hostsFile is the guest's /etc/hosts: loopback names, the hostname on 127.0.1.1 (so looking
// it up never leaves the sandbox), then the pinned entries, one line per address, names sorted.
func hostsFile(hostname string, pinned map[string][]netip.Addr) string {
	var b strings.Builder
	b.WriteString("# written by enforcerd\n")
	b.WriteString("127.0.0.1\tlocalhost\n")
	b.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
	fmt.Fprintf(&b, "127.0.1.1\t%s\n", hostname)
	names := make([]string, 0, len(pinned))
	for n := range pinned {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		for _, a := range pinned[n] {
			fmt.Fprintf(&b, "%s\t%s\n", a.Unmap(), strings.ToLower(strings.TrimSuffix(n, ".")))
		}
	}
	return b.String()
}

// validHostname reports whether s is a DNS name we can write into /etc/hosts or set as the
// UTS hostname: 1 to 253 characters, labels of 1 to 63 letters, digits, '-' or '_', an optional
// trailing dot. Anything else (spaces, newlines, '#') could inject entries.
func validHostname(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, r := range label {
			ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
			if !ok {
				return false
			}
		}
	}
	return true
}

// validatePinned checks the pinned /etc/hosts entries.
func validatePinned(pinned map[string][]netip.Addr) error {
	for n, addrs := range pinned {
		if !validHostname(n) {
			return fmt.Errorf("pinned host %q: not a DNS name; use letters, digits, '-', '_' and dots", n)
		}
		if len(addrs) == 0 {
			return fmt.Errorf("pinned host %q: no address; want at least one", n)
		}
		for _, a := range addrs {
			if !a.IsValid() {
				return fmt.Errorf("pinned host %q: invalid address; want IPv4 or IPv6 addresses", n)
			}
		}
	}
	return nil
}
