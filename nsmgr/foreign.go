package nsmgr

import (
	"fmt"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
)

// ForeignLinks lists the links of the host netns whose name starts with the
// prefix but that are not this prefix's: neither its DNS interface nor a
// session veth (named <prefix><slot>h, with an alias naming a session of the
// prefix, or no alias yet). The firewall
// treats every interface named "<prefix>*" as a session veth (anti-spoofing
// drops all its traffic unless its address is a session's), so a daemon
// must not start beside such a link: an uplink named "enf0up" would be cut
// off, and another daemon's veths ("enf25h" of prefix "enf2") would be
// judged by the wrong table.
func (m *Manager) ForeignLinks() ([]string, error) {
	links, err := retryDump("links", func() ([]netlink.Link, error) { return m.host.LinkList() })
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range links {
		a := l.Attrs()
		if !strings.HasPrefix(a.Name, m.cfg.Prefix) || a.Name == DNSIfaceName(m.cfg.Prefix) {
			continue
		}
		if slot, ok := parseHostIfaceName(m.cfg.Prefix, a.Name); ok && slot < m.geo.Slots() {
			// No alias yet: a create killed between adding the veth and
			// tagging it; reconcile reaps it with its netns.
			if _, _, ours := parseOwnerAlias(m.cfg.Prefix, a.Alias); ours || a.Alias == "" {
				continue
			}
		}
		out = append(out, a.Name)
	}
	sort.Strings(out)
	return out, nil
}

// CheckNoForeignLinks returns an error naming the first link ForeignLinks
// finds.
func (m *Manager) CheckNoForeignLinks() error {
	links, err := m.ForeignLinks()
	if err != nil {
		return err
	}
	if len(links) > 0 {
		more := ""
		if len(links) > 1 {
			more = fmt.Sprintf(" (and %d more)", len(links)-1)
		}
		return fmt.Errorf("link %s%s starts with the name prefix %q but is not this daemon's: its traffic would be dropped as a session's; rename it or choose another --name-prefix",
			links[0], more, m.cfg.Prefix)
	}
	return nil
}
