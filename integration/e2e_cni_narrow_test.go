package integration

// The network config is the ceiling (issue 27, finding 2): a pod's
// annotations, runtimeConfig and CNI_ARGS only narrow it unless the
// config's podMayWiden names the field, and a lab peer a pod names must be
// a session of the same network config. Driven through libcni with the
// real plugin, as containerd drives it.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/enforcerd/enforcerd/integration/world"
)

func annotated(kv ...string) map[string]any {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return map[string]any{"io.kubernetes.cri.pod-annotations": m}
}

// expectCNIRefused requires err to be CNI error 7 whose msg holds want.
func expectCNIRefused(t *testing.T, what string, err error, want string) {
	t.Helper()
	var ce *types.Error
	if !errors.As(err, &ce) || ce.Code != types.ErrInvalidNetworkConfig || !strings.Contains(ce.Msg, want) {
		t.Errorf("%s: ADD = %#v, want code %d and a msg holding %q", what, err, types.ErrInvalidNetworkConfig, want)
	}
}

func TestE2ECNIConfigIsTheCeiling(t *testing.T) {
	pluginDir := e2eCNIPlugin(t)
	e := newE2E(t)
	public := netip.MustParseAddrPort("198.18.1.10:7") // the simulated internet's echo

	// Egress: a config of allowlist with no entries and a pod annotated
	// egress public. Refused, naming the annotation; nothing is left.
	closed := newCNIRuntime(t, pluginDir, cniConflist("ceil"+e.w.ID, e.d.Socket, `{"egress": "allowlist"}`))
	nsP := runtimeNetns(t, e.w, "p")
	rtP := &libcni.RuntimeConf{ContainerID: "ctr-p-" + e.w.ID, NetNS: nsP, IfName: "eth0",
		CapabilityArgs: annotated("enforcerd.io/egress", "public")}
	before := e.objects()
	_, err := closed.add(rtP)
	expectCNIRefused(t, "egress public over an empty allowlist", err,
		`pod annotation enforcerd.io/egress: egress "public" is wider than the network config's "allowlist"`)
	if _, ok := e.sessionOf(rtP.ContainerID); ok {
		t.Error("a refused ADD made a session")
	}
	if after := e.objects(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a refused ADD left objects:\nbefore %s\nafter  %s", before, after)
	}
	// CNI_ARGS is a pod source too.
	_, err = closed.add(&libcni.RuntimeConf{ContainerID: "ctr-p-" + e.w.ID, NetNS: nsP, IfName: "eth0",
		Args: [][2]string{{"ENFORCERD_ALLOW", "api.e2e.test"}}})
	expectCNIRefused(t, "an allow entry by CNI_ARGS over an empty allowlist", err,
		`CNI_ARGS ENFORCERD_ALLOW: ["api.e2e.test"] is not in the network config's allow []`)
	// A narrowing is taken: no annotation, and the pod reaches nothing.
	if _, err := closed.add(&libcni.RuntimeConf{ContainerID: "ctr-p-" + e.w.ID, NetNS: nsP, IfName: "eth0",
		CapabilityArgs: annotated("enforcerd.io/egress", "allowlist")}); err != nil {
		t.Fatalf("ADD with egress allowlist under allowlist: %v", err)
	}
	if s, _ := e.sessionOf(rtP.ContainerID); s.Egress != "allowlist" {
		t.Errorf("the narrowed pod's egress %q, want allowlist", s.Egress)
	}
	if err := world.TCPEcho(nsP, public, time.Second); err == nil {
		t.Errorf("%s reachable from a pod of an empty allowlist", public)
	}
	// Positive control: a config whose podMayWiden names egress takes the
	// same annotation, and the pod reaches the simulated internet.
	open := newCNIRuntime(t, pluginDir, cniConflistWiden("wide"+e.w.ID, e.d.Socket, `{"egress": "allowlist"}`, `["egress"]`))
	nsQ := runtimeNetns(t, e.w, "q")
	rtQ := &libcni.RuntimeConf{ContainerID: "ctr-q-" + e.w.ID, NetNS: nsQ, IfName: "eth0",
		CapabilityArgs: annotated("enforcerd.io/egress", "public")}
	if _, err := open.add(rtQ); err != nil {
		t.Fatalf("ADD with egress public, the config letting pods widen egress: %v", err)
	}
	if s, _ := e.sessionOf(rtQ.ContainerID); s.Egress != "public" {
		t.Errorf("the widened pod's egress %q, want public", s.Egress)
	}
	if err := world.TCPEcho(nsQ, public, 3*time.Second); err != nil {
		t.Errorf("%s unreachable from a pod its config let widen to public: %v", public, err)
	}
	// ... and that config widens nothing else.
	_, err = open.add(&libcni.RuntimeConf{ContainerID: "ctr-r-" + e.w.ID, NetNS: runtimeNetns(t, e.w, "r"), IfName: "eth0",
		CapabilityArgs: annotated("enforcerd.io/lab", "true")})
	expectCNIRefused(t, "lab true where podMayWiden names only egress", err, `pod annotation enforcerd.io/lab: lab true makes the pod a lab target`)

	// Lab peers: another tenant's lab target made outside CNI is refused
	// even where pods may add lab peers; a lab target made through the
	// same network config is taken, and reached.
	outside := e.createNetOnly("out"+e.w.ID[:4], "--lab")
	e2eServeTCPEcho(t, e.nsPath(outside.Name), netip.MustParseAddrPort(outside.GuestIP+":7"))
	labNet := newCNIRuntime(t, pluginDir, cniConflistWiden("lab"+e.w.ID, e.d.Socket, `{}`, `["lab", "lab_peers"]`))
	nsT := runtimeNetns(t, e.w, "t")
	rtT := &libcni.RuntimeConf{ContainerID: "ctr-t-" + e.w.ID, NetNS: nsT, IfName: "eth0", CapabilityArgs: annotated("enforcerd.io/lab", "true")}
	if _, err := labNet.add(rtT); err != nil {
		t.Fatalf("ADD of a lab target pod: %v", err)
	}
	target, _ := e.sessionOf(rtT.ContainerID)
	e2eServeTCPEcho(t, nsT, netip.MustParseAddrPort(target.GuestIP+":7"))
	nsU := runtimeNetns(t, e.w, "u")
	_, err = labNet.add(&libcni.RuntimeConf{ContainerID: "ctr-u-" + e.w.ID, NetNS: nsU, IfName: "eth0",
		CapabilityArgs: annotated("enforcerd.io/lab-peers", outside.Name)})
	expectCNIRefused(t, "a lab peer made outside CNI", err,
		fmt.Sprintf(`pod annotation enforcerd.io/lab-peers: lab peer %q is not a session of network %q`, outside.Name, "lab"+e.w.ID))
	// A session of another network config is refused the same way.
	_, err = labNet.add(&libcni.RuntimeConf{ContainerID: "ctr-u-" + e.w.ID, NetNS: nsU, IfName: "eth0",
		CapabilityArgs: annotated("enforcerd.io/lab-peers", mustSessionOf(t, e, rtQ.ContainerID))})
	expectCNIRefused(t, "a lab peer of another network", err, `is not a session of network "lab`+e.w.ID+`"`)
	// Without podMayWiden lab_peers the pod may name none at all.
	_, err = closed.add(&libcni.RuntimeConf{ContainerID: "ctr-u-" + e.w.ID, NetNS: nsU, IfName: "eth0",
		CapabilityArgs: annotated("enforcerd.io/lab-peers", target.Name)})
	expectCNIRefused(t, "a lab peer where the config names none", err, `pod annotation enforcerd.io/lab-peers: lab peers ["`+target.Name+`"] are not in the network config's lab_peers []`)
	rtU := &libcni.RuntimeConf{ContainerID: "ctr-u-" + e.w.ID, NetNS: nsU, IfName: "eth0", CapabilityArgs: annotated("enforcerd.io/lab-peers", target.Name)}
	if _, err := labNet.add(rtU); err != nil {
		t.Fatalf("ADD with a lab peer of the same network: %v", err)
	}
	if u, _ := e.sessionOf(rtU.ContainerID); !slices.Equal(u.Policy.LabPeers, []string{target.Name}) {
		t.Errorf("the peer pod's lab peers %v, want [%s]", u.Policy.LabPeers, target.Name)
	}
	if err := world.TCPEcho(nsU, netip.MustParseAddrPort(target.GuestIP+":7"), 3*time.Second); err != nil {
		t.Errorf("the lab target of the same network unreachable from its peer pod: %v", err)
	}
	if err := world.TCPEcho(nsU, netip.MustParseAddrPort(outside.GuestIP+":7"), time.Second); err == nil {
		t.Error("the lab target made outside CNI reachable from the peer pod")
	}
	for _, rt := range []*libcni.RuntimeConf{rtU, rtT} {
		if err := labNet.del(rt); err != nil {
			t.Errorf("DEL %s: %v", rt.ContainerID, err)
		}
	}
	if err := open.del(rtQ); err != nil {
		t.Errorf("DEL q: %v", err)
	}
	if err := closed.del(rtP); err != nil {
		t.Errorf("DEL p: %v", err)
	}
}

func mustSessionOf(t *testing.T, e *e2eEnv, containerID string) string {
	t.Helper()
	s, ok := e.sessionOf(containerID)
	if !ok {
		t.Fatalf("no session of container %s", containerID)
	}
	return s.Name
}
