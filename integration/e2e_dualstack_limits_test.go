package integration

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// Counted limits, drop reasons and why for the v6 flows of dual-stack
// sessions (issue 26 on top of issue 24): everything a v4 flow obeys.

// e2eRefused6 dials dst (v6) from ns and fails unless the table answered
// with ICMPv6 administratively prohibited (EACCES), the --on-deny reject
// default's answer.
func e2eRefused6(t *testing.T, what, ns string, dst netip.AddrPort) {
	t.Helper()
	c, err := world.DialTCP(ns, dst, 2*time.Second)
	if err == nil {
		c.Close()
		t.Errorf("%s: %s reached, want refused", what, dst)
		return
	}
	if !errors.Is(err, unix.EACCES) {
		t.Errorf("%s: %s: %v, want EACCES (ICMPv6 admin-prohibited)", what, dst, err)
	}
}

// flowLinesTo are the session's flow events with reason naming dst.
func (e *e2eEnv) flowLinesTo(name, reason string, dst netip.Addr) []string {
	var out []string
	for _, l := range e.flowLines(name, reason) {
		if strings.Contains(l, `"dst":"`+dst.String()+`"`) {
			out = append(out, l)
		}
	}
	return out
}

// TestE2EDualStackEgressBudget: --egress-budget is one budget for both
// families. A v6 upload of 4 MiB stops at the session's 1 MiB (the server
// gets at most the budget and close to it) while the control session
// without a budget uploads the same 4 MiB over v6 in full; the spent
// budget then refuses the session's v4 flows too (a v4 echo that passed
// before the upload, the control of the refusal), why says budget for
// the v6 destination, a budget flow event names it, and the session's
// counters count the v6 drops under budget. An entry budget (--budget) on
// a v6 literal stops the upload to it while the session's other v6 entry
// keeps echoing.
func TestE2EDualStackEgressBudget(t *testing.T) {
	e, _ := newDualStackE2E(t)
	const size, budget = 4 << 20, 1 << 20
	sinkAt := "[2001:2:0:1::10]:9000"
	sink6 := netip.MustParseAddrPort(sinkAt)
	sink := startByteSink(t, e, sinkAt)
	e.createNetOnly("bu6", "--allow", sinkAt+"/tcp", "--allow", "198.18.1.10:7", "--egress-budget", "1MiB")
	e.createNetOnly("bc6", "--allow", sinkAt+"/tcp")
	e.createNetOnly("be6", "--allow", sinkAt+"/tcp", "--budget", "1MiB")
	e.update("be6", "--allow", "[2001:2:0:1::11]:7/tcp")
	ns := e.nsPath("bu6")

	e2eExpect(t, e2eTCP(ns, "198.18.1.10:7", e2eReach)) // v4, before the budget is spent
	if _, ok := upload(t, e.nsPath("bc6"), sinkAt, size); !ok {
		t.Errorf("the control session's v6 upload (no budget) did not complete")
	}
	from, ok := upload(t, ns, sinkAt, size)
	if ok {
		t.Fatalf("the budgeted v6 upload of %d bytes completed", size)
	}
	if got := sink.received(from); got > budget || got < budget*3/4 {
		t.Errorf("the server received %d bytes of the budgeted v6 upload, want at most %d and close to it", got, budget)
	}
	if b := e.inspect("bu6").Policy.EgressBudget; b == nil || b.Spent < budget || b.Left != 0 {
		t.Errorf("inspect's egress budget after the v6 upload: %+v", b)
	}
	// One budget: the v6 bytes spent it, the v4 flow is refused.
	e2eExpect(t, e2eTCP(ns, "198.18.1.10:7", e2eRejected))
	e2eRefused6(t, "v6 after the budget", ns, sink6)
	if a := e.why("bu6", sinkAt); a.Reason != "budget" || a.Verdict == api.WhyAllowed {
		t.Errorf("why %s: %+v", sinkAt, a)
	}
	e.eventually("a budget flow event for the v6 sink and budget drops in the counters", func() error {
		if len(e.flowLinesTo("bu6", "budget", sink6.Addr())) == 0 {
			return errors.New("no budget flow event naming " + sink6.Addr().String())
		}
		if n := e.inspect("bu6").Counters.DroppedByReason["budget"]; n == 0 {
			return errors.New("no budget drop in the counters")
		}
		return nil
	})
	if n := len(e.flowLines("bc6", "budget")); n != 0 {
		t.Errorf("the control session has %d budget flow events", n)
	}

	// An entry budget on a v6 literal.
	fromE, ok := upload(t, e.nsPath("be6"), sinkAt, size)
	if ok {
		t.Errorf("the v6 upload under an entry budget completed")
	} else if got := sink.received(fromE); got > budget || got < budget*3/4 {
		t.Errorf("the server received %d bytes under the v6 entry budget, want at most %d and close to it", got, budget)
	}
	if err := world.TCPEcho(e.nsPath("be6"), netip.MustParseAddrPort("[2001:2:0:1::11]:7"), 3*time.Second); err != nil {
		t.Errorf("the session's other v6 entry beside a spent entry budget: %v", err)
	}
	e2eRefused6(t, "v6 entry budget spent", e.nsPath("be6"), sink6)
	if a := e.why("be6", sinkAt); a.Reason != "budget" || a.Entry != sinkAt+"/tcp" {
		t.Errorf("why %s under the spent entry budget: %+v", sinkAt, a)
	}
	if g := e.inspect("be6").Policy.Grants; len(g) != 1 || g[0].Spent[sinkAt+"/tcp"] < budget {
		t.Errorf("the v6 entry budget's grant after the upload: %+v", g)
	}
	sink.closeAll()
	for _, name := range []string{"bu6", "bc6", "be6"} {
		e.cli("session", "rm", name)
	}
	if objs := e.limitObjects(t); len(objs) != 0 {
		t.Errorf("limit objects left after the sessions' removal: %v", objs)
	}
}

