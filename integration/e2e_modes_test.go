package integration

// Each policy mode end to end, through the real binary: what a session
// reaches and what it does not, each "blocked" next to a positive control
// in the same world.

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/miekg/dns"
)

// Egress none: the namespace has only lo; nothing is reachable, not even
// the DNS proxy. A public session in the same world is the control.
func TestE2EModeNone(t *testing.T) {
	e := newE2E(t)
	sealed := e.create("sealed")
	e.create("open", "--egress", "public")
	if sealed.Egress != "none" || sealed.GuestIP != "" || sealed.HostVeth != "" || !sealed.Sandbox {
		t.Errorf("sealed: egress %q guest %q veth %q sandbox %v, want none with a sandbox and no NIC",
			sealed.Egress, sealed.GuestIP, sealed.HostVeth, sealed.Sandbox)
	}

	links := strings.Split(strings.TrimSpace(e.mustSh("sealed", "ip -o link")), "\n")
	if len(links) != 1 || !strings.Contains(links[0], ": lo:") {
		t.Errorf("sealed: ip -o link shows %q, want only lo", links)
	}
	if routes := strings.TrimSpace(e.mustSh("sealed", "ip route")); routes != "" {
		t.Errorf("sealed: routes %q, want none", routes)
	}
	if e.wget("sealed", "198.18.1.10") {
		t.Error("sealed: wget 198.18.1.10 succeeded")
	}
	if !e.wget("open", "198.18.1.10") {
		t.Error("open (control): wget 198.18.1.10 failed")
	}
	if out, code := e.nslookup("sealed", "api.e2e.test"); code == 0 || slices.Contains(world.NslookupAddrs(out), "198.18.1.10") {
		t.Errorf("sealed: nslookup api.e2e.test succeeded (exit %d): %s", code, out)
	}

	sns, ons := e.nsPath("sealed"), e.nsPath("open")
	e2eExpect(t,
		e2eTCP(sns, "198.18.1.10:7", e2eUnreachable),
		e2eUDP(sns, "198.18.1.10:7", e2eUnreachable),
		e2eHTTP(sns, "198.18.1.11", e2eUnreachable),
		e2eDNS(sns, e2eAnycastDNS, "api.e2e.test", e2eUnreachable),
		e2eTCP(ons, "198.18.1.10:7", e2eReach),
		e2eUDP(ons, "198.18.1.10:7", e2eReach),
		e2eHTTP(ons, "198.18.1.11", e2eReach),
		e2eDNS(ons, e2eAnycastDNS, "api.e2e.test", e2eReach),
	)
	e.expectConsistent("with a sealed and an open session")
}

