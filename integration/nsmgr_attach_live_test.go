package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// runtimeNetns makes a netns as a container runtime would (named, under
// /run/netns, not of any enforcerd prefix) and removes it at cleanup.
func runtimeNetns(t *testing.T, w *world.World, tag string) string {
	t.Helper()
	name := "rt" + tag + w.ID
	ns, err := world.NewNamedNetns(name)
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	t.Cleanup(func() {
		if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) { // (a test may delete it, as a runtime does)
			t.Errorf("cleanup: delete netns %s: %v", name, err)
		}
	})
	return filepath.Join(world.NetnsDir, name)
}

// Attach builds a session in the runtime's netns: the named interface with
// the /30, the default route, IPv6 off, the host side tagged as attached;
// Delete takes the host side down at once, removes the veth pair in the
// background and leaves the netns; twice is fine.
func TestNsmgrAttach(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	m := newManager(t, w, prefix, "10.20.0.0/16", nil)
	path := runtimeNetns(t, w, "a")

	s, err := m.Attach("c1", nsmgr.Attachment{NetnsPath: path, IfName: "net1"})
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	cleanupSession(t, w, prefix, "c1", s.Slot)
	if !s.Attached || s.IfName != "net1" || s.NetnsPath != path || s.Netns != path || s.HostIface != nsmgr.HostIfaceName(prefix, s.Slot) {
		t.Errorf("Attach = %+v", s)
	}
	host := hostHandle(t, w)
	hl, err := host.LinkByName(s.HostIface)
	if err != nil {
		t.Fatalf("host veth: %v", err)
	}
	if want := prefix + "-c1 attached"; hl.Attrs().Alias != want {
		t.Errorf("host veth alias %q, want %q", hl.Attrs().Alias, want)
	}
	if got := v4Addrs(t, host, hl); !slices.Equal(got, []string{s.Gateway.String() + "/30"}) {
		t.Errorf("host veth addresses %v", got)
	}
	ns, h, release := sessionHandle(t, path)
	gl, err := h.LinkByName("net1")
	if err != nil {
		t.Fatalf("net1 in the runtime's netns: %v", err)
	}
	if got := v4Addrs(t, h, gl); !slices.Equal(got, []string{s.Guest.String() + "/30"}) || !isUp(gl) {
		t.Errorf("net1: addresses %v, up %v", got, isUp(gl))
	}
	routes, err := h.RouteList(gl, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var gw []string
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			gw = append(gw, r.Gw.String())
		}
	}
	if !slices.Equal(gw, []string{s.Gateway.String()}) {
		t.Errorf("default routes via %v, want [%s]", gw, s.Gateway)
	}
	if v := readSysctl(t, ns, "/proc/sys/net/ipv6/conf/net1/disable_ipv6"); v != "1" {
		t.Errorf("net1 disable_ipv6 = %s", v)
	}
	release()

	// A second session in the same netns, under the same interface name or
	// another: refused (the netns is c1's) and leaves nothing.
	before := m.SlotsInUse()
	for _, ifname := range []string{"net1", "net2"} {
		if _, err := m.Attach("c2", nsmgr.Attachment{NetnsPath: path, IfName: ifname}); err == nil || !strings.Contains(err.Error(), "it is the netns of session c1") {
			t.Errorf("Attach %s into c1's netns = %v", ifname, err)
		}
	}
	if n := m.SlotsInUse(); n != before {
		t.Errorf("SlotsInUse after a refused Attach = %d, want %d", n, before)
	}

	// A restarted Manager knows the session by its veth alone.
	b := newManager(t, w, prefix, "10.20.0.0/16", nil)
	got, err := b.Recover()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Name != "c1" || !got[0].Attached || got[0].Slot != s.Slot || got[0].Guest != s.Guest {
		t.Fatalf("Recover = %+v", got)
	}
	if removed, err := b.Reap(map[string]bool{"c1": true}); err != nil || len(removed) != 0 {
		t.Fatalf("Reap keeping c1 = %v, %v", removed, err)
	}
	for i := 0; i < 2; i++ {
		if err := b.Delete("c1", s.Slot); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	// Down at once (no packet passes), deleted in the background.
	if l, err := host.LinkByName(s.HostIface); err == nil && isUp(l) {
		t.Error("host veth still up right after Delete")
	}
	waitLinkGone(t, host, s.HostIface)
	_, h, _ = sessionHandle(t, path)
	if names := linkNames(t, h); !slices.Equal(names, []string{"lo"}) {
		t.Errorf("links left in the runtime's netns: %v", names)
	}
	if !isNetnsFile(path) {
		t.Errorf("Delete removed the runtime's netns %s", path)
	}

	// Reap removes an attached session that is not kept, and only its veth.
	s3, err := b.Attach("c3", nsmgr.Attachment{NetnsPath: path, IfName: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	cleanupSession(t, w, prefix, "c3", s3.Slot)
	removed, err := b.Reap(map[string]bool{})
	if err != nil || !slices.Equal(removed, []string{"link " + s3.HostIface}) {
		t.Errorf("Reap = %v, %v; want [link %s]", removed, err, s3.HostIface)
	}
	if !isNetnsFile(path) {
		t.Errorf("Reap removed the runtime's netns %s", path)
	}
}

// Attach refuses what is not a container's netns, and a bad interface
// name, before it makes anything.
func TestNsmgrAttachRefuses(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	m := newManager(t, w, prefix, "10.20.0.0/16", nil)
	own := mustCreate(t, w, m, "own", true)
	path := runtimeNetns(t, w, "r")
	for _, c := range []struct {
		at   nsmgr.Attachment
		want string
	}{
		{nsmgr.Attachment{NetnsPath: w.HostPath, IfName: "eth0"}, fmt.Sprintf("invalid netns path %q: it is the daemon's own netns, not a container's", w.HostPath)},
		// (Init's netns is refused too, but whether this process may even
		// open /proc/1/ns/net depends on the machine: not tested here.)
		{nsmgr.Attachment{NetnsPath: own.NetnsPath, IfName: "eth9"}, fmt.Sprintf("invalid netns path %q: it is the netns of session %s, not a container's", own.NetnsPath, own.Netns)},
		{nsmgr.Attachment{NetnsPath: "/etc/hostname", IfName: "eth0"}, `invalid netns path "/etc/hostname": not a network namespace`},
		{nsmgr.Attachment{NetnsPath: "run/netns/x", IfName: "eth0"}, `invalid netns path "run/netns/x": want an absolute path`},
		{nsmgr.Attachment{NetnsPath: path, IfName: "eth/0"}, `invalid interface name "eth/0": character '/' not allowed`},
		{nsmgr.Attachment{NetnsPath: path, IfName: "a-very-long-name0"}, `invalid interface name "a-very-long-name0": 17 bytes`},
	} {
		_, err := m.Attach("x", c.at)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Attach(%+v) = %v, want %q", c.at, err, c.want)
		}
	}
	if n := m.SlotsInUse(); n != 1 {
		t.Errorf("SlotsInUse = %d, want 1", n)
	}

	// The netns a session was attached to is a session's too: a second
	// attach there is refused by name, by this Manager and by one that
	// knows the session only from the kernel (a restarted daemon); the
	// same attach into a netns no session holds is made (the control).
	pod, err := m.Attach("pod", nsmgr.Attachment{NetnsPath: path, IfName: "eth0"})
	if err != nil {
		t.Fatalf("Attach pod: %v", err)
	}
	cleanupSession(t, w, prefix, "pod", pod.Slot)
	want := fmt.Sprintf("invalid netns path %q: it is the netns of session pod, not a container's", path)
	if _, err := m.Attach("x", nsmgr.Attachment{NetnsPath: path, IfName: "eth9"}); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Attach into pod's netns = %v, want %q", err, want)
	}
	later := newManager(t, w, prefix, "10.20.0.0/16", nil)
	if _, err := later.Recover(); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if _, err := later.Attach("x", nsmgr.Attachment{NetnsPath: path, IfName: "eth9"}); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("after Recover: Attach into pod's netns = %v, want %q", err, want)
	}
	_, h, release := sessionHandle(t, path)
	if names := linkNames(t, h); !slices.Equal(names, []string{"eth0", "lo"}) && !slices.Equal(names, []string{"lo", "eth0"}) {
		t.Errorf("links in pod's netns after the refusals: %v, want lo and eth0", names)
	}
	release()
	fresh := runtimeNetns(t, w, "q")
	x, err := m.Attach("x", nsmgr.Attachment{NetnsPath: fresh, IfName: "eth9"})
	if err != nil {
		t.Fatalf("Attach into a fresh netns: %v", err)
	}
	cleanupSession(t, w, prefix, "x", x.Slot)
}

// A fault at every step of Attach unwinds: no veth on either side, no slot.
func TestNsmgrAttachFaultAtEveryStep(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	path := runtimeNetns(t, w, "f")
	for _, step := range nsmgr.AttachSteps {
		m := newManager(t, w, prefix, "10.20.0.0/16", func(s string) error {
			if s == step {
				return errInjected
			}
			return nil
		})
		if _, err := m.Attach("f", nsmgr.Attachment{NetnsPath: path, IfName: "eth0"}); !errors.Is(err, errInjected) {
			t.Fatalf("fault at %s: Attach = %v", step, err)
		}
		if n := m.SlotsInUse(); n != 0 {
			t.Errorf("fault at %s: %d slots in use", step, n)
		}
		_, h, release := sessionHandle(t, path)
		if names := linkNames(t, h); !slices.Equal(names, []string{"lo"}) {
			t.Errorf("fault at %s: links left in the runtime's netns: %v", step, names)
		}
		release()
		if names := linkNames(t, hostHandle(t, w)); slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, prefix) }) {
			t.Errorf("fault at %s: host links of the prefix left: %v", step, names)
		}
		m.Close()
	}
}

func isNetnsFile(path string) bool {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return false
	}
	ns.Close()
	return true
}