// TestE2EDualStackGrantBothFamilies: a 3-connection grant on a name with
// an A and an AAAA record counts the flows of both families in one count:
// v4, v6, v4 pass, then the fourth is refused over v6 and over v4
// (grant-used: the flow event names the v6 address, why says so for it,
// inspect's 0 left, the counters count it), while the control session
// without the grant opens five connections over both. The count survives
// a kill -9.
func TestE2EDualStackGrantBothFamilies(t *testing.T) {
	e, _ := newDualStackE2E(t)
	e.w.DNS.AddRR("dual.e2e.test. 300 IN A 198.18.1.10")
	e.w.DNS.AddRR("dual.e2e.test. 300 IN AAAA 2001:2:0:1::10")
	const entry = "dual.e2e.test:7/tcp"
	v4 := netip.MustParseAddrPort("198.18.1.10:7")
	v6 := netip.MustParseAddrPort("[2001:2:0:1::10]:7")
	g := e.createNetOnly("g6", "--allow", entry, "--connections", "3", "--name-check", "off")
	o := e.createNetOnly("o6", "--allow", entry, "--name-check", "off")
	resolve := func(in api.SessionInfo) {
		t.Helper()
		ns := e.nsPath(in.Name)
		m, err := world.Lookup(ns, netip.AddrPortFrom(netip.MustParseAddr(in.DNS), 53), "dual.e2e.test", dns.TypeA, false, 3*time.Second)
		if err != nil || len(world.AddrsOf(m)) != 1 {
			t.Fatalf("%s: A dual.e2e.test: %v %v", in.Name, m, err)
		}
		m, err = world.Lookup(ns, netip.AddrPortFrom(netip.MustParseAddr(in.DNS6), 53), "dual.e2e.test", dns.TypeAAAA, false, 3*time.Second)
		if err != nil || len(world.Addrs6Of(m)) != 1 {
			t.Fatalf("%s: AAAA dual.e2e.test: %v %v", in.Name, m, err)
		}
	}
	resolve(g)
	resolve(o)
	ns, other := e.nsPath("g6"), e.nsPath("o6")
	for i, dst := range []netip.AddrPort{v4, v6, v4} {
		if err := world.TCPEcho(ns, dst, 3*time.Second); err != nil {
			t.Fatalf("grant use %d of 3 (%s): %v", i+1, dst, err)
		}
	}
	if n := remaining(t, e.inspect("g6"), 0, entry); n != 0 {
		t.Errorf("remaining after v4, v6, v4: %d, want 0", n)
	}
	e.restartWith(syscall.SIGKILL)
	e2eRefused6(t, "the fourth connection, over v6", ns, v6)
	e2eExpect(t, e2eTCP(ns, v4.String(), e2eRejected))
	for i, dst := range []netip.AddrPort{v4, v6, v4, v6, v6} {
		if err := world.TCPEcho(other, dst, 3*time.Second); err != nil {
			t.Errorf("control session, connection %d (%s): %v", i+1, dst, err)
		}
	}
	if a := e.why("g6", v6.String()); a.Reason != "grant-used" || a.Verdict == api.WhyAllowed {
		t.Errorf("why %s: %+v", v6, a)
	}
	if a := e.why("o6", v6.String()); a.Verdict != api.WhyAllowed {
		t.Errorf("why %s for the control session: %+v", v6, a)
	}
	e.eventually("a grant-used flow event naming the v6 address, counted", func() error {
		if len(e.flowLinesTo("g6", "grant-used", v6.Addr())) == 0 {
			return errors.New("no grant-used flow event naming " + v6.Addr().String())
		}
		if n := e.inspect("g6").Counters.DroppedByReason["grant-used"]; n == 0 {
			return errors.New("no grant-used drop in the counters")
		}
		return nil
	})
	// Removing the session removes its chains, its sets (the name's v6
	// address set, addrs6_, with the v4 one) and map elements.
	if objs := strings.Join(e.limitObjects(t), " "); !strings.Contains(objs, "addrs6_") {
		t.Fatalf("positive control: no v6 address set among the limit objects before the removal: %s", objs)
	}
	e.cli("session", "rm", "g6")
	if objs := e.limitObjects(t); len(objs) != 0 {
		t.Errorf("limit objects left after the session's removal: %v", objs)
	}
}