// Allowlist of names: a name resolves through the anycast proxy and only
// then is its address reachable; an unlisted name is NXDOMAIN and never
// leaves the host; other addresses, the world's DNS server and an allowed
// name answering a special-purpose address stay blocked.
func TestE2EModeAllowlistNames(t *testing.T) {
	e := newE2E(t)
	info := e.create("agent", "--allow", "api.e2e.test", "--allow", "cdn.e2e.test", "--allow", "meta.e2e.test")
	if info.Egress != "allowlist" || info.GuestIP == "" {
		t.Fatalf("agent: egress %q guest %q, want allowlist with an address", info.Egress, info.GuestIP)
	}
	ns := e.nsPath("agent")

	// Before any lookup the addresses are not attested.
	e2eExpect(t, e2eTCP(ns, "198.18.1.10:7", e2eRejected), e2eHTTP(ns, "198.18.2.10", e2eRejected))

	if rc := e.mustSh("agent", "cat /etc/resolv.conf"); !strings.Contains(rc, "nameserver "+e2eAnycastDNS.Addr().String()) {
		t.Errorf("agent: /etc/resolv.conf %q does not name the anycast proxy %s", rc, e2eAnycastDNS.Addr())
	}
	out, code := e.nslookup("agent", "api.e2e.test")
	if code != 0 || !reflect.DeepEqual(world.NslookupAddrs(out), []string{"198.18.1.10"}) {
		t.Fatalf("agent: nslookup api.e2e.test: exit %d, want 198.18.1.10:\n%s", code, out)
	}
	if !strings.Contains(out, e2eAnycastDNS.Addr().String()) {
		t.Errorf("agent: nslookup did not ask the anycast proxy:\n%s", out)
	}
	if !e.w.DNS.QueriedName("api.e2e.test") {
		t.Error("the world's DNS server never got the allowed query for api.e2e.test")
	}
	if !e.wget("agent", "198.18.1.10") {
		t.Error("agent: wget 198.18.1.10 after resolving api.e2e.test failed")
	}
	if rcode, addrs := e2eLookup(t, ns, "cdn.e2e.test"); rcode != dns.RcodeSuccess || !reflect.DeepEqual(addrs, []string{"198.18.2.10"}) {
		t.Errorf("cdn.e2e.test through the proxy: %s %v", dns.RcodeToString[rcode], addrs)
	}

	// The unlisted name: NXDOMAIN from the proxy, never sent upstream.
	out, code = e.nslookup("agent", "other.e2e.test")
	if code == 0 || !strings.Contains(out, "NXDOMAIN") || len(world.NslookupAddrs(out)) > 0 {
		t.Errorf("agent: nslookup other.e2e.test: exit %d, want NXDOMAIN:\n%s", code, out)
	}
	if rcode, _ := e2eLookup(t, ns, "other.e2e.test"); rcode != dns.RcodeNameError {
		t.Errorf("other.e2e.test through the proxy: %s, want NXDOMAIN", dns.RcodeToString[rcode])
	}
	if e.w.DNS.QueriedName("other.e2e.test") {
		t.Error("the world's DNS server got the unlisted name other.e2e.test")
	}
	if e.wget("agent", "198.18.1.11") {
		t.Error("agent: wget 198.18.1.11 (other.e2e.test, never attested) succeeded")
	}

	// An allowed name answering a special-purpose address: filtered.
	if rcode, addrs := e2eLookup(t, ns, "meta.e2e.test"); len(addrs) > 0 {
		t.Errorf("meta.e2e.test through the proxy: %s %v, want no address", dns.RcodeToString[rcode], addrs)
	}

	e2eExpect(t,
		e2eTCP(ns, "198.18.1.10:7", e2eReach),
		e2eUDP(ns, "198.18.1.10:7", e2eReach),
		e2eHTTP(ns, "198.18.2.10", e2eReach),
		e2eTCP(ns, "198.18.1.11:7", e2eRejected),
		e2eHTTP(ns, "198.18.1.11", e2eRejected),
		e2eHTTP(ns, "169.254.169.254", e2eRejected),
		e2eHTTP(ns, "10.99.0.10", e2eRejected),
		e2eDNS(ns, e.w.DNS.Addr(), "api.e2e.test", e2eRejected), // only the proxy answers DNS
		e2eDNS(ns, e2eAnycastDNS, "api.e2e.test", e2eReach),
	)
	got := e2eAttested(e.inspect("agent"))
	slices.Sort(got)
	if !reflect.DeepEqual(got, []string{"198.18.1.10", "198.18.2.10"}) {
		t.Errorf("agent: attested %v, want [198.18.1.10 198.18.2.10]", got)
	}
	if kernel := e2eNftAttested(t, e.w, e.d.Prefix, netip.MustParseAddr(info.GuestIP)); !reflect.DeepEqual(kernel, got) {
		t.Errorf("agent: kernel attested set %v, inspect says %v", kernel, got)
	}
	// inspect carries at least the contract's fields; the attested
	// addresses expire about a TTL (300s) from now; the counters saw the
	// accepted and the dropped probes.
	var raw map[string]any
	if err := json.Unmarshal([]byte(e.cli("session", "inspect", "agent")), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "netns", "guest_ip", "gateway_ip", "host_veth", "egress", "policy", "attested", "counters", "labels"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("inspect: no field %q in %v", k, raw)
		}
	}
	in := e.inspect("agent")
	for _, a := range in.Attested {
		if left := time.Until(a.Expires); left < 200*time.Second || left > 301*time.Second {
			t.Errorf("inspect: attested %s expires in %v, want about 300s", a.IP, left)
		}
	}
	if in.Counters.AcceptedPackets == 0 || in.Counters.DroppedPackets == 0 {
		t.Errorf("inspect: counters %+v, want accepted and dropped packets counted", in.Counters)
	}
	if in.Netns != e.d.Prefix+"-agent" || in.GatewayIP == "" || in.HostVeth == "" {
		t.Errorf("inspect: netns %q gateway %q veth %q", in.Netns, in.GatewayIP, in.HostVeth)
	}
	// `session ls` must not contradict inspect: if it shows an ATTESTED
	// column, the column counts the attested set.
	if col, ok := e2eTableColumn(e.cli("session", "ls"), "agent", "ATTESTED"); ok && col != strconv.Itoa(len(got)) {
		t.Errorf("session ls: ATTESTED %s for agent, but inspect shows %d attested addresses", col, len(got))
	}
	e.expectConsistent("with an allowlist session")
}

