package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// netEnv is enforcerd's session network done in-process, as the daemon does
// it: nsmgr (netns, veth, addresses, route) and netpolicy (the nftables
// table) on a world's simulated host.
type netEnv struct {
	w      *world.World
	prefix string
	m      *nsmgr.Manager
	guard  *netpolicy.Guard
	fw     *nft.Firewall
	geo    *nsmgr.IPAM // address arithmetic for synthetic sessions
	live   map[string]nsmgr.Session
	clock  *stepClock // times nsmgr.Create's steps (its StepStarted observer)
}

// newNetEnv builds a world and opens nsmgr and the firewall in its simulated
// host, with the table loaded. tag (one letter) starts the prefix, which
// carries the world's run ID.
func newNetEnv(tag string) (*netEnv, error) { return newNetEnvPool6(tag, netip.Prefix{}) }

// benchPool6 is the dual-stack figures' --pool6 (a /112 for the default
// pool): ULA, masqueraded to the world's uplink.
var benchPool6 = netip.MustParsePrefix("fd00:20::/112")

// newNetEnvPool6 is newNetEnv for a dual-stack daemon when pool6 is valid:
// the world gets its IPv6 internet (world.EnableIPv6, public for the
// guard as 198.18.0.0/15 is), nsmgr and the table get pool6.
func newNetEnvPool6(tag string, pool6 netip.Prefix) (e *netEnv, err error) {
	w, err := world.Build()
	if err != nil {
		return nil, fmt.Errorf("build world: %w", err)
	}
	e = &netEnv{w: w, prefix: tag + w.ID[:5], live: map[string]nsmgr.Session{}, clock: &stepClock{}}
	defer func() {
		if err != nil {
			e.Close()
			e = nil
		}
	}()
	if err = nsmgr.EnableForwarding(w.Host); err != nil {
		return e, err
	}
	if pool6.IsValid() {
		if err = w.EnableIPv6(); err != nil {
			return e, err
		}
		if err = nsmgr.EnableForwarding6(w.Host); err != nil {
			return e, err
		}
	}
	// With the daemon's default pool of prepared netns (serve's
	// --prepared-netns), or BENCH_PREPARED_NETNS of them (0: none).
	prepared := nsmgr.DefaultPrepared
	if v := os.Getenv("BENCH_PREPARED_NETNS"); v != "" {
		if prepared, err = strconv.Atoi(v); err != nil || prepared < 0 {
			return e, fmt.Errorf("BENCH_PREPARED_NETNS %q: want a number, 0 or more", v)
		}
	}
	e.m, err = nsmgr.New(nsmgr.Config{Prefix: e.prefix, Pool: nsmgr.DefaultPool, Pool6: pool6, HostNS: w.Host,
		StepStarted: e.clock.mark, Prepared: prepared})
	if err != nil {
		return e, err
	}
	e.m.StartPrepared()
	if e.geo, err = nsmgr.NewIPAM(nsmgr.DefaultPool); err != nil {
		return e, err
	}
	overrides := []netip.Prefix{w.PublicOverride}
	if pool6.IsValid() {
		overrides = append(overrides, world.World6Prefix)
	}
	if e.guard, err = netpolicy.NewDualStackGuard(nsmgr.DefaultPool, pool6, overrides); err != nil {
		return e, err
	}
	e.fw, err = nft.OpenFirewall(nft.FirewallConfig{NetNS: w.Host, Prefix: e.prefix,
		Pool: nsmgr.DefaultPool, DNSAddr: e.m.DNSAddr(), Pool6: pool6, DNS6Addr: e.m.DNS6Addr(),
		Guard: e.guard, AttestFloor: time.Minute})
	if err != nil {
		return e, err
	}
	return e, e.fw.Ensure()
}

// rules are a session's firewall rules: allowlist mode with the given static
// targets.
func (e *netEnv) rules(s nsmgr.Session, static ...netip.Prefix) nft.SessionRules {
	r := nft.SessionRules{Name: s.Name, HostIface: s.HostIface, Guest: s.Guest, Egress: netpolicy.ModeAllowlist}
	for _, p := range static {
		r.Static = append(r.Static, netpolicy.Target{Prefix: p})
	}
	return r
}

// split is one operation's time and its two parts: nsmgr (the network)
// and netpolicy (the firewall elements).
type split struct{ total, net, fw time.Duration }

// create makes a session's network and loads its rules while nsmgr
// makes it, as the daemon does (nsmgr.Manager.CreateAlongside). The
// split's fw part is the rules' own time, inside the total (overlapped
// with nsmgr's steps); its net part is the whole CreateAlongside.
func (e *netEnv) create(name string, static ...netip.Prefix) (nsmgr.Session, split, error) {
	var fw time.Duration
	start := time.Now()
	e.clock.begin()
	s, err := e.m.CreateAlongside(name, true, func(s nsmgr.Session) error {
		t := time.Now()
		err := e.fw.AddSession(e.rules(s, static...))
		fw = time.Since(t)
		return err
	})
	end := time.Now()
	e.clock.end(end)
	if err != nil {
		return s, split{}, err
	}
	e.live[name] = s
	return s, split{end.Sub(start), end.Sub(start), fw}, nil
}