// TestE2EDualStackDropReasons: a dual-stack session's v6 drops carry the
// v4 table's reasons, in the flow events (with the v6 destination) and
// the counters: not-allowed (an unlisted address), special-purpose (a ULA
// server the world routes), resolver (DNS to the allowed literal), denied
// (a v6 deny entry inside an allowed v6 CIDR: every port of it); the
// allowed literal, the control, echoes and leaves no such drop event. why answers the same for the same v6
// destinations (the special-purpose one named by its registry row), and
// allowed for an AAAA-attested address (by its name) and a v6 CIDR entry.
func TestE2EDualStackDropReasons(t *testing.T) {
	e, ula := newDualStackE2E(t)
	in := e.createNetOnly("r6", "--allow", "[2001:2:0:1::11]:7/tcp", "--allow", "web6.e2e.test", "--allow", "2001:2:0:2::/64",
		"--deny", "2001:2:0:2::5", "--name-check", "off")
	ns := e.nsPath("r6")
	lit := netip.MustParseAddrPort("[2001:2:0:1::11]:7")
	unlisted := netip.MustParseAddrPort("[2001:2:0:1::12]:7")
	denied := netip.MustParseAddrPort("[2001:2:0:2::5]:7") // a v6 deny entry drops every port of its range (it takes none)
	if err := world.TCPEcho(ns, lit, 3*time.Second); err != nil {
		t.Fatalf("control: the allowed v6 literal: %v", err)
	}
	e2eRefused6(t, "unlisted", ns, unlisted)
	e2eRefused6(t, "special-purpose", ns, ula)
	e2eRefused6(t, "denied", ns, denied)
	if err := world.UDPEcho(ns, netip.AddrPortFrom(lit.Addr(), 53), time.Second); err == nil {
		t.Error("DNS to the allowed v6 literal passed the resolver rule")
	}
	for _, c := range []struct {
		reason string
		dst    netip.Addr
	}{
		{"not-allowed", unlisted.Addr()}, {"special-purpose", ula.Addr()}, {"resolver", lit.Addr()}, {"denied", denied.Addr()},
	} {
		e.eventually(c.reason+" flow event for "+c.dst.String(), func() error {
			if len(e.flowLinesTo("r6", c.reason, c.dst)) == 0 {
				return errors.New("none")
			}
			if e.inspect("r6").Counters.DroppedByReason[c.reason] == 0 {
				return errors.New("not in the counters")
			}
			return nil
		})
	}
	for _, reason := range []string{"not-allowed", "special-purpose"} {
		if ls := e.flowLinesTo("r6", reason, lit.Addr()); len(ls) != 0 {
			t.Errorf("the allowed literal has %s flow events: %v", reason, ls)
		}
	}

	// why, over the same destinations.
	m, err := world.Lookup(ns, netip.AddrPortFrom(netip.MustParseAddr(in.DNS6), 53), "web6.e2e.test", dns.TypeAAAA, false, 3*time.Second)
	if err != nil || len(world.Addrs6Of(m)) != 1 {
		t.Fatalf("AAAA web6.e2e.test: %v %v", m, err)
	}
	for _, c := range []struct {
		dest, verdict, reason, detail string
	}{
		{"[2001:2:0:1::11]:7/tcp", api.WhyAllowed, "static", "[2001:2:0:1::11]:7/tcp"},
		{"[2001:2:0:1::11]:80", api.WhyRejected, "port", ""},
		{"2001:2:0:1::12", api.WhyRejected, "not-allowed", ""},
		{"[fd99::10]:7", api.WhyRejected, "special-purpose", "fc00::/7"},
		{"[2001:2:0:2::6]:443", api.WhyAllowed, "static", "2001:2:0:2::/64"},
		{"[2001:2:0:2::5]:80", api.WhyRejected, "denied", "2001:2:0:2::5"},
		{"[2001:2:0:1::10]:7", api.WhyAllowed, "attested", "web6.e2e.test"},
		{"[2001:2:0:1::11]:53/udp", api.WhyRejected, "resolver", ""},
		{in.Guest6IP, api.WhyAllowed, "self", ""},
	} {
		a := e.why("r6", c.dest)
		if a.Verdict != c.verdict || a.Reason != c.reason || !strings.Contains(a.Detail, c.detail) {
			t.Errorf("why %s: %+v, want %s %s (detail with %q)", c.dest, a, c.verdict, c.reason, c.detail)
		}
	}

	// A live update revokes v6 entries in its batch: the literal and the
	// name's AAAA-attested address are refused at once, an established v6
	// flow to the literal is cut, the v6 CIDR entry the update kept still
	// allows (why, the control).
	web6 := netip.MustParseAddrPort("[2001:2:0:1::10]:7")
	if err := world.TCPEcho(ns, web6, 3*time.Second); err != nil {
		t.Fatalf("control: the AAAA-attested address before the revoke: %v", err)
	}
	held := e2eDial(t, ns, lit.String())
	if err := e2eEchoRound(held, "before the revoke", 3*time.Second); err != nil {
		t.Fatalf("control: an established v6 flow to the literal before the revoke: %v", err)
	}
	e.update("r6", "--revoke", "[2001:2:0:1::11]:7/tcp", "--revoke", "web6.e2e.test")
	if err := e2eEchoRound(held, "after the revoke", time.Second); err == nil {
		t.Error("an established v6 flow to the revoked literal still echoes (not cut)")
	}
	e2eRefused6(t, "the revoked v6 literal", ns, lit)
	e2eRefused6(t, "the revoked name's AAAA address", ns, web6)
	if a := e.why("r6", "[2001:2:0:2::6]:443"); a.Verdict != api.WhyAllowed {
		t.Errorf("why for the kept v6 CIDR entry after the revoke: %+v", a)
	}
}

