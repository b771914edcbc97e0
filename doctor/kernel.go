package doctor

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// kernelProbe is the outcome of the throwaway-netns probe: a new netns
// (never named, never mounted: it dies with its last fd), a veth pair in
// it, and the daemon's whole nftables table with a session of each egress
// mode that has rules, holding an element of every set type.
type kernelProbe struct {
	netnsErr, vethErr, nftErr, sysctlErr error
	took                                 time.Duration
}

// probePrefix names the probe's table and veths inside the throwaway netns
// (nothing else sees them).
const probePrefix = "enfprobe"

func runKernelProbe(cfg Config) *kernelProbe {
	p := &kernelProbe{}
	start := time.Now()
	defer func() { p.took = time.Since(start) }()
	host, err := netns.Get()
	if err != nil {
		p.netnsErr = fmt.Errorf("open own netns: %w", err)
		return p
	}
	defer host.Close()
	var ns netns.NsHandle
	// netns.New unshares the locked thread into a new netns; nsmgr.Do puts
	// the thread back into host afterwards.
	err = nsmgr.Do(host, func() error {
		var err error
		ns, err = netns.New()
		return err
	})
	if err != nil {
		p.netnsErr = fmt.Errorf("create a network namespace: %w", err)
		return p
	}
	defer ns.Close()
	p.vethErr = probeVeth(ns)
	p.nftErr = probeNftables(ns, cfg)
	p.sysctlErr = probeSysctl(host, ns)
	return p
}

// probeSysctl writes net.ipv4.ip_forward=1 through /proc/sys in the
// throwaway netns (as serve does in its own; nothing of the host changes)
// and checks that the daemon netns's /proc/sys/net is writable: the
// daemon writes there at start (forwarding) and at every create (the
// host side's disable_ipv6). A /proc/sys mounted read-only, as some
// container runtimes do, refuses both.
func probeSysctl(host, ns netns.NsHandle) error {
	const fwd = "/proc/sys/net/ipv4/ip_forward"
	err := nsmgr.Do(ns, func() error {
		f, err := os.OpenFile(fwd, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteString("1")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("write %s in a throwaway netns: %w%s", fwd, err, roHint(err))
	}
	err = nsmgr.Do(host, func() error { return unix.Access(fwd, unix.W_OK) })
	if err != nil {
		return fmt.Errorf("%s of this netns is not writable: %w%s", fwd, err, roHint(err))
	}
	return nil
}

// roHint explains EROFS in a check's detail.
func roHint(err error) string {
	if errors.Is(err, unix.EROFS) {
		return " (mounted read-only, as in a container: the daemon needs a writable /proc/sys/net)"
	}
	return ""
}

func (p *kernelProbe) procSysNet() (string, string) {
	switch {
	case p.netnsErr != nil:
		return StatusFail, "not checked: no throwaway network namespace"
	case p.sysctlErr != nil:
		return StatusFail, p.sysctlErr.Error()
	}
	return StatusOK, "wrote net.ipv4.ip_forward through /proc/sys in a throwaway netns; writable in this one"
}

func (p *kernelProbe) netnsVeth() (string, string) {
	switch {
	case p.netnsErr != nil:
		return StatusFail, p.netnsErr.Error()
	case p.vethErr != nil:
		return StatusFail, p.vethErr.Error()
	}
	return StatusOK, "created a network namespace and a veth pair in it"
}

func (p *kernelProbe) nftables() (string, string) {
	switch {
	case p.netnsErr != nil:
		return StatusFail, "not checked: no throwaway network namespace"
	case p.nftErr != nil:
		return StatusFail, p.nftErr.Error()
	}
	return StatusOK, fmt.Sprintf("built the table with every set type and added sessions in a throwaway netns (%s)", p.took.Round(time.Millisecond))
}

func probeVeth(ns netns.NsHandle) error {
	h, err := nsmgr.HandleIn(ns)
	if err != nil {
		return fmt.Errorf("netlink in the throwaway netns: %w", err)
	}
	defer h.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "probe0"}, PeerName: "probe1"}
	if err := h.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth pair probe0/probe1: %w (is the veth module available?)", err)
	}
	if err := h.LinkSetUp(veth); err != nil {
		return fmt.Errorf("set veth probe0 up: %w", err)
	}
	return nil
}