// CIDRs and port constraints: a CIDR with a port allows that port only; a
// /32 without one allows everything on the address; a name with a port
// allows that port of its answers only.
func TestE2EModeCIDRAndPort(t *testing.T) {
	e := newE2E(t)
	info := e.create("cidr", "--allow", "198.18.1.0/24:80", "--allow", "198.18.2.10/32", "--allow", "docs.e2e.test:7/tcp")
	if want := []string{"198.18.1.0/24:80", "198.18.2.10", "docs.e2e.test:7/tcp"}; !reflect.DeepEqual(info.Policy.Allow, want) {
		t.Errorf("policy allow %v, want %v", info.Policy.Allow, want)
	}
	ns := e.nsPath("cidr")
	e2eExpect(t,
		e2eHTTP(ns, "198.18.1.10", e2eReach),
		e2eHTTP(ns, "198.18.1.11", e2eReach),
		e2eTCP(ns, "198.18.1.10:7", e2eRejected),
		e2eUDP(ns, "198.18.1.10:7", e2eRejected),
		e2eTCP(ns, "198.18.1.11:7", e2eRejected), // docs.e2e.test not resolved yet
		e2eHTTP(ns, "198.18.2.10", e2eReach),
		e2eTCP(ns, "198.18.2.10:7", e2eReach),
		e2eUDP(ns, "198.18.2.10:7", e2eReach),
		e2eHTTP(ns, "169.254.169.254", e2eRejected),
		e2eHTTP(ns, "10.99.0.10", e2eRejected),
	)
	if !e.wget("cidr", "198.18.1.10") {
		t.Error("cidr: wget 198.18.1.10:80 from the sandbox failed")
	}
	if out, _, code := e.sh("cidr", "echo hi | timeout 3 nc 198.18.1.10 7"); code == 0 && strings.Contains(out, "hi") {
		t.Error("cidr: nc 198.18.1.10 7 from the sandbox was answered")
	}

	if rcode, addrs := e2eLookup(t, ns, "docs.e2e.test"); rcode != dns.RcodeSuccess || !reflect.DeepEqual(addrs, []string{"198.18.1.11"}) {
		t.Fatalf("docs.e2e.test through the proxy: %s %v", dns.RcodeToString[rcode], addrs)
	}
	e2eExpect(t,
		e2eTCP(ns, "198.18.1.11:7", e2eReach),
		e2eUDP(ns, "198.18.1.11:7", e2eRejected), // the name's port is tcp only
		e2eTCP(ns, "198.18.1.10:7", e2eRejected), // and only for its own answer
	)
	if got := e2eAttested(e.inspect("cidr")); !reflect.DeepEqual(got, []string{"198.18.1.11:7/tcp"}) {
		t.Errorf("cidr: attested %v, want [198.18.1.11:7/tcp]", got)
	}
	e.expectConsistent("with a CIDR session")
}

