package integration

// The name check over IPv6 (issue 26 with issue 22): a dual-stack
// session's AAAA answers are attested whatever its --name-check, and its
// v6 flows to the addresses a name admitted are checked as its v4 ones
// are. The shared address has a v6 twin (world.SharedAddr6) serving the
// same two names by SNI and Host; each refusal below stands next to its
// served control, and the shared servers' captures prove that no payload
// byte of a refused flow reached the simulated internet.

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// newDualStackNameCheckE2E is newDualStackE2E with the shared address
// served over both families and both names mapped to it (A and AAAA).
func newDualStackNameCheckE2E(t *testing.T) *ncEnv {
	t.Helper()
	e, _ := newDualStackE2E(t)
	s, err := e.w.ServeShared(ncAllowed, ncOther)
	if err != nil {
		t.Fatalf("serve the shared address: %v", err)
	}
	if err := s.ServeIPv6(e.w); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ncAllowed, ncOther} {
		e.w.DNS.AddRR(name + ". 300 IN A " + ncShared)
		e.w.DNS.AddRR(name + ". 300 IN AAAA " + world.SharedAddr6.String())
	}
	// The control of every refusal below: without enforcerd in the way
	// the simulated host is served either name over v6 (the world fronts).
	for _, name := range []string{ncAllowed, ncOther} {
		conf := (&ncEnv{s: s}).tlsConf(name)
		body, err := world.TLSFetch(e.w.HostPath, netip.AddrPortFrom(world.SharedAddr6, world.SharedTLSPort), conf, world.HelloPlan{}, name, 5*time.Second)
		if err != nil || body != "served "+name+"\n" {
			t.Fatalf("control: simulated host to [%s]:443 for %s: %q %v", world.SharedAddr6, name, body, err)
		}
	}
	return &ncEnv{e2eEnv: e, s: s}
}

// at6 is the shared address's v6 twin on port.
func (n *ncEnv) at6(port uint16) netip.AddrPort {
	return netip.AddrPortFrom(n.s.Addr6, port)
}

// attest6 looks name up (AAAA) through the session's v6 proxy and wants
// the shared v6 address in the answer.
func (n *ncEnv) attest6(ns string, info api.SessionInfo, name string) {
	n.t.Helper()
	m, err := world.Lookup(ns, netip.AddrPortFrom(netip.MustParseAddr(info.DNS6), 53), name, dns.TypeAAAA, false, 3*time.Second)
	if err != nil {
		n.t.Fatalf("AAAA %s over the v6 proxy: %v", name, err)
	}
	if got := world.Addrs6Of(m); !slices.Equal(got, []netip.Addr{world.SharedAddr6}) {
		n.t.Fatalf("AAAA %s = %v, want %s attested (a name-checked dual-stack session gets its AAAA)", name, got, world.SharedAddr6)
	}
}

// tryTLS6 is tryTLS to the v6 twin's port 443, SNI and Host sni.
func (n *ncEnv) tryTLS6(ns, sni string, plan world.HelloPlan, timeout time.Duration) (string, time.Duration, error) {
	start := time.Now()
	body, err := world.TLSFetch(ns, n.at6(world.SharedTLSPort), n.tlsConf(sni), plan, sni, timeout)
	return body, time.Since(start), err
}