// TestE2EDualStackLabAndInbound: a lab target's peer reaches it over v6,
// and the host reaches the port the target names (--inbound-from-host)
// on its v6 address; a third session, the target towards its peer, the
// peer towards the third, and the host towards the peer's (unnamed) port
// are refused, the host's attempt counted as an inbound drop of the peer.
// The v4 twins of the first two are the controls of the address family.
func TestE2EDualStackLabAndInbound(t *testing.T) {
	e, _ := newDualStackE2E(t)
	lab := e.createNetOnly("lab6", "--lab", "--inbound-from-host", "7/tcp")
	tester := e.createNetOnly("tester6", "--lab-peer", "lab6")
	third := e.createNetOnly("third6", "--egress", "public")
	at6 := func(in api.SessionInfo) netip.AddrPort { return netip.MustParseAddrPort("[" + in.Guest6IP + "]:7") }
	for _, s := range []api.SessionInfo{lab, tester, third} {
		e2eServeTCPEcho(t, e.nsPath(s.Name), at6(s))
		e2eServeTCPEcho(t, e.nsPath(s.Name), netip.MustParseAddrPort(s.GuestIP+":7"))
	}
	lns, tns, ons, host := e.nsPath("lab6"), e.nsPath("tester6"), e.nsPath("third6"), e.w.HostPath
	reach := func(what, ns string, dst netip.AddrPort) {
		t.Helper()
		if err := world.TCPEcho(ns, dst, 3*time.Second); err != nil {
			t.Errorf("%s: %s: %v", what, dst, err)
		}
	}
	refused := func(what, ns string, dst netip.AddrPort) {
		t.Helper()
		if err := world.TCPEcho(ns, dst, time.Second); err == nil {
			t.Errorf("%s: %s reached", what, dst)
		}
	}
	reach("control: the peer to its lab target over v4", tns, netip.MustParseAddrPort(lab.GuestIP+":7"))
	reach("the peer to its lab target over v6", tns, at6(lab))
	reach("control: the host to the target's named port over v4", host, netip.MustParseAddrPort(lab.GuestIP+":7"))
	reach("the host to the target's named port over v6", host, at6(lab))
	refused("a third session to the lab target", ons, at6(lab))
	refused("the lab target to its peer", lns, at6(tester))
	refused("the peer to a third session", tns, at6(third))
	before := e.inspect("tester6").Counters.DroppedByReason["inbound"]
	refused("the host to the peer's unnamed port", host, at6(tester))
	e.eventually("the host's v6 attempt counted as the peer's inbound drop", func() error {
		if e.inspect("tester6").Counters.DroppedByReason["inbound"] <= before {
			return errors.New("not counted")
		}
		return nil
	})
	if a := e.why("tester6", at6(lab).String()); a.Verdict != api.WhyAllowed || a.Reason != "lab-peer" {
		t.Errorf("why %s from the peer: %+v", at6(lab), a)
	}
}