// probeNftables builds the table serve builds (the configured pool, so
// the sets get its sizes) in ns, adds an allowlist session holding a
// static address, a CIDR, both with a port, a lab peer and an attested
// address with and without a port (every set type: hash, interval,
// concatenated, timeouts), and a public session.
func probeNftables(ns netns.NsHandle, cfg Config) error {
	ipam, err := nsmgr.NewIPAM(cfg.Pool)
	if err != nil {
		return err
	}
	guard, err := netpolicy.NewDualStackGuard(cfg.Pool, cfg.Pool6, cfg.PublicOverrides)
	if err != nil {
		return err
	}
	var dns6 netip.Addr
	if cfg.Pool6.IsValid() {
		dns6 = nsmgr.DNS6Addr(cfg.Pool6, cfg.Pool)
	}
	fw, err := nft.OpenFirewall(nft.FirewallConfig{
		NetNS: ns, Prefix: probePrefix, Pool: cfg.Pool, DNSAddr: ipam.DNSAddr(), Guard: guard,
		Pool6: cfg.Pool6, DNS6Addr: dns6,
		MaxFlows: cfg.MaxFlows, FlowRate: cfg.FlowRate, MaxAttested: cfg.MaxAttested,
	})
	if err != nil {
		return fmt.Errorf("nf_tables: %w", err)
	}
	defer fw.Close()
	if err := fw.Ensure(); err != nil {
		return fmt.Errorf("nf_tables: build the table: %w", err)
	}
	_, _, g0 := ipam.SlotAddrs(0)
	_, _, g1 := ipam.SlotAddrs(1)
	public := netip.MustParseAddr("192.0.2.1") // documentation range: never sent to
	cidr := netip.MustParsePrefix("192.0.2.0/24")
	lab := nft.SessionRules{
		Name: "probe-allowlist", HostIface: nsmgr.HostIfaceName(probePrefix, 0), Guest: g0, Egress: netpolicy.ModeAllowlist,
		Static: []netpolicy.Target{
			{Prefix: netip.PrefixFrom(public, 32)},
			{Prefix: netip.PrefixFrom(netip.MustParseAddr("192.0.2.2"), 32), Port: 443, Proto: netpolicy.ProtoTCP},
			{Prefix: cidr},
			{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Port: 53, Proto: netpolicy.ProtoUDP},
		},
		Peers: []netip.Addr{g1},
	}
	pub := nft.SessionRules{Name: "probe-public", HostIface: nsmgr.HostIfaceName(probePrefix, 1), Guest: g1, Egress: netpolicy.ModePublic}
	for _, r := range []nft.SessionRules{lab, pub} {
		if err := fw.AddSession(r); err != nil {
			return fmt.Errorf("nf_tables: %w", err)
		}
	}
	if _, err := fw.Attest(g0, []netip.Addr{netip.MustParseAddr("203.0.113.1")}, time.Minute, nil); err != nil {
		return fmt.Errorf("nf_tables: %w", err)
	}
	if _, err := fw.Attest(g0, []netip.Addr{netip.MustParseAddr("203.0.113.2")}, time.Minute, []netpolicy.PortSpec{{Port: 443, Proto: netpolicy.ProtoTCP}}); err != nil {
		return fmt.Errorf("nf_tables: %w", err)
	}
	if _, err := fw.Counters(g0); err != nil {
		return fmt.Errorf("nf_tables: read counters: %w", err)
	}
	return nil
}

// checkForeignLinks: links starting with the prefix that are not ours
// (nsmgr's rule).
func checkForeignLinks(e *doctorEnv) (string, string) {
	nets, err := nsmgr.New(nsmgr.Config{Prefix: e.cfg.NamePrefix, Pool: e.cfg.Pool, HostNS: e.host})
	if err != nil {
		return StatusFail, err.Error()
	}
	defer nets.Close()
	if err := nets.CheckNoForeignLinks(); err != nil {
		return StatusFail, err.Error()
	}
	return StatusOK, fmt.Sprintf("no link named %s* but the daemon's", e.cfg.NamePrefix)
}