// --scope reduces a URL to its host (and explicit port); --pin resolves the
// hosts once at create: the addresses are reachable without a lookup, are
// in the sandbox's /etc/hosts, and the proxy answers from the pin even when
// the zone changes.
func TestE2EModeScopeAndPin(t *testing.T) {
	e := newE2E(t)
	scoped := e.create("scoped", "--scope", "http://API.e2e.test:80/app/#/login")
	if !reflect.DeepEqual(scoped.Policy.Allow, []string{"api.e2e.test:80"}) {
		t.Errorf("scoped: policy allow %v, want [api.e2e.test:80]", scoped.Policy.Allow)
	}
	sns := e.nsPath("scoped")
	e2eExpect(t, e2eHTTP(sns, "198.18.1.10", e2eRejected))
	if out, code := e.nslookup("scoped", "api.e2e.test"); code != 0 || !slices.Contains(world.NslookupAddrs(out), "198.18.1.10") {
		t.Fatalf("scoped: nslookup api.e2e.test: exit %d\n%s", code, out)
	}
	if !e.wget("scoped", "198.18.1.10") {
		t.Error("scoped: wget 198.18.1.10 after the lookup failed")
	}
	e2eExpect(t,
		e2eHTTP(sns, "198.18.1.10", e2eReach),
		e2eTCP(sns, "198.18.1.10:7", e2eRejected), // the scope's port only
	)
	if out, code := e.nslookup("scoped", "docs.e2e.test"); code == 0 || !strings.Contains(out, "NXDOMAIN") {
		t.Errorf("scoped: nslookup docs.e2e.test: exit %d, want NXDOMAIN\n%s", code, out)
	}

	pinned := e.create("pinned", "--scope", "https://docs.e2e.test/app", "--pin")
	if want := map[string][]string{"docs.e2e.test": {"198.18.1.11"}}; !reflect.DeepEqual(pinned.Policy.Pinned, want) {
		t.Errorf("pinned: policy pinned %v, want %v", pinned.Policy.Pinned, want)
	}
	hosts := e.mustSh("pinned", "cat /etc/hosts")
	found := false
	for _, line := range strings.Split(hosts, "\n") {
		f := strings.Fields(line)
		found = found || (len(f) >= 2 && f[0] == "198.18.1.11" && slices.Contains(f[1:], "docs.e2e.test"))
	}
	if !found {
		t.Errorf("pinned: /etc/hosts has no line for 198.18.1.11 docs.e2e.test:\n%s", hosts)
	}
	pns := e.nsPath("pinned")
	// Reachable at once: the pinned address is a static element.
	e2eExpect(t,
		e2eHTTP(pns, "198.18.1.11", e2eReach),
		e2eTCP(pns, "198.18.1.11:7", e2eReach),
		e2eHTTP(pns, "198.18.1.10", e2eRejected),
	)
	// By name from the sandbox: the body names the pinned address.
	if out, errOut, code := e.sh("pinned", "timeout 3 wget -q -O - http://docs.e2e.test/"); code != 0 || out != "hello from 198.18.1.11\n" {
		t.Errorf("pinned: wget http://docs.e2e.test/: exit %d %q %q", code, out, errOut)
	}

	// The zone changes after create; the pin does not.
	e.w.DNS.AddRR("docs.e2e.test. 300 IN A 198.18.2.10")
	out, code := e.nslookup("pinned", "docs.e2e.test")
	if code != 0 || !reflect.DeepEqual(world.NslookupAddrs(out), []string{"198.18.1.11"}) {
		t.Errorf("pinned: nslookup docs.e2e.test after the zone changed: exit %d, want only the pinned 198.18.1.11\n%s", code, out)
	}
	e2eExpect(t, e2eHTTP(pns, "198.18.2.10", e2eRejected))
	if out, code := e.nslookup("pinned", "api.e2e.test"); code == 0 || !strings.Contains(out, "NXDOMAIN") {
		t.Errorf("pinned: nslookup api.e2e.test: exit %d, want NXDOMAIN\n%s", code, out)
	}
	e.expectConsistent("with a scoped and a pinned session")
}

// Egress public: every public destination, any port and protocol; the
// special-purpose ranges (metadata, private, the pool) still dropped.
func TestE2EModePublic(t *testing.T) {
	e := newE2E(t)
	e.create("open", "--egress", "public")
	peer := e.createNetOnly("peer", "--egress", "public")
	ns := e.nsPath("open")
	e2eServeTCPEcho(t, e.nsPath("peer"), netip.AddrPortFrom(netip.MustParseAddr(peer.GuestIP), 7))
	e2eExpect(t,
		e2eHTTP(ns, "198.18.1.10", e2eReach),
		e2eHTTP(ns, "198.18.2.10", e2eReach),
		e2eTCP(ns, "198.18.1.11:7", e2eReach),
		e2eUDP(ns, "198.18.2.10:7", e2eReach),
		e2ePing(ns, "198.18.1.10", e2eReach),
		e2eHTTP(ns, "169.254.169.254", e2eRejected),
		e2eTCP(ns, "169.254.169.254:7", e2eRejected),
		e2eUDP(ns, "169.254.169.254:7", e2eRejected),
		e2ePing(ns, "169.254.169.254", e2eDropped),
		e2eHTTP(ns, "10.99.0.10", e2eRejected),
		e2eUDP(ns, "10.99.0.10:7", e2eRejected),
		e2eTCP(ns, peer.GuestIP+":7", e2eRejected),          // another session: the pool is blocked
		e2eTCP(e.w.HostPath, peer.GuestIP+":7", e2eDropped), // the host opens nothing into a session by default
	)
	if !e.wget("open", "198.18.1.11") {
		t.Error("open: wget 198.18.1.11 failed")
	}
	for _, ip := range []string{"169.254.169.254", "10.99.0.10"} {
		if e.wget("open", ip) {
			t.Errorf("open: wget %s succeeded", ip)
		}
	}
	if out, code := e.nslookup("open", "cdn.e2e.test"); code != 0 || !slices.Contains(world.NslookupAddrs(out), "198.18.2.10") {
		t.Errorf("open: nslookup cdn.e2e.test: exit %d\n%s", code, out)
	}
	if rcode, addrs := e2eLookup(t, ns, "meta.e2e.test"); len(addrs) > 0 {
		t.Errorf("open: meta.e2e.test through the proxy: %s %v, want the special-purpose answer filtered", dns.RcodeToString[rcode], addrs)
	}
	e.expectConsistent("with public sessions")
}