// remove unloads a session's rules and deletes its network.
func (e *netEnv) remove(name string) (split, error) {
	s, ok := e.live[name]
	if !ok {
		return split{}, fmt.Errorf("remove %s: not a live session", name)
	}
	start := time.Now()
	if err := e.fw.RemoveSession(e.rules(s)); err != nil {
		return split{}, err
	}
	mid := time.Now()
	if err := e.m.Delete(name, s.Slot); err != nil {
		return split{}, err
	}
	end := time.Now()
	delete(e.live, name)
	return split{end.Sub(start), end.Sub(mid), mid.Sub(start)}, nil
}

// splits collects split samples.
type splits struct{ total, net, fw Samples }

func (ss *splits) add(s split) {
	ss.total = append(ss.total, s.total)
	ss.net = append(ss.net, s.net)
	ss.fw = append(ss.fw, s.fw)
}

// parts names the p50 of both parts, for a RESULT line.
func (ss *splits) parts(op string, p float64) []string {
	return []string{fmt.Sprintf("ours_%s_nsmgr_p%g_ms=%.3f", op, p, ss.net.Pct(p)),
		fmt.Sprintf("ours_%s_netpolicy_p%g_ms=%.3f", op, p, ss.fw.Pct(p))}
}

// synthetic returns the rules of a session that exists only in the
// firewall (no netns, no veth): the address and interface name of slot.
func (e *netEnv) synthetic(slot int) nft.SessionRules {
	_, _, guest := e.geo.SlotAddrs(slot)
	return nft.SessionRules{Name: fmt.Sprintf("syn%d", slot), HostIface: nsmgr.HostIfaceName(e.prefix, slot),
		Guest: guest, Egress: netpolicy.ModeAllowlist,
		Static: []netpolicy.Target{{Prefix: netip.MustParsePrefix("93.184.216.34/32")}}}
}

// addReturnRoute routes the pool back to the simulated host from the
// simulated internet: without enforcerd's table (no masquerade) a session's
// packets keep their pool source address. Removed by removeReturnRoute.
func addReturnRoute(w *world.World) error {
	h, err := netlink.NewHandleAt(w.Net)
	if err != nil {
		return err
	}
	defer h.Close()
	return h.RouteReplace(returnRoute(h))
}

func removeReturnRoute(w *world.World) error {
	h, err := netlink.NewHandleAt(w.Net)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.RouteDel(returnRoute(h)); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

func returnRoute(h *netlink.Handle) *netlink.Route {
	var idx int
	if l, err := h.LinkByName("downlink"); err == nil {
		idx = l.Attrs().Index
	}
	dst := nsmgr.DefaultPool
	return &netlink.Route{
		LinkIndex: idx,
		Dst:       ipNet(dst),
		Gw:        netip.MustParseAddr("198.18.0.2").AsSlice(),
	}
}

// Close removes every live session (by exact name) and the table, then the
// world.
func (e *netEnv) Close() {
	if e.fw != nil {
		if err := e.fw.DeleteTable(); err != nil {
			logf("cleanup: delete table %s: %v", e.prefix, err)
		}
		e.fw.Close()
	}
	if e.m != nil {
		for name, s := range e.live {
			if err := e.m.Delete(name, s.Slot); err != nil {
				logf("cleanup: delete session %s: %v", name, err)
			}
		}
		if err := e.m.Close(); err != nil { // removes the prepared netns
			logf("cleanup: %v", err)
		}
	}
	if err := e.w.Close(); err != nil {
		logf("cleanup: close world %s: %v", e.w.ID, err)
	}
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// stepClock attributes the time of one nsmgr.Create to its steps: Create
// tells StepStarted as each step starts, so a step lasts until the next
// mark (the last one until Create returns). Creates must not overlap.
type stepClock struct {
	last  time.Time
	step  string
	steps map[string]Samples
}

func (c *stepClock) begin() { c.step = "" }

// mark is the StepStarted observer.
func (c *stepClock) mark(step string) {
	c.end(time.Now())
	c.step, c.last = step, time.Now()
}

func (c *stepClock) end(now time.Time) {
	if c.step == "" {
		return
	}
	if c.steps == nil {
		c.steps = map[string]Samples{}
	}
	c.steps[c.step] = append(c.steps[c.step], now.Sub(c.last))
	c.step = ""
}

// take returns the samples so far and starts afresh.
func (c *stepClock) take() map[string]Samples {
	s := c.steps
	c.steps = nil
	return s
}
