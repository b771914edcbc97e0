package world

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/enforcerd/enforcerd/nsmgr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Fixed world addresses; see the package comment.
var (
	internetUplink = netip.MustParsePrefix("198.18.0.1/30")
	hostUplink     = netip.MustParsePrefix("198.18.0.2/30")
	dnsAddr        = netip.MustParseAddr("198.18.0.53")
	webAddrs       = []netip.Addr{
		netip.MustParseAddr("198.18.1.10"),
		netip.MustParseAddr("198.18.1.11"),
		netip.MustParseAddr("198.18.2.10"),
	}
	metadataAddr = netip.MustParseAddr("169.254.169.254")
	// cloudHostAddr looks like Azure's platform endpoint: public unicast in
	// the IANA table, yet never reachable from a session.
	cloudHostAddr = netip.MustParseAddr("168.63.129.16")
	privateAddr   = netip.MustParseAddr("10.99.0.10")
	// sharedAddr is a CDN's front end: one address serving many names,
	// chosen by TLS SNI and HTTP Host (ServeShared starts its servers).
	sharedAddr = netip.MustParseAddr("198.18.3.10")
)

// NetnsDir is where named network namespaces are bind-mounted, as iproute2
// expects them.
const NetnsDir = "/run/netns"

// World is one run's simulated host and simulated internet.
type World struct {
	ID                string
	HostName, NetName string
	HostPath, NetPath string
	Host, Net         netns.NsHandle
	Uplink            netip.Addr
	Gateway           netip.Addr
	DNS               *DNSServer
	Web               []netip.Addr
	Metadata          netip.Addr
	CloudHost         netip.Addr
	Private           netip.Addr
	SharedAddr        netip.Addr
	PublicOverride    netip.Prefix
	// Web6 and Uplink6 are set by EnableIPv6 (empty in an IPv4-only world).
	Web6    []netip.Addr
	Uplink6 netip.Addr

	mu      sync.Mutex
	closers []func() error
	closed  bool
}

// New builds a fresh world for a test and removes it when the test ends.
func New(tb testing.TB) *World {
	tb.Helper()
	RequireRoot(tb)
	w, err := Build()
	if err != nil {
		tb.Fatalf("build test world: %v", err)
	}
	tb.Cleanup(func() {
		if err := w.Close(); err != nil {
			tb.Errorf("remove test world %s: %v", w.ID, err)
		}
	})
	return w
}

// Build makes a world outside of a test (the demo uses it). The caller must
// Close it.
func Build() (w *World, err error) {
	id, err := randomID()
	if err != nil {
		return nil, err
	}
	w = &World{
		ID:             id,
		HostName:       "ew" + id + "h",
		NetName:        "ew" + id + "i",
		Uplink:         hostUplink.Addr(),
		Gateway:        internetUplink.Addr(),
		Web:            webAddrs,
		Metadata:       metadataAddr,
		CloudHost:      cloudHostAddr,
		Private:        privateAddr,
		SharedAddr:     sharedAddr,
		PublicOverride: netip.MustParsePrefix("198.18.0.0/15"),
	}
	w.HostPath = filepath.Join(NetnsDir, w.HostName)
	w.NetPath = filepath.Join(NetnsDir, w.NetName)
	defer func() {
		if err != nil {
			w.Close()
			w = nil
		}
	}()
	// Make /run/netns a shared mount point first, as `ip netns add` would:
	// if a later `ip netns add` (a test's, say) bind-mounted it over netns
	// already mounted there, their removal would fail with EBUSY.
	if err = nsmgr.PrepareNetnsDir(NetnsDir); err != nil {
		return w, err
	}
	if w.Host, err = w.newNamedNetns(w.HostName); err != nil {
		return w, err
	}
	if w.Net, err = w.newNamedNetns(w.NetName); err != nil {
		return w, err
	}
	if err = w.link(); err != nil {
		return w, err
	}
	if err = w.startServers(); err != nil {
		return w, err
	}
	return w, nil
}

// UniqueName returns a name unique to this run, for objects a test creates.
func (w *World) UniqueName(kind string) string { return kind + w.ID }

func (w *World) onClose(fn func() error) {
	w.mu.Lock()
	w.closers = append(w.closers, fn)
	w.mu.Unlock()
}

// Close stops the servers and removes both namespaces by exact name. It is
// safe to call more than once.
func (w *World) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	closers := w.closers
	w.closers = nil
	w.mu.Unlock()
	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// newNamedNetns creates a named namespace and registers its removal.
func (w *World) newNamedNetns(name string) (netns.NsHandle, error) {
	ns, err := NewNamedNetns(name)
	if err != nil {
		return netns.None(), err
	}
	w.onClose(func() error {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("delete netns %s: %w", name, err)
		}
		return nil
	})
	return ns, nil
}

// link joins the simulated host to the simulated internet and puts every
// server address on the internet's loopback.
func (w *World) link() error {
	hh, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", w.HostName, err)
	}
	defer hh.Close()
	ih, err := netlink.NewHandleAt(w.Net)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", w.NetName, err)
	}
	defer ih.Close()

	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: "uplink"},
		PeerName:      "downlink",
		PeerNamespace: netlink.NsFd(int(w.Net)),
	}
	if err := hh.LinkAdd(veth); err != nil {
		return fmt.Errorf("add uplink veth: %w", err)
	}
	for _, step := range []struct {
		h     *netlink.Handle
		link  string
		addrs []netip.Prefix
	}{
		{hh, "lo", nil},
		{hh, "uplink", []netip.Prefix{hostUplink}},
		{ih, "lo", serverPrefixes()},
		{ih, "downlink", []netip.Prefix{internetUplink}},
	} {
		l, err := step.h.LinkByName(step.link)
		if err != nil {
			return fmt.Errorf("find link %s: %w", step.link, err)
		}
		for _, p := range step.addrs {
			if err := step.h.AddrAdd(l, &netlink.Addr{IPNet: prefixToIPNet(p)}); err != nil {
				return fmt.Errorf("add %s to %s: %w", p, step.link, err)
			}
		}
		if err := step.h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", step.link, err)
		}
	}
	up, err := hh.LinkByName("uplink")
	if err != nil {
		return fmt.Errorf("find uplink: %w", err)
	}
	gw := internetUplink.Addr().AsSlice()
	if err := hh.RouteAdd(&netlink.Route{LinkIndex: up.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("add default route via %s: %w", internetUplink.Addr(), err)
	}
	return nil
}

func serverPrefixes() []netip.Prefix {
	var ps []netip.Prefix
	for _, a := range append(append([]netip.Addr{dnsAddr}, webAddrs...), metadataAddr, cloudHostAddr, privateAddr, sharedAddr) {
		ps = append(ps, netip.PrefixFrom(a, 32))
	}
	return ps
}

func randomID() (string, error) {
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random world id: %w", err)
	}
	return hex.EncodeToString(b), nil
}

func listNetns() (string, error) {
	entries, err := os.ReadDir(NetnsDir)
	if err != nil {
		return "", err
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return fmt.Sprint(names), nil
}