// TestE2EDualStackGrantCountsAFlowOnce: the dual-stack grant count, keyed
// by conntrack id, still counts a flow once whatever its packets: a v6 UDP
// flow the server never answers stays new, each datagram passes the grant's
// rule, and with --connections 1 all four of the first flow arrive while a
// second flow from another port (the control that the grant is spent) is
// refused and never arrives.
func TestE2EDualStackGrantCountsAFlowOnce(t *testing.T) {
	e, _ := newDualStackE2E(t)
	grantCountsAFlowOnce(t, e, "[2001:2:0:1::10]:9", "udp6")
}

// TestE2EDualStackAttestCap: the per-session cap on attested elements
// (--max-attested) holds for v6 elements: with 40, a session that resolved
// one name of 32 AAAA records gets SERVFAIL for a second such name (never
// an answer with unattested addresses) and the kernel holds the first 32
// only; the first name resolves again (a refresh adds nothing) and
// another session resolves the second name (the cap is per session).
func TestE2EDualStackAttestCap(t *testing.T) {
	e, _ := newDualStackE2E(t, "--max-attested", "40")
	for i := range 32 {
		e.w.DNS.AddRR(fmt.Sprintf("one.cap6.e2e.test. 60 IN AAAA 2001:2:0:5::%x", i+1))
		e.w.DNS.AddRR(fmt.Sprintf("two.cap6.e2e.test. 60 IN AAAA 2001:2:0:6::%x", i+1))
	}
	capped := e.createNetOnly("cap6", "--allow", "one.cap6.e2e.test", "--allow", "two.cap6.e2e.test", "--name-check", "off")
	other := e.createNetOnly("cao6", "--allow", "two.cap6.e2e.test", "--name-check", "off")
	lookup := func(in api.SessionInfo, name string) *dns.Msg {
		t.Helper()
		m, err := world.Lookup(e.nsPath(in.Name), netip.AddrPortFrom(netip.MustParseAddr(in.DNS6), 53), name, dns.TypeAAAA, true, 3*time.Second)
		if err != nil {
			t.Fatalf("%s: AAAA %s: %v", in.Name, name, err)
		}
		return m
	}
	if got := world.Addrs6Of(lookup(capped, "one.cap6.e2e.test")); len(got) != 32 {
		t.Fatalf("first name: %d addresses, want 32", len(got))
	}
	if m := lookup(capped, "two.cap6.e2e.test"); m.Rcode != dns.RcodeServerFailure || len(world.Addrs6Of(m)) != 0 {
		t.Errorf("second name over the session's cap: rcode %s, %d addresses; want SERVFAIL and none", dns.RcodeToString[m.Rcode], len(world.Addrs6Of(m)))
	}
	if got := e2eNftAttested6(t, e.w, e.d.Prefix, netip.MustParseAddr(capped.Guest6IP)); len(got) != 32 {
		t.Errorf("kernel: %d attested v6 addresses after the refused answer, want the first 32", len(got))
	}
	if got := world.Addrs6Of(lookup(capped, "one.cap6.e2e.test")); len(got) != 32 {
		t.Errorf("first name again: %d addresses, want 32", len(got))
	}
	if got := world.Addrs6Of(lookup(other, "two.cap6.e2e.test")); len(got) != 32 {
		t.Errorf("another session, second name: %d addresses, want 32", len(got))
	}
}
