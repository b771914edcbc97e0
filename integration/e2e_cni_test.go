package integration

// The CNI plugin driven as a runtime drives it: through libcni
// (AddNetworkList, CheckNetworkList, DelNetworkList, GCNetworkList,
// GetStatusNetworkList) with the real enforcerd-cni binary, against the
// real daemon in the test world, into netns the test made as a runtime
// would. The plugin and cache directories are the test's own, never
// /opt/cni or /var/lib/cni.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// e2eCNIPlugin returns a plugin directory holding enforcerd-cni (from
// ENFORCERD_CNI_BIN, else the repo's bin/enforcerd-cni). Missing fails
// under CI=true and skips elsewhere.
func e2eCNIPlugin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("ENFORCERD_CNI_BIN")
	if bin == "" {
		bin = filepath.Join("..", "bin", "enforcerd-cni")
	}
	bin, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		msg := "the CNI test needs the plugin " + bin + " (make build)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + " (CI=true: failing instead of skipping)")
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(dir, "enforcerd-cni")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// cniRuntime is libcni as containerd holds it: the network list, a plugin
// path and a cache directory.
type cniRuntime struct {
	t    *testing.T
	cni  *libcni.CNIConfig
	list *libcni.NetworkConfigList
}

func newCNIRuntime(t *testing.T, pluginDir, conflist string) *cniRuntime {
	t.Helper()
	list, err := libcni.NetworkConfFromBytes([]byte(conflist))
	if err != nil {
		t.Fatalf("conflist: %v\n%s", err, conflist)
	}
	return &cniRuntime{t: t, cni: libcni.NewCNIConfigWithCacheDir([]string{pluginDir}, t.TempDir(), nil), list: list}
}

func (r *cniRuntime) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), e2eCommandTimeout)
}

func (r *cniRuntime) add(rt *libcni.RuntimeConf) (*types100.Result, error) {
	ctx, cancel := r.ctx()
	defer cancel()
	res, err := r.cni.AddNetworkList(ctx, r.list, rt)
	if err != nil {
		return nil, err
	}
	out, err := types100.NewResultFromResult(res)
	if err != nil {
		r.t.Fatalf("ADD result: %v", err)
	}
	return out, nil
}

func (r *cniRuntime) check(rt *libcni.RuntimeConf) error {
	ctx, cancel := r.ctx()
	defer cancel()
	return r.cni.CheckNetworkList(ctx, r.list, rt)
}

func (r *cniRuntime) del(rt *libcni.RuntimeConf) error {
	ctx, cancel := r.ctx()
	defer cancel()
	return r.cni.DelNetworkList(ctx, r.list, rt)
}

func (r *cniRuntime) gc(valid ...types.GCAttachment) error {
	ctx, cancel := r.ctx()
	defer cancel()
	return r.cni.GCNetworkList(ctx, r.list, &libcni.GCArgs{ValidAttachments: valid})
}

func (r *cniRuntime) status() error {
	ctx, cancel := r.ctx()
	defer cancel()
	return r.cni.GetStatusNetworkList(ctx, r.list)
}

func cniConflist(network, socket, policy string) string {
	return cniConflistWiden(network, socket, policy, "[]")
}

