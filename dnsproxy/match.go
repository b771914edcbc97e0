package dnsproxy

import (
	"fmt"
	"slices"
	"strings"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// matcher answers "is this name allowed, and on which ports" for one
// session. It is a trie of reversed labels: "registry.example.org" is stored
// under org -> example -> registry. It is immutable once built, so lookups
// need no lock.
type matcher struct {
	root trieNode
}

// trieNode is the suffix spelled by the path from the root. exact matches
// the suffix itself, one matches exactly one more label ("*.suffix"), many
// matches one or more labels ("**.suffix"); nil means no such entry.
type trieNode struct {
	children map[string]*trieNode
	exact    *portSet
	one      *portSet
	many     *portSet
}

// portSet is the union of the port constraints of the entries that ended at
// one node. any is set when one of them had no constraint; hints when one
// of them lets SVCB/HTTPS ipv4hint addresses be attested.
type portSet struct {
	any   bool
	hints bool
	ports []netpolicy.PortSpec
}

func (s *portSet) add(ports []netpolicy.PortSpec) {
	if len(ports) == 0 {
		// Any port: what s named before is covered, but the resolver
		// ports (53, 853), which a port-less element never opens.
		s.any = true
		s.ports = slices.DeleteFunc(s.ports, func(p netpolicy.PortSpec) bool { return !netpolicy.IsResolverPort(p.Port) })
		return
	}
	for _, p := range ports {
		if s.any && !netpolicy.IsResolverPort(p.Port) {
			continue
		}
		if !slices.Contains(s.ports, p) {
			s.ports = append(s.ports, p)
		}
	}
}

// newMatcher builds the trie for the name entries in allow; CIDR entries are
// not names and are skipped (the firewall enforces them).
func newMatcher(allow []netpolicy.Entry) (*matcher, error) {
	m := &matcher{}
	for _, e := range allow {
		var slot **portSet
		switch e.Kind {
		case netpolicy.KindHost, netpolicy.KindWildcard, netpolicy.KindMultiWildcard:
		default:
			continue
		}
		name, err := netpolicy.NormalizeName(e.Name)
		if err != nil {
			return nil, fmt.Errorf("allow entry %q: %w", e.Name, err)
		}
		n := m.insert(name)
		switch e.Kind {
		case netpolicy.KindHost:
			slot = &n.exact
		case netpolicy.KindWildcard:
			slot = &n.one
		default:
			slot = &n.many
		}
		if *slot == nil {
			*slot = &portSet{}
		}
		(*slot).add(entryPorts(e))
		(*slot).hints = (*slot).hints || !e.NoHints
	}
	return m, nil
}

// insert returns the node for name (already normalised: lower case, no
// trailing dot), creating the path.
func (m *matcher) insert(name string) *trieNode {
	n := &m.root
	labels := strings.Split(name, ".")
	for i := len(labels) - 1; i >= 0; i-- {
		if n.children == nil {
			n.children = map[string]*trieNode{}
		}
		c := n.children[labels[i]]
		if c == nil {
			c = &trieNode{}
			n.children[labels[i]] = c
		}
		n = c
	}
	return n
}

// match reports whether qname (presentation format as miekg/dns gives it,
// any case, with or without the trailing dot) is allowed, the ports the
// matching entries allow, sorted (nil means any port), and whether one of
// them lets ipv4hint addresses be attested.
func (m *matcher) match(qname string) (ok bool, ports []netpolicy.PortSpec, hints bool) {
	name := lowerASCII(strings.TrimSuffix(qname, "."))
	if name == "" || strings.HasSuffix(name, ".") {
		return false, nil, false
	}
	starts := dns.Split(name + ".")
	for i, st := range starts {
		end := len(name)
		if i+1 < len(starts) {
			end = starts[i+1] - 1
		}
		if end <= st {
			return false, nil, false // an empty label: not a host name
		}
	}
	var acc portSet
	matched := false
	take := func(s *portSet) {
		if s == nil {
			return
		}
		matched = true
		hints = hints || s.hints
		if s.any {
			acc.add(nil)
		}
		acc.add(s.ports)
	}
	n := &m.root
	// After consuming labels starts[i:], remaining labels are i.
	for i := len(starts); ; i-- {
		switch {
		case i == 0:
			take(n.exact)
		case i == 1:
			take(n.one)
			take(n.many)
		default:
			take(n.many)
		}
		if i == 0 || n.children == nil {
			break
		}
		end := len(name)
		if i < len(starts) {
			end = starts[i] - 1
		}
		c := n.children[name[starts[i-1]:end]]
		if c == nil {
			break
		}
		n = c
	}
	if !matched {
		return false, nil, false
	}
	if acc.any && len(acc.ports) == 0 {
		return true, nil, hints
	}
	slices.SortFunc(acc.ports, func(a, b netpolicy.PortSpec) int {
		if a.Port != b.Port {
			return int(a.Port) - int(b.Port)
		}
		return strings.Compare(string(a.Proto), string(b.Proto))
	})
	if acc.any {
		// Any port, and the resolver ports an entry names beside it.
		return true, append([]netpolicy.PortSpec{{Port: 0, Proto: netpolicy.ProtoAny}}, acc.ports...), hints
	}
	return true, acc.ports, hints
}

// lowerASCII lower-cases A-Z only: DNS names compare case-insensitively for
// ASCII letters and nothing else.
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if b[j] >= 'A' && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