// hostNet is what the pool is compared with: the host's addresses and
// routes, minus the prefix's own links.
type hostNet struct {
	addrs  []namedPrefix // address/len and the link holding it
	routes []namedPrefix // destination and the link (or table) it goes to
}

type namedPrefix struct {
	p    netip.Prefix
	what string // "link eth0", "table 52 via tun0"
}

// readHostNet lists the host's IPv4 addresses and routes (every table but
// local), skipping the links whose name starts with prefix.
func readHostNet(prefix string) (hostNet, error) {
	var hn hostNet
	links, err := netlink.LinkList()
	if err != nil {
		return hn, fmt.Errorf("list links: %w", err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	ours := func(idx int) bool { return prefix != "" && strings.HasPrefix(names[idx], prefix) }
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return hn, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ours(a.LinkIndex) {
			continue
		}
		if p, ok := ipnetPrefix(a.IPNet); ok {
			hn.addrs = append(hn.addrs, namedPrefix{p, "link " + names[a.LinkIndex]})
		}
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return hn, fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if r.Table == 255 || ours(r.LinkIndex) || r.Dst == nil { // local table; default routes overlap everything
			continue
		}
		p, ok := ipnetPrefix(r.Dst)
		if !ok || p.Bits() == 0 {
			continue
		}
		what := "link " + names[r.LinkIndex]
		if r.LinkIndex == 0 {
			what = fmt.Sprintf("type %d", r.Type)
		}
		if r.Table != 254 {
			what = fmt.Sprintf("table %d, %s", r.Table, what)
		}
		hn.routes = append(hn.routes, namedPrefix{p, what})
	}
	return hn, nil
}

func ipnetPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok || !a.Unmap().Is4() {
		return netip.Prefix{}, false
	}
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), bits), true
}

// poolVerdict compares a pool with the host: an address inside the pool,
// or a route inside (or equal to) it, fails: the host already uses those
// addresses. A route wider than the pool only warns: the pool's /30s are
// more specific, so that route's destinations inside the pool become
// unreachable from the host and its sessions.
func poolVerdict(pool netip.Prefix, hn hostNet) (string, string) {
	for _, a := range hn.addrs {
		if pool.Contains(a.p.Addr()) {
			return StatusFail, fmt.Sprintf("pool %s holds the host's address %s (%s); choose another --pool", pool, a.p, a.what)
		}
	}
	var wider []string
	for _, r := range hn.routes {
		switch {
		case r.p.Bits() >= pool.Bits() && pool.Contains(r.p.Addr()):
			return StatusFail, fmt.Sprintf("pool %s holds the host's route to %s (%s); choose another --pool", pool, r.p, r.what)
		case r.p.Contains(pool.Addr()):
			wider = append(wider, fmt.Sprintf("%s (%s)", r.p, r.what))
		}
	}
	if len(wider) > 0 {
		sort.Strings(wider)
		return StatusWarn, fmt.Sprintf("pool %s lies inside the host's route to %s: its destinations in the pool are unreachable while sessions hold them", pool, strings.Join(wider, ", "))
	}
	return StatusOK, fmt.Sprintf("pool %s overlaps no address or route of the host", pool)
}

func checkPoolOverlap(e *doctorEnv) (string, string) {
	hn, err := readHostNet(e.cfg.NamePrefix)
	if err != nil {
		return StatusFail, err.Error()
	}
	return poolVerdict(e.cfg.Pool, hn)
}

// forwardDrop is a base chain on the forward hook, in a table not ours,
// that drops what it does not accept (policy drop) or drops everything (a
// rule with no match).
type forwardDrop struct {
	table, chain string
	family       nftables.TableFamily
	policyDrop   bool
	dropRule     bool // an unconditional drop or reject rule
	namesPrefix  bool // a rule compares an interface name with the prefix
}

func (d forwardDrop) String() string {
	fam := map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ip", nftables.TableFamilyINet: "inet"}[d.family]
	s := fmt.Sprintf("table %s %s chain %s", fam, d.table, d.chain)
	if d.family == nftables.TableFamilyIPv4 && d.table == "filter" && d.chain == "FORWARD" {
		s += " (iptables-nft)"
	}
	return s
}

