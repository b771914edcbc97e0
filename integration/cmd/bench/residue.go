package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/enforcerd/enforcerd/integration/enforcerd"
	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/nsmgr"
	"github.com/vishvananda/netlink"
)

// residue counts what a daemon with no sessions should not have: session
// netns, host veths of its prefix, state records, session elements in its
// nftables table, and sandbox state or layer directories. The running
// daemon's own prepared netns ("<prefix>-pool_<pid>_<n>", made ahead of
// demand: serve's --prepared-netns) are not residue; they are counted
// apart.
type residue struct {
	netns, links, records, elements, sandboxes int
	prepared                                   int
}

func (r residue) total() int { return r.netns + r.links + r.records + r.elements + r.sandboxes }

func (r residue) String() string {
	return fmt.Sprintf("netns=%d links=%d records=%d nft_session_elements=%d sandbox_dirs=%d prepared_netns=%d",
		r.netns, r.links, r.records, r.elements, r.sandboxes, r.prepared)
}

// countResidue counts d's leftovers, observed from outside the daemon (the
// filesystem, netlink, and nft's own listing). The kernel removes a deleted
// session's veth in the background, so links are polled for up to 20 s.
func countResidue(ctx context.Context, w *world.World, d *enforcerd.Daemon) (residue, time.Duration, error) {
	var r residue
	ents, err := os.ReadDir(world.NetnsDir)
	if err != nil {
		return r, 0, err
	}
	own := fmt.Sprintf("%s-pool_%d_", d.Prefix, d.PID())
	for _, e := range ents {
		switch {
		case strings.HasPrefix(e.Name(), own):
			r.prepared++
		case strings.HasPrefix(e.Name(), d.Prefix+"-"):
			r.netns++
		}
	}
	start := time.Now()
	waitFor(20*time.Second, func() bool {
		r.links, err = countLinks(w, d.Prefix)
		return err != nil || r.links == 0
	})
	linkWait := time.Since(start)
	if err != nil {
		return r, 0, err
	}
	recs, _ := filepath.Glob(filepath.Join(d.StateDir, "sessions", "*.json"))
	r.records = len(recs)
	for _, sub := range []string{"containers", "layers"} {
		ents, err := os.ReadDir(filepath.Join(d.StateDir, sub))
		if err == nil {
			r.sandboxes += len(ents)
		}
	}
	out, err := run(ctx, 30*time.Second, inNS(w.HostPath, "nft", "-j", "list", "table", "inet", d.Prefix)...)
	if err != nil {
		return r, linkWait, err
	}
	var list struct {
		Nftables []struct {
			Set *struct {
				Name string            `json:"name"`
				Elem []json.RawMessage `json:"elem"`
			} `json:"set"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return r, linkWait, fmt.Errorf("nft -j list table inet %s: %w", d.Prefix, err)
	}
	for _, o := range list.Nftables {
		if o.Set != nil && o.Set.Name != "blocked" { // blocked: configuration, not sessions
			r.elements += len(o.Set.Elem)
		}
	}
	return r, linkWait, nil
}

// countLinks counts links of the prefix in the simulated host, the DNS
// interface aside.
func countLinks(w *world.World, prefix string) (int, error) {
	h, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	// A dump that races with the kernel removing veths in the background
	// is reported as interrupted: retry it, as nsmgr does.
	links, err := h.LinkList()
	for try := 0; errors.Is(err, netlink.ErrDumpInterrupted) && try < 10; try++ {
		links, err = h.LinkList()
	}
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range links {
		name := l.Attrs().Name
		if strings.HasPrefix(name, prefix) && name != nsmgr.DNSIfaceName(prefix) {
			n++
		}
	}
	return n, nil
}