// Lab: a --lab-peer session reaches the lab target's guest address; a third
// session does not; the lab target opens no connection to its peer; the
// operator's host reaches the lab target on the port it names
// (--inbound-from-host) and no other session.
func TestE2EModeLab(t *testing.T) {
	e := newE2E(t)
	lab := e.create("lab", "--lab", "--inbound-from-host", "7/tcp")
	tester := e.create("tester", "--lab-peer", "lab")
	third := e.create("third", "--egress", "public")
	if lab.Egress != "allowlist" || !lab.Policy.Lab {
		t.Errorf("lab: egress %q lab %v, want allowlist and a lab target", lab.Egress, lab.Policy.Lab)
	}
	if tester.Egress != "allowlist" || !reflect.DeepEqual(tester.Policy.LabPeers, []string{"lab"}) {
		t.Errorf("tester: egress %q lab peers %v, want allowlist with peer lab", tester.Egress, tester.Policy.LabPeers)
	}
	lns, tns, ons := e.nsPath("lab"), e.nsPath("tester"), e.nsPath("third")
	for _, s := range []api.SessionInfo{lab, tester, third} {
		e2eServeTCPEcho(t, e.nsPath(s.Name), netip.MustParseAddrPort(s.GuestIP+":7"))
	}
	e.mustSh("lab", "mkdir -p /tmp/www && echo lab > /tmp/www/index.html && httpd -p 8080 -h /tmp/www")

	e2eExpect(t,
		e2eTCP(tns, lab.GuestIP+":7", e2eReach),
		e2eTCP(ons, lab.GuestIP+":7", e2eRejected),            // a third session
		e2eTCP(lns, tester.GuestIP+":7", e2eRejected),         // the target never opens to its peer
		e2eTCP(tns, third.GuestIP+":7", e2eRejected),          // a peer reaches nothing else of the pool
		e2eTCP(e.w.HostPath, lab.GuestIP+":7", e2eReach),      // the operator's host, on the port the target names
		e2eTCP(e.w.HostPath, tester.GuestIP+":7", e2eDropped), // (the peer's server listens, but names no port)
		e2eTCP(tns, "198.18.1.10:7", e2eRejected),             // only the lab target
		e2eTCP(lns, "198.18.1.10:7", e2eRejected),             // a lab target has no egress
		e2eTCP(ons, "198.18.1.10:7", e2eReach),                // the third session's own egress works
	)
	url := "http://" + lab.GuestIP + ":8080/"
	if out, _, code := e.sh("tester", "timeout 3 wget -q -O - "+url); code != 0 || out != "lab\n" {
		t.Errorf("tester: wget %s from the sandbox: exit %d %q, want lab", url, code, out)
	}
	if out, _, code := e.sh("third", "timeout 3 wget -q -O - "+url); code == 0 {
		t.Errorf("third: wget %s from the sandbox succeeded: %q", url, out)
	}
	e.expectConsistent("with a lab target and its peer")
}

// e2eTableColumn returns the cell of column header in the row of a
// `session ls` table whose first cell is name (header cells are single
// words or "GUEST IP"; cells are separated by two or more spaces).
func e2eTableColumn(table, name, header string) (string, bool) {
	split := func(line string) []string {
		return regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) == 0 {
		return "", false
	}
	idx := slices.Index(split(lines[0]), header)
	if idx < 0 {
		return "", false
	}
	for _, l := range lines[1:] {
		if cells := split(l); len(cells) > idx && cells[0] == name {
			return cells[idx], true
		}
	}
	return "", false
}