// TestE2EDualStackNameCheckFronting: a name-checked dual-stack session
// (the default --name-check tls) gets its AAAA answer attested (into the
// kernel's attested6), and over v6 the shared address serves it the
// allowed name by SNI and by Host, while asking the same v6 address for
// another name by SNI (a Go client, curl --connect-to's equivalent) or
// by Host is refused with a name-mismatch flow event naming the v6
// destination, and not one byte at the server (whose connection the
// daemon's reset over a raw IPv6 socket ends). inspect counts the v6
// checks. A --name-check off session is served the other name over v6
// (the control), until an update turns its check on.
func TestE2EDualStackNameCheckFronting(t *testing.T) {
	n := newDualStackNameCheckE2E(t)
	info := n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	fe := n.followFlows("agent")

	// Before the answer the v6 address is not attested: refused.
	if _, _, err := n.tryTLS6(ns, ncAllowed, world.HelloPlan{}, time.Second); err == nil {
		t.Error("the shared v6 address reached before its AAAA answer")
	}
	n.attest6(ns, info, ncAllowed)
	if got := e2eNftAttested6(t, n.w, n.d.Prefix, netip.MustParseAddr(info.Guest6IP)); !slices.Contains(got, world.SharedAddr6) {
		t.Errorf("kernel set attested6 of %s holds %v, want %s", info.Guest6IP, got, world.SharedAddr6)
	}

	m := n.s.Mark()
	body, _, err := n.tryTLS6(ns, ncAllowed, world.HelloPlan{}, 10*time.Second)
	n.served("control: SNI "+ncAllowed+" over v6", body, err, ncAllowed)
	if cs := n.s.Since(m, "tls:443"); len(cs) != 1 || !cs[0].From.Addr().Is6() {
		t.Errorf("control over v6: captures %v, want one connection from a v6 address", cs)
	}
	m = n.s.Mark()
	body, took, err := n.tryTLS6(ns, ncOther, world.HelloPlan{}, 20*time.Second)
	n.refused("fronting by SNI over v6", m, "", body, err, took, ncRefuseWithin)
	// The server got the daemon's reset (a raw IPv6 packet as from the
	// guest, NAT66 applied by conntrack): it holds no half-used
	// connection (its own read timeout is a minute).
	deadline := time.Now().Add(3 * time.Second)
	for cs := n.s.Since(m, "tls:443"); ; cs = n.s.Since(m, "tls:443") {
		if len(cs) == 1 && cs[0].Closed() {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("fronting by SNI over v6: the server's connections %v, want the one it accepted closed by the reset", cs)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	fe.expect(t, "fronting by SNI over v6", map[string]any{"reason": "name-mismatch", "via": "tls-sni", "name": ncOther,
		"dst": world.SharedAddr6.String(), "dport": float64(443), "lacked": ncOther + ":443", "answer": "tcp-reset"})
	fe.drain(t, 200*time.Millisecond)

	body, err = world.HTTPFetch(ns, n.at6(world.SharedHTTPPort), ncAllowed, 5*time.Second)
	n.served("control: Host "+ncAllowed+" over v6", body, err, ncAllowed)
	m = n.s.Mark()
	start := time.Now()
	body, err = world.HTTPFetch(ns, n.at6(world.SharedHTTPPort), ncOther, 20*time.Second)
	n.refused("fronting by Host over v6", m, "", body, err, time.Since(start), ncRefuseWithin)
	fe.expect(t, "fronting by Host over v6", map[string]any{"reason": "name-mismatch", "via": "http-host", "name": ncOther,
		"dst": world.SharedAddr6.String(), "dport": float64(80), "lacked": ncOther + ":80"})

	// The same session's v4 flows are checked as before.
	n.attest(ns, ncAllowed)
	m = n.s.Mark()
	body, took, err = n.tryTLS(ns, 443, n.tlsConf(ncOther), world.HelloPlan{}, 20*time.Second)
	n.refused("fronting by SNI over v4 (the same session)", m, "", body, err, took, ncRefuseWithin)

	if nc := n.inspect("agent").NameCheck; nc == nil || nc.Refused < 3 || nc.Allowed < 2 {
		t.Errorf("inspect name_check: %+v, want the v6 flows counted (at least 3 refused, 2 allowed)", nc)
	}

	// The check is the difference: a --name-check off session is served
	// the other name over v6 (the world fronts through enforcerd); an
	// update turns the check on for its v6 flows too.
	open := n.createNetOnly("open", "--allow", ncAllowed, "--name-check", "off")
	ons := n.nsPath("open")
	n.attest6(ons, open, ncAllowed)
	body, _, err = n.tryTLS6(ons, ncOther, world.HelloPlan{}, 10*time.Second)
	n.served("control: --name-check off, SNI "+ncOther+" over v6", body, err, ncOther)
	n.update("open", "--name-check", "tls")
	m = n.s.Mark()
	body, took, err = n.tryTLS6(ons, ncOther, world.HelloPlan{}, 20*time.Second)
	n.refused("after update --name-check tls, fronting by SNI over v6", m, "", body, err, took, ncRefuseWithin)
	body, _, err = n.tryTLS6(ons, ncAllowed, world.HelloPlan{}, 10*time.Second)
	n.served("after update --name-check tls, the allowed name over v6", body, err, ncAllowed)
}

// TestE2EDualStackNameCheckSplitHello: over v6 a hello split inside the
// name is held until the name is known: the other name is refused and not
// even the first segment reaches the server; the allowed name, split the
// same way, is served. A SYN carrying an IPv6 destination options header
// (set on the socket, IPV6_DSTOPTS) is refused (a TCP reset: the check
// does not read past extension headers), next to the same dial without it
// and the same dial from a --name-check off session (the table itself
// lets the header through).
func TestE2EDualStackNameCheckSplitHello(t *testing.T) {
	n := newDualStackNameCheckE2E(t)
	info := n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	n.attest6(ns, info, ncAllowed)
	split := func(name string) world.HelloPlan { return world.HelloPlan{SplitIn: name, Gap: 200 * time.Millisecond} }
	body, _, err := n.tryTLS6(ns, ncAllowed, split(ncAllowed), 10*time.Second)
	n.served("split inside the name over v6, the allowed name", body, err, ncAllowed)
	m := n.s.Mark()
	body, took, err := n.tryTLS6(ns, ncOther, split(ncOther), 20*time.Second)
	n.refused("split inside the name over v6, another name", m, "", body, err, took, ncRefuseWithin)

	open := n.createNetOnly("open", "--allow", ncAllowed, "--name-check", "off")
	n.attest6(n.nsPath("open"), open, ncAllowed)
	fe := n.followFlows("agent")
	dialFrom := func(ns string, dstOpts bool) error {
		return world.DoPath(ns, func() error {
			d := net.Dialer{Timeout: 3 * time.Second}
			if dstOpts {
				d.Control = func(_, _ string, rc syscall.RawConn) error {
					var serr error
					err := rc.Control(func(fd uintptr) {
						// An empty destination options header: PadN over
						// its six bytes.
						opts := []byte{0, 0, 1, 4, 0, 0, 0, 0}
						serr = unix.SetsockoptString(int(fd), unix.IPPROTO_IPV6, unix.IPV6_DSTOPTS, string(opts))
					})
					if err != nil {
						return err
					}
					return serr
				}
			}
			c, err := d.Dial("tcp6", n.at6(world.SharedHTTPPort).String())
			if err == nil {
				c.Close()
			}
			return err
		})
	}
	// The server accepts in its own time: both dials are counted from
	// one mark, the control's connection the only one it may have.
	m = n.s.Mark()
	if err := dialFrom(ns, false); err != nil {
		t.Errorf("control: a plain v6 connection to the shared address: %v", err)
	}
	if err := dialFrom(n.nsPath("open"), true); err != nil {
		t.Errorf("control: --name-check off, a SYN with a destination options header: %v (the table lets it through)", err)
	}
	if err := dialFrom(ns, true); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a SYN with a destination options header: %v, want ECONNREFUSED (refused by the name check)", err)
	}
	n.noPayload("a SYN with a destination options header", m, "")
	if cs := n.s.Since(m, "http:80"); len(cs) != 2 {
		t.Errorf("the server accepted %v, want only the two controls' connections (the checked SYN with a destination options header never arrives)", cs)
	}
	fe.expect(t, "a SYN with a destination options header", map[string]any{"reason": "name-mismatch", "cause": "unreadable",
		"dst": world.SharedAddr6.String(), "dport": float64(80)})
}

// TestE2EDualStackNameCheckQUIC: UDP/443 to a v6 address a name admitted
// follows --quic as v4 does: refused (the default) with ICMPv6
// administratively prohibited (EACCES), the datagram never reaching the
// sink, while a --name-check off session's datagram arrives (the
// control); under --quic check the allowed name's Initial arrives and the
// other tenant's is refused.
func TestE2EDualStackNameCheckQUIC(t *testing.T) {
	n := newDualStackNameCheckE2E(t)
	infos := map[string]api.SessionInfo{
		"agent": n.createNetOnly("agent", "--allow", ncAllowed),
		"open":  n.createNetOnly("open", "--allow", ncAllowed, "--name-check", "off"),
		"check": n.createNetOnly("check", "--allow", ncAllowed, "--quic", "check"),
	}
	for name, info := range infos {
		n.attest6(n.nsPath(name), info, ncAllowed)
	}
	dst := n.at6(world.SharedQUICPort)
	m := n.s.Mark()
	if err := world.QUICInitial(n.nsPath("open"), dst, world.BlockTimeout); !world.IsTimeout(err) {
		t.Errorf("--name-check off: quic initial over v6: %v, want it sent and unanswered", err)
	}
	if cs := n.s.Since(m, "udp:443"); len(cs) != 1 || len(cs[0].Bytes()) != 1200 {
		t.Errorf("--name-check off: the sink got %v, want the 1200-byte datagram (the control)", cs)
	}
	m = n.s.Mark()
	fa := n.followFlows("agent")
	if err := world.QUICInitial(n.nsPath("agent"), dst, e2eRejectWait); !errors.Is(err, syscall.EACCES) {
		t.Errorf("--quic refuse: quic initial over v6: %v, want EACCES (ICMPv6 admin-prohibited)", err)
	}
	n.noPayload("--quic refuse over v6", m, "udp:443")
	fa.expect(t, "--quic refuse over v6", map[string]any{"reason": "quic", "proto": "udp", "dst": dst.Addr().String(), "dport": float64(443)})

	fe := n.followFlows("check")
	for _, c := range []struct {
		sni     string
		allowed bool
	}{{ncAllowed, true}, {ncOther, false}} {
		hello, err := world.QUICClientHello(c.sni, false)
		if err != nil {
			t.Fatal(err)
		}
		m := n.s.Mark()
		err = world.SendDatagrams(n.nsPath("check"), dst, 0, 2*time.Second, world.QUICInitials(hello)...)
		if c.allowed {
			if !world.IsTimeout(err) {
				t.Errorf("--quic check over v6, %s: %v, want sent and unanswered", c.sni, err)
			}
			if cs := n.s.Since(m, "udp:443"); len(cs) != 1 || len(cs[0].Bytes()) != 1200 {
				t.Errorf("--quic check over v6, %s: the sink got %v, want the datagram", c.sni, cs)
			}
			continue
		}
		if !errors.Is(err, syscall.EACCES) {
			t.Errorf("--quic check over v6, %s: %v, want EACCES (ICMPv6 admin-prohibited)", c.sni, err)
		}
		n.noPayload("--quic check over v6, fronting", m, "udp:443")
		fe.expect(t, "--quic check over v6, fronting", map[string]any{"reason": "name-mismatch", "proto": "udp", "via": "quic-sni",
			"name": ncOther, "dst": world.SharedAddr6.String(), "dport": float64(443)})
	}
}