// cniConflistWiden is cniConflist whose config lets pods widen the fields
// of podMayWiden (a JSON list).
func cniConflistWiden(network, socket, policy, podMayWiden string) string {
	return fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "plugins": [{"type": "enforcerd-cni", "socket": %q,
	  "capabilities": {"io.kubernetes.cri.pod-annotations": true}, "policy": %s, "podMayWiden": %s}]}`, network, socket, policy, podMayWiden)
}

// sessionOf finds the session of a container through the daemon.
func (e *e2eEnv) sessionOf(containerID string) (api.SessionInfo, bool) {
	for _, s := range e.list() {
		if s.ContainerID == containerID {
			return s, true
		}
	}
	return api.SessionInfo{}, false
}

func TestE2ECNI(t *testing.T) {
	pluginDir := e2eCNIPlugin(t)
	e := newE2E(t)
	network := "enftest"
	// (pods may replace the allow list: container b does)
	rtm := newCNIRuntime(t, pluginDir, cniConflistWiden(network, e.d.Socket, `{"egress": "allowlist", "allow": ["api.e2e.test"]}`, `["allow"]`))
	dnsAddr := e2eAnycastDNS.Addr().String()

	// ADD: the container's interface gets the /30, the result says so.
	nsA := runtimeNetns(t, e.w, "a")
	rtA := &libcni.RuntimeConf{ContainerID: "ctr-a-" + e.w.ID, NetNS: nsA, IfName: "eth0"}
	res, err := rtm.add(rtA)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	info, ok := e.sessionOf(rtA.ContainerID)
	if !ok {
		t.Fatalf("no session carries container %s: %v", rtA.ContainerID, e.list())
	}
	if info.NetnsPath != nsA || info.Netns != nsA || info.IfName != "eth0" || info.Sandbox ||
		info.Labels[api.LabelContainerID] != rtA.ContainerID || info.Labels[api.LabelNetns] != nsA ||
		info.Labels[api.LabelIfName] != "eth0" || info.Labels["enforcerd.io/cni-network"] != network {
		t.Errorf("session of container a: %+v", info)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != info.GuestIP+"/30" || res.IPs[0].Gateway.String() != info.GatewayIP ||
		len(res.Interfaces) != 2 || res.Interfaces[1].Sandbox != nsA || res.Interfaces[1].Name != "eth0" || res.Interfaces[0].Name != info.HostVeth ||
		!slices.Equal(res.DNS.Nameservers, []string{dnsAddr}) || len(res.Routes) != 1 || res.Routes[0].Dst.String() != "0.0.0.0/0" {
		t.Errorf("ADD result: %s", mustJSON(res))
	}
	_, h, release := sessionHandle(t, nsA)
	if l, err := h.LinkByName("eth0"); err != nil || !slices.Equal(v4Addrs(t, h, l), []string{info.GuestIP + "/30"}) {
		t.Errorf("eth0 in the container's netns: %v", err)
	} else if res.Interfaces[1].Mac != l.Attrs().HardwareAddr.String() {
		t.Errorf("ADD result: eth0's mac %q, the kernel's %s", res.Interfaces[1].Mac, l.Attrs().HardwareAddr)
	}
	release()
	// The netns's own resolv.conf (iproute2's /etc/netns/NAME, which
	// podman reads instead of the host's) names only the session's
	// resolver.
	if b, err := os.ReadFile(netnsResolvConf(nsA)); err != nil || !strings.HasSuffix(string(b), "\nnameserver "+dnsAddr+"\n") ||
		strings.Count(string(b), "nameserver") != 1 || strings.Contains(string(b), "search") {
		t.Errorf("%s: %v\n%s", netnsResolvConf(nsA), err, b)
	}

	// DNS through the anycast address; the allowed name is reachable, an
	// address it never resolved to and the metadata address are not.
	m, err := world.Lookup(nsA, e2eAnycastDNS, "api.e2e.test.", dns.TypeA, false, 5*time.Second)
	if err != nil || !slices.Contains(world.AddrsOf(m), netip.MustParseAddr("198.18.1.10")) {
		t.Fatalf("lookup api.e2e.test through %s: %v %v", e2eAnycastDNS, m, err)
	}
	if err := world.TCPEcho(nsA, netip.MustParseAddrPort("198.18.1.10:7"), 3*time.Second); err != nil {
		t.Errorf("allowed api.e2e.test (198.18.1.10:7) unreachable: %v", err)
	}
	for _, dst := range []string{"198.18.1.11:7", "169.254.169.254:80"} {
		if err := world.TCPEcho(nsA, netip.MustParseAddrPort(dst), time.Second); err == nil {
			t.Errorf("forbidden %s reachable from the container", dst)
		}
	}
	if m, err := world.Lookup(nsA, e2eAnycastDNS, "docs.e2e.test.", dns.TypeA, false, 5*time.Second); err == nil && len(world.AddrsOf(m)) > 0 {
		t.Errorf("docs.e2e.test resolved for container a: %v", m)
	}

	// session ls: the table leaves out the attachment labels (a 64
	// character container ID, the netns path), which inspect and --json
	// show; the session's line stays short.
	out, errOut, code := e.run("session", "ls")
	if code != 0 {
		t.Fatalf("session ls: exit %d: %s", code, errOut)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, info.Name+" ") && (!strings.Contains(l, " enforcerd.io/cni-network="+network+" ") || len(l) > 120) {
			t.Errorf("session ls line of the CNI session (%d characters):\n%s", len(l), l)
		}
	}

	// CHECK: the session is as ADD returned it, and so is the container's
	// netns: an interface taken down fails CHECK (and loses its route), one
	// brought back with its route passes again.
	if err := rtm.check(rtA); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	_, h, release = sessionHandle(t, nsA)
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetDown(eth0); err != nil {
		t.Fatal(err)
	}
	if err := rtm.check(rtA); err == nil || !strings.Contains(err.Error(), "eth0 in netns "+nsA+" is down") {
		t.Errorf("CHECK with eth0 down = %v, want it to say eth0 is down", err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		t.Fatal(err)
	}
	if err := rtm.check(rtA); err == nil || !strings.Contains(err.Error(), "has default route none, want via "+info.GatewayIP) {
		t.Errorf("CHECK with no default route = %v, want it to name the missing route", err)
	}
	gw := net.ParseIP(info.GatewayIP)
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: gw}); err != nil {
		t.Fatal(err)
	}
	release()
	if err := rtm.check(rtA); err != nil {
		t.Errorf("CHECK with eth0 restored: %v", err)
	}
	// STATUS: the daemon answers.
	if err := rtm.status(); err != nil {
		t.Errorf("STATUS: %v", err)
	}

	// A pod annotation replaces the network's allow list for its pod (the
	// config's podMayWiden lets it).
	nsB := runtimeNetns(t, e.w, "b")
	rtB := &libcni.RuntimeConf{ContainerID: "ctr-b-" + e.w.ID, NetNS: nsB, IfName: "net1",
		CapabilityArgs: map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{"enforcerd.io/allow": "docs.e2e.test:7, cdn.e2e.test"}}}
	if _, err := rtm.add(rtB); err != nil {
		t.Fatalf("ADD b: %v", err)
	}
	if b, _ := e.sessionOf(rtB.ContainerID); !slices.Equal(b.Policy.Allow, []string{"cdn.e2e.test", "docs.e2e.test:7"}) {
		t.Errorf("container b's policy %v, want the annotation's", b.Policy.Allow)
	}
	if _, err := world.Lookup(nsB, e2eAnycastDNS, "docs.e2e.test.", dns.TypeA, false, 5*time.Second); err != nil {
		t.Errorf("lookup docs.e2e.test in b: %v", err)
	}
	if err := world.TCPEcho(nsB, netip.MustParseAddrPort("198.18.1.11:7"), 3*time.Second); err != nil {
		t.Errorf("b: allowed docs.e2e.test:7 unreachable: %v", err)
	}

	// A bad policy fails ADD with a CNI error naming the value, and leaves
	// nothing: no session, no interface, no rules.
	before := e.objects()
	nsBad := runtimeNetns(t, e.w, "x")
	for _, c := range []struct {
		rt   *libcni.RuntimeConf
		want string
	}{
		{&libcni.RuntimeConf{ContainerID: "ctr-x-" + e.w.ID, NetNS: nsBad, IfName: "eth0",
			CapabilityArgs: map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{"enforcerd.io/allow": "api.e2e.test:99999"}}}, `"api.e2e.test:99999"`},
		{&libcni.RuntimeConf{ContainerID: "ctr-x-" + e.w.ID, NetNS: nsBad, IfName: "eth0",
			Args: [][2]string{{"ENFORCERD_EGRESS", "open"}}}, `"open"`},
		{&libcni.RuntimeConf{ContainerID: "ctr-x-" + e.w.ID, NetNS: nsBad, IfName: "eth0",
			CapabilityArgs: map[string]any{"io.kubernetes.cri.pod-annotations": map[string]string{"enforcerd.io/alow": "x"}}}, "enforcerd.io/alow"},
	} {
		_, err := rtm.add(c.rt)
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != types.ErrInvalidNetworkConfig || !strings.Contains(ce.Msg, c.want) {
			t.Errorf("ADD with a bad policy = %#v, want code %d and a msg naming %s", err, types.ErrInvalidNetworkConfig, c.want)
		}
	}
	if after := e.objects(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a refused ADD left objects:\nbefore %s\nafter  %s", before, after)
	}
	_, h, release = sessionHandle(t, nsBad)
	if names := linkNames(t, h); !slices.Equal(names, []string{"lo"}) {
		t.Errorf("a refused ADD left links in the netns: %v", names)
	}
	release()
	if _, err := os.Stat(filepath.Dir(netnsResolvConf(nsBad))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused ADD left %s: %v", filepath.Dir(netnsResolvConf(nsBad)), err)
	}

	// GC: a session the runtime's cache does not know (its cache was lost)
	// and that is not in the valid list goes; the valid one stays.
	lost := newCNIRuntime(t, pluginDir, cniConflist(network, e.d.Socket, `{"allow": ["api.e2e.test"]}`))
	nsC := runtimeNetns(t, e.w, "c")
	rtC := &libcni.RuntimeConf{ContainerID: "ctr-c-" + e.w.ID, NetNS: nsC, IfName: "eth0"}
	if _, err := lost.add(rtC); err != nil {
		t.Fatalf("ADD c: %v", err)
	}
	if err := rtm.gc(types.GCAttachment{ContainerID: rtA.ContainerID, IfName: "eth0"}, types.GCAttachment{ContainerID: rtB.ContainerID, IfName: "net1"}); err != nil {
		t.Errorf("GC: %v", err)
	}
	if _, ok := e.sessionOf(rtC.ContainerID); ok {
		t.Error("GC left the session of container c, which is not in the valid list")
	}
	if _, err := os.Stat(filepath.Dir(netnsResolvConf(nsC))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("GC left %s: %v", filepath.Dir(netnsResolvConf(nsC)), err)
	}
	for _, id := range []string{rtA.ContainerID, rtB.ContainerID} {
		if _, ok := e.sessionOf(id); !ok {
			t.Errorf("GC removed the session of valid container %s", id)
		}
	}

	// DEL removes the veth (in the background) and the rules but leaves
	// the netns; twice is fine.
	for i := 0; i < 2; i++ {
		if err := rtm.del(rtA); err != nil {
			t.Errorf("DEL #%d: %v", i+1, err)
		}
	}
	if _, ok := e.sessionOf(rtA.ContainerID); ok {
		t.Error("DEL left the session")
	}
	// The host veth is down when DEL returns and deleted in the background
	// (TestE2ECNIDelRetires shows nothing passes meanwhile).
	if l, err := hostHandle(t, e.w).LinkByName(info.HostVeth); err == nil && isUp(l) {
		t.Errorf("DEL left the host veth %s up", info.HostVeth)
	}
	waitLinkGone(t, hostHandle(t, e.w), info.HostVeth)
	if o := e.objects(); slices.Contains(o.NftGuests, info.GuestIP) {
		t.Errorf("DEL left rules of %s: %s", info.GuestIP, o)
	}
	if !isNetnsFile(nsA) {
		t.Error("DEL removed the runtime's netns")
	}
	if _, err := os.Stat(filepath.Dir(netnsResolvConf(nsA))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("DEL left %s: %v", filepath.Dir(netnsResolvConf(nsA)), err)
	}
	_, h, release = sessionHandle(t, nsA)
	if names := linkNames(t, h); !slices.Equal(names, []string{"lo"}) {
		t.Errorf("DEL left links in the container's netns: %v", names)
	}
	release()

	// DEL after the runtime removed the netns.
	if err := netns.DeleteNamed(filepath.Base(nsB)); err != nil {
		t.Fatal(err)
	}
	if err := rtm.del(rtB); err != nil {
		t.Errorf("DEL after the netns is gone: %v", err)
	}
	if _, ok := e.sessionOf(rtB.ContainerID); ok {
		t.Error("DEL after the netns is gone left the session")
	}
	if _, err := os.Stat(filepath.Dir(netnsResolvConf(nsB))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("DEL after the netns is gone left %s: %v", filepath.Dir(netnsResolvConf(nsB)), err)
	}

	// STATUS fails when the daemon does not answer.
	down := newCNIRuntime(t, pluginDir, cniConflist(network, filepath.Join(t.TempDir(), "none.sock"), `{}`))
	var ce *types.Error
	if err := down.status(); !errors.As(err, &ce) || ce.Code != types.ErrPluginNotAvailable {
		t.Errorf("STATUS with no daemon = %#v, want code %d", err, types.ErrPluginNotAvailable)
	}
}

// netnsResolvConf is the resolv.conf iproute2 and podman read for the
// named netns at path.
func netnsResolvConf(path string) string {
	return filepath.Join("/etc/netns", filepath.Base(path), "resolv.conf")
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
