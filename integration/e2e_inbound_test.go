package integration

// Inbound from the host (issue 27 finding 10): from the daemon's netns (the
// node: any process on it, a hostNetwork pod, a kubelet's probe) a TCP
// connection to a session's listener was accepted, although the docs said
// inbound is dropped. Now the host opens nothing into a session unless the
// session names the port (--inbound-from-host); replies to the session's
// own flows, the DNS proxy's answers and the session's egress still pass.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/integration/world"
)

func TestE2EInboundFromHost(t *testing.T) {
	e := newE2E(t)
	closed := e.createNetOnly("closed", "--allow", "api.e2e.test")
	open := e.createNetOnly("open", "--allow", "api.e2e.test", "--inbound-from-host", "8080/tcp", "--inbound-from-host", "5353/udp")
	if !slices.Equal(open.Policy.InboundFromHost, []string{"5353/udp", "8080/tcp"}) || len(closed.Policy.InboundFromHost) != 0 {
		t.Errorf("inspect: inbound_from_host %v and %v, want [5353/udp 8080/tcp] and none", open.Policy.InboundFromHost, closed.Policy.InboundFromHost)
	}
	host := e.w.HostPath // the daemon's netns: the node
	for _, s := range []string{"closed", "open"} {
		guest := e.inspect(s).GuestIP
		for _, port := range []string{"8080", "9090"} {
			e2eServeTCPEcho(t, e.nsPath(s), netip.MustParseAddrPort(guest+":"+port))
		}
		l, err := world.ListenUDP(e.nsPath(s), netip.MustParseAddrPort(guest+":5353"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go world.ServeUDPEcho(l)
	}
	before := e.inspect("closed").Counters.DroppedByReason["inbound"]
	e2eExpect(t,
		// By default the host opens nothing: the attack as found.
		e2eTCP(host, closed.GuestIP+":8080", e2eDropped),
		e2eTCP(host, closed.GuestIP+":9090", e2eDropped),
		// (a datagram the output hook drops fails the sender's write with
		// EPERM at once: any error, nothing delivered)
		e2eUDP(host, closed.GuestIP+":5353", e2eUnreachable),
		// The session named 8080/tcp and 5353/udp: those, and only those.
		e2eTCP(host, open.GuestIP+":8080", e2eReach),
		e2eUDP(host, open.GuestIP+":5353", e2eReach),
		e2eTCP(host, open.GuestIP+":9090", e2eDropped),
	)
	for _, s := range []string{"closed", "open"} {
		ns := e.nsPath(s)
		for _, tcp := range []bool{false, true} {
			m, err := world.Lookup(ns, e2eAnycastDNS, "api.e2e.test", dns.TypeA, tcp, world.ReachTimeout)
			if err != nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
				t.Errorf("%s: look up api.e2e.test (tcp %v) through the proxy: %v %v", s, tcp, err, m)
			}
		}
	}
	// The sessions' own egress, to what the lookups attested, still works.
	e2eExpect(t, e2eHTTP(e.nsPath("closed"), "198.18.1.10", e2eReach), e2eHTTP(e.nsPath("open"), "198.18.1.10", e2eReach))
	// The drops are the session's, reason inbound.
	deadline := time.Now().Add(3 * time.Second)
	for e.inspect("closed").Counters.DroppedByReason["inbound"] <= before && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if after := e.inspect("closed").Counters.DroppedByReason["inbound"]; after <= before {
		t.Errorf("closed: dropped_by_reason.inbound %d after the host's attempts, want more than %d", after, before)
	}

	// An update opens and closes a port; --locked is not needed to test
	// that it is policy: a revoke closes it again.
	e.update("closed", "--inbound-from-host", "9090")
	e2eExpect(t,
		e2eTCP(host, closed.GuestIP+":9090", e2eReach),
		e2eTCP(host, closed.GuestIP+":8080", e2eDropped),
	)
	e.update("closed", "--revoke-inbound-from-host", "9090")
	e2eExpect(t, e2eTCP(host, closed.GuestIP+":9090", e2eDropped))
	if msg := e.expectFail(1, "session", "create", "bad", "--network-only", "--allow", "api.e2e.test", "--inbound-from-host", "80/icmp"); !strings.Contains(msg, `inbound from host "80/icmp": protocol "icmp": want tcp or udp`) {
		t.Errorf("--inbound-from-host 80/icmp: %q", msg)
	}
	e.expectConsistent("with inbound ports")
}

// The kubelet path: a CNI network config's inboundFromHost lets the node's
// probes into every pod of that network on the named port, and only there;
// a pod of a network config without it is closed to the node; a pod
// annotation cannot set it (the operator's alone).
func TestE2ECNIInboundFromHost(t *testing.T) {
	pluginDir := e2eCNIPlugin(t)
	e := newE2E(t)
	conflist := func(network, extra string) string {
		return fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "plugins": [{"type": "enforcerd-cni", "socket": %q,
		  "capabilities": {"io.kubernetes.cri.pod-annotations": true}, "policy": {"egress": "allowlist"}%s}]}`, network, e.d.Socket, extra)
	}
	probed := newCNIRuntime(t, pluginDir, conflist("probed", `, "inboundFromHost": ["8080/tcp"]`))
	plain := newCNIRuntime(t, pluginDir, conflist("plain", ""))
	host := e.w.HostPath
	for _, c := range []struct {
		rt   *cniRuntime
		tag  string
		want map[string]e2eWant
	}{
		{probed, "p", map[string]e2eWant{"8080": e2eReach, "9090": e2eDropped}},
		{plain, "q", map[string]e2eWant{"8080": e2eDropped, "9090": e2eDropped}},
	} {
		ns := runtimeNetns(t, e.w, c.tag)
		rt := &libcni.RuntimeConf{ContainerID: "ctr-" + c.tag + "-" + e.w.ID, NetNS: ns, IfName: "eth0"}
		if _, err := c.rt.add(rt); err != nil {
			t.Fatalf("ADD %s: %v", c.tag, err)
		}
		t.Cleanup(func() { c.rt.del(rt) })
		info, ok := e.sessionOf(rt.ContainerID)
		if !ok {
			t.Fatalf("no session for %s", rt.ContainerID)
		}
		for port, want := range c.want {
			e2eServeTCPEcho(t, ns, netip.MustParseAddrPort(info.GuestIP+":"+port))
			e2eExpect(t, e2eTCP(host, info.GuestIP+":"+port, want))
		}
	}
	// An annotation naming it is refused, not applied.
	ns := runtimeNetns(t, e.w, "r")
	rt := &libcni.RuntimeConf{ContainerID: "ctr-r-" + e.w.ID, NetNS: ns, IfName: "eth0",
		CapabilityArgs: map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{"enforcerd.io/inbound-from-host": "9090"}}}
	if _, err := plain.add(rt); err == nil || !strings.Contains(err.Error(), "inbound-from-host") {
		t.Errorf("ADD with an inbound-from-host annotation: %v, want refused naming it", err)
		plain.del(rt)
	}
}