// forwardChains are the base chains on the forward hook of the IPv4
// families (ip, inet): the sessions' traffic passes every one of them, and
// a drop in any is final whatever our table accepted.
func isForwardChain(c *nftables.Chain) bool {
	if c.Hooknum == nil || *c.Hooknum != *nftables.ChainHookForward || c.Table == nil {
		return false
	}
	return c.Table.Family == nftables.TableFamilyIPv4 || c.Table.Family == nftables.TableFamilyINet
}

// judgeForward judges one foreign forward chain from its policy and rules.
func judgeForward(c *nftables.Chain, rules []*nftables.Rule, prefix string) (forwardDrop, bool) {
	d := forwardDrop{table: c.Table.Name, chain: c.Name, family: c.Table.Family}
	d.policyDrop = c.Policy != nil && *c.Policy == nftables.ChainPolicyDrop
	for _, r := range rules {
		if unconditionalDrop(r.Exprs) {
			d.dropRule = true
		}
		if namesInterfacePrefix(r.Exprs, prefix) {
			d.namesPrefix = true
		}
	}
	return d, d.policyDrop || d.dropRule
}

// unconditionalDrop reports whether a rule drops (or rejects) every packet:
// only counters, logs and the verdict.
func unconditionalDrop(exprs []expr.Any) bool {
	drops := false
	for _, e := range exprs {
		switch v := e.(type) {
		case *expr.Counter, *expr.Log:
		case *expr.Verdict:
			drops = v.Kind == expr.VerdictDrop
		case *expr.Reject:
			drops = true
		case *expr.Target: // iptables-nft's -j REJECT
			drops = v.Name == "REJECT"
		default:
			return false
		}
	}
	return drops
}

// namesInterfacePrefix reports whether a rule loads iifname or oifname and
// compares it with a value starting with prefix: a rule an operator added
// for our interfaces (nft iifname "enf*", iptables -i enf+).
func namesInterfacePrefix(exprs []expr.Any, prefix string) bool {
	loaded := false
	for _, e := range exprs {
		switch v := e.(type) {
		case *expr.Meta:
			loaded = v.Key == expr.MetaKeyIIFNAME || v.Key == expr.MetaKeyOIFNAME
		case *expr.Cmp:
			if loaded && strings.HasPrefix(string(v.Data), prefix) {
				return true
			}
		}
	}
	return false
}

// forwardVerdict turns the drops found into the check's outcome.
func forwardVerdict(drops []forwardDrop, prefix string) (string, string) {
	var fail, warn []string
	for _, d := range drops {
		what := "policy drop"
		if d.dropRule {
			what = "an unconditional drop rule"
		}
		if d.namesPrefix && !d.dropRule {
			warn = append(warn, fmt.Sprintf("%s has %s but a rule names %s* interfaces (assumed to accept them)", d, what, prefix))
			continue
		}
		fail = append(fail, fmt.Sprintf("%s has %s", d, what))
	}
	if len(fail) > 0 {
		return StatusFail, fmt.Sprintf("%s: it drops the sessions' forwarded traffic after enforcerd's table accepted it; accept traffic from and to %s* interfaces there", strings.Join(fail, "; "), prefix)
	}
	if len(warn) > 0 {
		return StatusWarn, strings.Join(warn, "; ")
	}
	return StatusOK, "no other table drops forwarded traffic"
}

func checkForwardDrop(e *doctorEnv) (string, string) {
	c, err := nftables.New()
	if err != nil {
		return StatusFail, fmt.Sprintf("nftables: %v", err)
	}
	chains, err := c.ListChains()
	if err != nil {
		return StatusFail, fmt.Sprintf("nftables: list chains: %v", err)
	}
	var drops []forwardDrop
	for _, ch := range chains {
		if !isForwardChain(ch) || (ch.Table.Family == nftables.TableFamilyINet && ch.Table.Name == e.cfg.NamePrefix) {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return StatusFail, fmt.Sprintf("nftables: list rules of chain %s: %v", ch.Name, err)
		}
		if d, ok := judgeForward(ch, rules, e.cfg.NamePrefix); ok {
			drops = append(drops, d)
		}
	}
	return forwardVerdict(drops, e.cfg.NamePrefix)
}
