package nsmgr

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// kernelState is what one scan of the kernel finds for this prefix.
type kernelState struct {
	netns     []foundNetns
	prepared  []string     // names of pool entries (see prepared.go), of this Manager or left by another run
	links     []foundLink  // names of the form <prefix><slot>h with a slot of the pool
	poolAddrs []netip.Addr // pool addresses held by links that are not ours
}

type foundNetns struct {
	session string
	path    string
	mounted bool // false: a file left by a create that crashed before its mount
}

type foundLink struct {
	name     string
	index    int
	slot     int
	session  string // from the alias "<prefix>-<session>"; "" if the alias is not ours
	attached bool   // the alias marks an attached session (see Manager.Attach)
	vm       bool   // the alias marks a VM session (see Manager.CreateVM)
	addrs    []netip.Addr
	peerNS   int // IFLA_LINK_NETNSID: the host netns's id for the peer's netns (-1: unknown)
}

// owned reports whether the link's alias names a session of this prefix:
// only then is it ours (another prefix can produce the same name).
func (l foundLink) owned() bool { return l.session != "" }

// scan lists the netns files and host links that carry the prefix. It only
// reads.
func (m *Manager) scan() (kernelState, error) {
	var st kernelState
	entries, err := os.ReadDir(m.cfg.NetnsDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return st, fmt.Errorf("list netns dir %s: %w", m.cfg.NetnsDir, err)
	}
	for _, e := range entries {
		if isPreparedName(m.cfg.Prefix, e.Name()) {
			st.prepared = append(st.prepared, e.Name())
			continue
		}
		session, ok := parseNetnsName(m.cfg.Prefix, e.Name())
		if !ok {
			continue
		}
		path := filepath.Join(m.cfg.NetnsDir, e.Name())
		st.netns = append(st.netns, foundNetns{session: session, path: path, mounted: isNetnsMount(path)})
	}

	links, err := retryDump("links", func() ([]netlink.Link, error) { return m.host.LinkList() })
	if err != nil {
		return st, err
	}
	addrs, err := retryDump("addresses", func() ([]netlink.Addr, error) {
		return m.host.AddrList(nil, netlink.FAMILY_V4)
	})
	if err != nil {
		return st, err
	}
	byIndex := map[int][]netip.Addr{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && m.cfg.Pool.Contains(ip.Unmap()) {
			byIndex[a.LinkIndex] = append(byIndex[a.LinkIndex], ip.Unmap())
		}
	}
	for _, l := range links {
		attrs := l.Attrs()
		slot, ok := parseHostIfaceName(m.cfg.Prefix, attrs.Name)
		if !ok || slot >= m.geo.Slots() {
			if attrs.Name != DNSIfaceName(m.cfg.Prefix) {
				st.poolAddrs = append(st.poolAddrs, byIndex[attrs.Index]...)
			}
			continue
		}
		session, attached, _ := parseOwnerAlias(m.cfg.Prefix, attrs.Alias)
		st.links = append(st.links, foundLink{
			name: attrs.Name, index: attrs.Index, slot: slot, session: session, attached: attached,
			vm:    strings.HasSuffix(attrs.Alias, vmMark),
			addrs: byIndex[attrs.Index], peerNS: attrs.NetNsID,
		})
	}
	return st, nil
}

// sessionLinks sorts the owned links of st: owner maps each session whose
// netns is mounted to its veth; stale lists owned links that are no live
// session's veth (their netns is gone, or held by something after a Delete,
// or, after a name was reused, not the session's current netns).
func (m *Manager) sessionLinks(st kernelState) (owner map[string]foundLink, stale []foundLink) {
	mounted := map[string]string{}
	for _, n := range st.netns {
		if n.mounted {
			mounted[n.session] = n.path
		}
	}
	bySession := map[string][]foundLink{}
	for _, l := range st.links {
		if !l.owned() {
			continue
		}
		if l.attached {
			// Its netns is the runtime's, never a file of ours: the link
			// exists exactly as long as that netns does (a veth dies with
			// either end), so it is its session's.
			bySession[l.session] = append(bySession[l.session], l)
			continue
		}
		if _, ok := mounted[l.session]; !ok {
			stale = append(stale, l)
			continue
		}
		bySession[l.session] = append(bySession[l.session], l)
	}
	owner = map[string]foundLink{}
	for session, ls := range bySession {
		own := ls[0]
		if len(ls) > 1 {
			own = m.linkInto(mounted[session], ls)
		}
		owner[session] = own
		for _, l := range ls {
			if l.name != own.name {
				stale = append(stale, l)
			}
		}
	}
	return owner, stale
}

// linkInto picks, among several veths claiming one session, the one whose
// peer lives in the netns mounted at path (matched by netns id). Failing
// that it picks the newest (highest ifindex, listed last).
func (m *Manager) linkInto(path string, ls []foundLink) foundLink {
	if ns, err := netns.GetFromPath(path); err == nil {
		id, err := m.host.GetNetNsIdByFd(int(ns))
		ns.Close()
		if err == nil && id >= 0 {
			for _, l := range ls {
				if l.peerNS == id {
					return l
				}
			}
		}
	}
	return ls[len(ls)-1]
}
