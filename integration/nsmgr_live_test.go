package integration

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Live tests of nsmgr against the kernel, inside a test world: w.Host plays
// the daemon's netns. Each test uses its own prefix ("n" + run id), so the
// session netns under /run/netns never collide with another run's, and
// removes every object by exact name in t.Cleanup.

var errInjected = errors.New("injected failure")

// nsmgrPrefix returns a prefix unique to this world (6 characters).
func nsmgrPrefix(t testing.TB, w *world.World) string {
	return freshPrefix(t, "n"+w.ID[:5])
}

// freshPrefix fails the test if objects of prefix exist already (left by a
// crashed run whose id shared these characters).
func freshPrefix(t testing.TB, prefix string) string {
	t.Helper()
	if left := netnsFiles(t, prefix); len(left) > 0 {
		t.Fatalf("netns of prefix %s exist before the test: %v", prefix, left)
	}
	return prefix
}

// newManager returns a Manager on w.Host and removes, at cleanup, every
// session netns of prefix (by exact name) and checks nothing is left.
func newManager(t *testing.T, w *world.World, prefix string, pool string, fault func(string) error) *nsmgr.Manager {
	t.Helper()
	return newManagerPrepared(t, w, prefix, pool, fault, 0)
}

// newManagerPrepared is newManager with a pool of prepared netns of size
// prepared (0: none), started and filled before it returns. Close, at
// cleanup, must remove the pool (checkNoLeftovers sees its entries).
func newManagerPrepared(t *testing.T, w *world.World, prefix string, pool string, fault func(string) error, prepared int) *nsmgr.Manager {
	t.Helper()
	m, err := nsmgr.New(nsmgr.Config{
		Prefix:      prefix,
		Pool:        netip.MustParsePrefix(pool),
		HostNS:      w.Host,
		Fault:       fault,
		EtcNetnsDir: t.TempDir(), // the real /etc/netns is the e2e tests' (TestE2ENetworkOnlyResolvConf)
		Prepared:    prepared,
	})
	if err != nil {
		t.Fatalf("nsmgr.New: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	if prepared > 0 {
		m.StartPrepared()
		waitPrepared(t, m, prepared)
	}
	return m
}

// waitPrepared waits until the Manager's pool holds n ready netns.
func waitPrepared(t testing.TB, m *nsmgr.Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := m.PreparedStats()
		if st.Ready == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("prepared netns: %+v after 10s, want %d ready", st, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// cleanupSession removes a session's netns file by exact name (and its host
// veth, in case something still holds the netns) when the test ends,
// without going through the code under test.
func cleanupSession(t testing.TB, w *world.World, prefix, name string, slot int) {
	t.Helper()
	cleanupNetnsFile(t, filepath.Join(world.NetnsDir, nsmgr.NetnsName(prefix, name)))
	if slot >= 0 {
		t.Cleanup(func() {
			h := hostHandle(t, w)
			if l, err := h.LinkByName(nsmgr.HostIfaceName(prefix, slot)); err == nil {
				h.LinkDel(l)
			}
		})
	}
}

// cleanupNetnsFile unmounts and removes a netns file when the test ends.
func cleanupNetnsFile(t testing.TB, path string) {
	t.Cleanup(func() {
		for i := 0; i < 4; i++ {
			if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
				break
			}
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cleanup: remove %s: %v", path, err)
		}
	})
}

// checkNoLeftovers fails the test if a netns file of prefix is left at the
// end (registered first, so it runs after every other cleanup of the test
// but before the world is removed).
func checkNoLeftovers(t *testing.T, prefix string) {
	t.Helper()
	t.Cleanup(func() {
		if left := netnsFiles(t, prefix); len(left) > 0 {
			t.Errorf("netns left after cleanup: %v", left)
		}
	})
}

func netnsFiles(t testing.TB, prefix string) []string {
	t.Helper()
	entries, err := os.ReadDir(world.NetnsDir)
	if err != nil {
		t.Fatalf("list %s: %v", world.NetnsDir, err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix+"-") {
			out = append(out, e.Name())
		}
	}
	return out
}

func hostHandle(t testing.TB, w *world.World) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", w.HostName, err)
	}
	t.Cleanup(h.Close)
	return h
}

// sessionHandle opens the session's netns and a netlink handle in it. The
// returned release closes both (also run at cleanup; safe to call twice):
// they keep the netns, and its veth, alive.
func sessionHandle(t *testing.T, path string) (netns.NsHandle, *netlink.Handle, func()) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatalf("open netns %s: %v", path, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		t.Fatalf("netlink handle in %s: %v", path, err)
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			h.Close()
			ns.Close()
		})
	}
	t.Cleanup(release)
	return ns, h, release
}

func readSysctl(t *testing.T, ns netns.NsHandle, path string) string {
	t.Helper()
	var v []byte
	err := nsmgr.Do(ns, func() (err error) {
		v, err = os.ReadFile(path)
		return err
	})
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return strings.TrimSpace(string(v))
}

func linkNames(t *testing.T, h *netlink.Handle) []string {
	t.Helper()
	links, err := h.LinkList()
	if err != nil {
		t.Fatalf("list links: %v", err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	return names
}

func v4Addrs(t *testing.T, h *netlink.Handle, link netlink.Link) []string {
	t.Helper()
	addrs, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatalf("list addresses of %s: %v", link.Attrs().Name, err)
	}
	var out []string
	for _, a := range addrs {
		out = append(out, a.IPNet.String())
	}
	return out
}

func isUp(l netlink.Link) bool { return l.Attrs().RawFlags&unix.IFF_UP != 0 }

func mounted(t *testing.T, path string) bool {
	t.Helper()
	return mountInfo(t, path) != nil
}

// mountInfo returns the fields of the last mountinfo line whose mount point
// is path, or nil.
func mountInfo(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatalf("read mountinfo: %v", err)
	}
	var found []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			found = f
		}
	}
	return found
}

// waitLinkGone polls until the host link is gone (the kernel removes the
// veth of a deleted netns in the background).
func waitLinkGone(t *testing.T, h *netlink.Handle, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := h.LinkByName(name); err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("link %s still exists 10s after its netns was deleted", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustCreate(t *testing.T, w *world.World, m *nsmgr.Manager, name string, nic bool) nsmgr.Session {
	t.Helper()
	s, err := m.Create(name, nic)
	if err != nil {
		t.Fatalf("Create(%s, %v): %v", name, nic, err)
	}
	cleanupSession(t, w, m.Prefix(), name, s.Slot)
	return s
}

func TestNsmgrCreateWithNIC(t *testing.T) { testCreateWithNIC(t, false) }

// The same on the path of a kernel before 6.3 (Debian 12's 6.1), which
// echoes no created link: both veth ends are then looked up by name.
func TestNsmgrCreateWithNICNoLinkEcho(t *testing.T) { testCreateWithNIC(t, true) }

func testCreateWithNIC(t *testing.T, noEcho bool) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	m, err := nsmgr.New(nsmgr.Config{
		Prefix:      prefix,
		Pool:        netip.MustParsePrefix("10.20.0.0/16"),
		HostNS:      w.Host,
		EtcNetnsDir: t.TempDir(),
		NoLinkEcho:  noEcho,
	})
	if err != nil {
		t.Fatalf("nsmgr.New: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})

	s := mustCreate(t, w, m, "s1", true)
	want := nsmgr.Session{
		Name: "s1", Netns: prefix + "-s1", NetnsPath: "/run/netns/" + prefix + "-s1",
		Slot: 0, HostIface: prefix + "0h",
		Subnet:  netip.MustParsePrefix("10.20.0.0/30"),
		Gateway: netip.MustParseAddr("10.20.0.1"), Guest: netip.MustParseAddr("10.20.0.2"),
	}
	if s != want {
		t.Fatalf("Create = %+v\nwant %+v", s, want)
	}
	if !mounted(t, s.NetnsPath) {
		t.Fatalf("%s is not a mount point", s.NetnsPath)
	}

	// Guest side.
	ns, gh, release := sessionHandle(t, s.NetnsPath)
	if got := linkNames(t, gh); !slices.Equal(got, []string{"lo", "eth0"}) {
		t.Fatalf("links in session netns = %v, want [lo eth0]", got)
	}
	eth0, err := gh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if eth0.Type() != "veth" || !isUp(eth0) {
		t.Errorf("eth0: type %s up %v, want an up veth", eth0.Type(), isUp(eth0))
	}
	if got := v4Addrs(t, gh, eth0); !slices.Equal(got, []string{"10.20.0.2/30"}) {
		t.Errorf("eth0 addresses = %v, want [10.20.0.2/30]", got)
	}
	lo, err := gh.LinkByName("lo")
	if err != nil || !isUp(lo) {
		t.Errorf("lo is not up: %v", err)
	}
	routes, err := gh.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var defaultVia string
	for _, r := range routes {
		if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
			defaultVia = r.Gw.String()
		}
	}
	if defaultVia != "10.20.0.1" {
		t.Errorf("default route via %q, want 10.20.0.1 (routes %v)", defaultVia, routes)
	}
	for _, iface := range []string{"all", "default", "eth0", "lo"} {
		if v := readSysctl(t, ns, "/proc/sys/net/ipv6/conf/"+iface+"/disable_ipv6"); v != "1" {
			t.Errorf("session netns: %s disable_ipv6 = %s, want 1", iface, v)
		}
	}
	if addrs, _ := gh.AddrList(nil, netlink.FAMILY_V6); len(addrs) != 0 {
		t.Errorf("session netns has IPv6 addresses: %v", addrs)
	}

	// Host side.
	hh := hostHandle(t, w)
	host, err := hh.LinkByName(prefix + "0h")
	if err != nil {
		t.Fatalf("host veth: %v", err)
	}
	if !isUp(host) || host.Attrs().Alias != prefix+"-s1" {
		t.Errorf("host veth: up %v alias %q, want up with alias %s-s1", isUp(host), host.Attrs().Alias, prefix)
	}
	if got := v4Addrs(t, hh, host); !slices.Equal(got, []string{"10.20.0.1/30"}) {
		t.Errorf("host veth addresses = %v, want [10.20.0.1/30]", got)
	}
	if v := readSysctl(t, w.Host, "/proc/sys/net/ipv6/conf/"+prefix+"0h/disable_ipv6"); v != "1" {
		t.Errorf("host veth disable_ipv6 = %s, want 1", v)
	}
	// ARP answers only for the veth's own address (TestAttackARPOracle
	// performs the attack).
	for name, want := range map[string]string{"arp_ignore": "1", "arp_announce": "2"} {
		if v := readSysctl(t, w.Host, "/proc/sys/net/ipv4/conf/"+prefix+"0h/"+name); v != want {
			t.Errorf("host veth %s = %s, want %s", name, v, want)
		}
	}
	if v6, _ := hh.AddrList(host, netlink.FAMILY_V6); len(v6) != 0 {
		t.Errorf("host veth has IPv6 addresses: %v", v6)
	}

	// No firewall here: the guest reaches its gateway.
	if err := world.Ping(s.NetnsPath, s.Gateway, 2*time.Second); err != nil {
		t.Errorf("ping gateway from the session: %v", err)
	}

	// The next session takes the next slot.
	s2 := mustCreate(t, w, m, "s2", true)
	if s2.Slot != 1 || s2.Guest.String() != "10.20.0.6" || s2.HostIface != prefix+"1h" {
		t.Errorf("second session = %+v, want slot 1, guest 10.20.0.6", s2)
	}
	if _, err := m.Create("s1", true); err == nil {
		t.Error("Create of an existing session succeeded")
	}
	if got := m.Sessions(); len(got) != 2 || got[0].Name != "s1" || got[1].Name != "s2" {
		t.Errorf("Sessions = %+v", got)
	}

	// Delete: the netns file goes at once, the veth in the background;
	// deleting twice is fine.
	for i := 0; i < 2; i++ {
		if err := m.Delete("s1", 0); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if _, err := os.Stat(s.NetnsPath); !errors.Is(err, os.ErrNotExist) || mounted(t, s.NetnsPath) {
		t.Fatalf("netns file after Delete: %v (mounted %v)", err, mounted(t, s.NetnsPath))
	}
	release() // our own handles would keep the netns (and the veth) alive
	waitLinkGone(t, hh, prefix+"0h")
	if got := m.SlotsInUse(); got != 1 {
		t.Errorf("SlotsInUse = %d, want 1", got)
	}
	// Next-fit: the freed slot 0 is not reused before the cursor wraps.
	if s3 := mustCreate(t, w, m, "s3", true); s3.Slot != 2 {
		t.Errorf("after deleting slot 0, Create got slot %d, want 2", s3.Slot)
	}
	if err := m.Delete("s2", 0); err == nil {
		t.Error("Delete with the wrong slot succeeded")
	}
	for _, n := range []struct {
		name string
		slot int
	}{{"s2", 1}, {"s3", 2}, {"s3", 2}, {"never", -1}} {
		if err := m.Delete(n.name, n.slot); err != nil {
			t.Errorf("Delete(%s, %d): %v", n.name, n.slot, err)
		}
	}
}

func TestNsmgrCreateWithoutNIC(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	m := newManager(t, w, prefix, "10.20.0.0/16", nil)

	s := mustCreate(t, w, m, "quiet", false)
	if s.Slot != -1 || s.HostIface != "" || s.Guest.IsValid() || s.Gateway.IsValid() {
		t.Fatalf("Create without NIC = %+v, want no slot and no addresses", s)
	}
	ns, gh, _ := sessionHandle(t, s.NetnsPath)
	if got := linkNames(t, gh); !slices.Equal(got, []string{"lo"}) {
		t.Fatalf("links = %v, want only lo", got)
	}
	lo, _ := gh.LinkByName("lo")
	if lo == nil || !isUp(lo) {
		t.Error("lo is not up")
	}
	if routes, _ := gh.RouteList(nil, netlink.FAMILY_V4); len(routes) != 0 {
		t.Errorf("routes = %v, want none", routes)
	}
	if v := readSysctl(t, ns, "/proc/sys/net/ipv6/conf/all/disable_ipv6"); v != "1" {
		t.Errorf("all.disable_ipv6 = %s", v)
	}
	if m.SlotsInUse() != 0 {
		t.Errorf("SlotsInUse = %d, want 0", m.SlotsInUse())
	}
	for _, l := range linkNames(t, hostHandle(t, w)) {
		if strings.HasPrefix(l, prefix) {
			t.Errorf("host link %s exists for a session without NIC", l)
		}
	}
	if err := m.Delete("quiet", -1); err != nil {
		t.Fatal(err)
	}
	if err := m.Delete("quiet", -1); err != nil {
		t.Fatal(err)
	}
}

// A failure injected at every step leaves nothing behind: no netns file, no
// mount, no link, no slot.
func TestNsmgrCreateFaultAtEveryStep(t *testing.T) { testCreateFaultAtEveryStep(t, 0) }

// The same when the netns is claimed from the pool of prepared ones: the
// claimed netns goes too (the pool's other entries go at Close).
func TestNsmgrCreateFaultAtEveryStepPrepared(t *testing.T) { testCreateFaultAtEveryStep(t, 1) }

func testCreateFaultAtEveryStep(t *testing.T, prepared int) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	hh := hostHandle(t, w)
	cases := []struct {
		step string
		nic  bool
	}{}
	for _, step := range nsmgr.CreateSteps {
		cases = append(cases, struct {
			step string
			nic  bool
		}{step, true})
	}
	for _, step := range []string{nsmgr.StepCreateNetns, nsmgr.StepDisableIPv6, nsmgr.StepLoUp} {
		cases = append(cases, struct {
			step string
			nic  bool
		}{step, false})
	}
	for i, c := range cases {
		var (
			seen []string
			mu   sync.Mutex
		)
		m := newManagerPrepared(t, w, prefix, "10.20.0.0/16", func(step string) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, step)
			if step == c.step {
				return errInjected
			}
			return nil
		}, prepared)
		name := fmt.Sprintf("f%d", i)
		path := m.NetnsPath(name)
		cleanupSession(t, w, prefix, name, 0)
		_, err := m.Create(name, c.nic)
		if !errors.Is(err, errInjected) {
			t.Fatalf("step %s (nic %v): Create = %v, want the injected error", c.step, c.nic, err)
		}
		if !strings.Contains(err.Error(), "create session "+name+": "+c.step+": injected failure") {
			t.Errorf("step %s: error %q does not name the session and the step", c.step, err)
		}
		if seen[len(seen)-1] != c.step {
			t.Errorf("step %s: fault seam saw %v", c.step, seen)
		}
		if st := m.PreparedStats(); prepared > 0 && c.step != nsmgr.StepAllocateSlot && c.step != nsmgr.StepCreateNetns && st.Claimed != 1 {
			t.Errorf("step %s: %+v, want the netns claimed from the pool", c.step, st)
		}
		if prepared > 0 {
			waitPrepared(t, m, prepared) // the refill ran beside the unwind; its entry is not the claimed one
			// Every Manager of this loop keeps its pool until cleanup; the
			// claimed entry's pool name goes in the background.
			waitPreparedFiles(t, prefix, prepared*(i+1))
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("step %s: netns file left: %v", c.step, err)
		}
		if mounted(t, path) {
			t.Errorf("step %s: mount left at %s", c.step, path)
		}
		for _, l := range linkNames(t, hh) {
			if strings.HasPrefix(l, prefix) {
				t.Errorf("step %s: link %s left in the host netns", c.step, l)
			}
		}
		if n := m.SlotsInUse(); n != 0 {
			t.Errorf("step %s: %d slots in use after the unwind", c.step, n)
		}
		if got := m.Sessions(); len(got) != 0 {
			t.Errorf("step %s: sessions %v after the unwind", c.step, got)
		}
		// The same name can be created afterwards (nothing blocks it).
		m2 := newManager(t, w, prefix, "10.20.0.0/16", nil)
		if _, err := m2.Create(name, c.nic); err != nil {
			t.Errorf("step %s: re-create after the unwind: %v", c.step, err)
		}
		if err := m2.Delete(name, map[bool]int{true: 0, false: -1}[c.nic]); err != nil {
			t.Errorf("step %s: delete: %v", c.step, err)
		}
		waitLinkGone(t, hh, prefix+"0h")
	}
}

// A slot whose old veth lingers (something holds the deleted netns) is not
// handed out again until the veth is gone; Reap removes such a veth.
func TestNsmgrQuarantineAndLingeringVeth(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	hh := hostHandle(t, w)
	m := newManager(t, w, prefix, "10.20.0.0/28", nil) // 3 slots
	a := mustCreate(t, w, m, "a", true)
	mustCreate(t, w, m, "b", true)
	mustCreate(t, w, m, "c", true)

	holder, err := netns.GetFromPath(a.NetnsPath) // keeps a's netns, and its veth, alive
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := m.Delete("a", a.Slot); err != nil {
		t.Fatal(err)
	}
	_, err = m.Create("d", true)
	var ex *nsmgr.ExhaustedError
	if !errors.As(err, &ex) || ex.Lingering != 1 {
		t.Fatalf("Create while slot 0's veth lingers = %v, want *ExhaustedError with 1 lingering", err)
	}
	const want = "create session d: address pool 10.20.0.0/28 exhausted: 2 of 3 session slots in use and 1 waiting for the kernel to remove an old interface"
	if err.Error() != want {
		t.Errorf("error = %q\nwant    %q", err, want)
	}
	if _, err := hh.LinkByName(a.HostIface); err != nil {
		t.Fatalf("the held veth should linger: %v", err)
	}

	removed, err := m.Reap(map[string]bool{"b": true, "c": true})
	if err != nil {
		t.Fatalf("Reap: %v", err)
	}
	if !slices.Equal(removed, []string{"link " + a.HostIface}) {
		t.Errorf("Reap removed %v, want [link %s]", removed, a.HostIface)
	}
	if _, err := hh.LinkByName(a.HostIface); err == nil {
		t.Fatal("Reap left the lingering veth")
	}
	d := mustCreate(t, w, m, "d", true)
	if d.Slot != 0 {
		t.Errorf("Create after the veth is gone got slot %d, want 0", d.Slot)
	}
}

// A session name reused while its old veth lingers: Recover gives the
// session its current veth (matched by the peer's netns id), and Reap
// removes the old one although the session is kept.
func TestNsmgrNameReuseWhileOldVethLingers(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	hh := hostHandle(t, w)
	m := newManager(t, w, prefix, "10.20.0.0/28", nil)
	old := mustCreate(t, w, m, "a", true)
	holder, err := netns.GetFromPath(old.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := m.Delete("a", old.Slot); err != nil {
		t.Fatal(err)
	}
	cur := mustCreate(t, w, m, "a", true)
	if cur.Slot == old.Slot {
		t.Fatalf("re-created session took slot %d, whose veth lingers", cur.Slot)
	}
	for _, name := range []string{old.HostIface, cur.HostIface} {
		l, err := hh.LinkByName(name)
		if err != nil || l.Attrs().Alias != prefix+"-a" {
			t.Fatalf("veth %s: %v (alias %v)", name, err, l)
		}
	}
	fresh := newManager(t, w, prefix, "10.20.0.0/28", nil)
	got, err := fresh.Recover()
	if err != nil || len(got) != 1 || got[0] != cur {
		t.Fatalf("Recover = %+v, %v; want [%+v]", got, err, cur)
	}
	removed, err := fresh.Reap(map[string]bool{"a": true})
	if err != nil || !slices.Equal(removed, []string{"link " + old.HostIface}) {
		t.Fatalf("Reap = %v, %v; want [link %s]", removed, err, old.HostIface)
	}
	if _, err := hh.LinkByName(cur.HostIface); err != nil {
		t.Fatalf("current veth removed: %v", err)
	}
	if err := fresh.Delete("a", cur.Slot); err != nil {
		t.Fatal(err)
	}
}

// A fresh Manager recovers the live sessions and never hands out their slots.
func TestNsmgrRecover(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	a := newManager(t, w, prefix, "10.20.0.0/28", nil)
	s1 := mustCreate(t, w, a, "s1", true)  // slot 0
	s2 := mustCreate(t, w, a, "s2", true)  // slot 1
	s3 := mustCreate(t, w, a, "s3", false) // no NIC
	if err := a.Delete("s2", s2.Slot); err != nil {
		t.Fatal(err)
	}
	a.Close()
	waitLinkGone(t, hostHandle(t, w), s2.HostIface) // keeps the slots below deterministic

	b := newManager(t, w, prefix, "10.20.0.0/28", nil)
	got, err := b.Recover()
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if len(got) != 2 || got[0] != s1 || got[1] != s3 {
		t.Fatalf("Recover = %+v\nwant [%+v %+v]", got, s1, s3)
	}
	if n := b.SlotsInUse(); n != 1 {
		t.Errorf("SlotsInUse after Recover = %d, want 1", n)
	}
	var slots []int
	for _, name := range []string{"x", "y"} {
		s := mustCreate(t, w, b, name, true)
		slots = append(slots, s.Slot)
	}
	slices.Sort(slots)
	if !slices.Equal(slots, []int{1, 2}) {
		t.Errorf("new sessions got slots %v, want [1 2] (slot 0 is live)", slots)
	}
	var ex *nsmgr.ExhaustedError
	if _, err := b.Create("z", true); !errors.As(err, &ex) {
		t.Errorf("Create on a full pool = %v, want *ExhaustedError", err)
	}
	if _, err := b.Create("s1", true); err == nil {
		t.Error("Create of a recovered session succeeded")
	}
	for _, s := range b.Sessions() {
		if err := b.Delete(s.Name, s.Slot); err != nil {
			t.Errorf("Delete(%s): %v", s.Name, err)
		}
	}
}

// Reap removes exactly this prefix's orphans: not the kept session, not the
// objects of a prefix that extends this one ("<p>2-x", and "<p>25h", which
// is also a valid name for this prefix's slot 25).
func TestNsmgrReap(t *testing.T) {
	w := world.New(t)
	prefix := freshPrefix(t, "r"+w.ID[:4])
	other := freshPrefix(t, prefix+"2") // a prefix that extends this one
	checkNoLeftovers(t, prefix)
	checkNoLeftovers(t, other)
	hh := hostHandle(t, w)

	o := newManager(t, w, other, "10.20.128.0/17", nil)
	var otherSessions []nsmgr.Session
	for i := 0; i < 6; i++ { // slot 5 is "<prefix>25h"
		otherSessions = append(otherSessions, mustCreate(t, w, o, fmt.Sprintf("x%d", i), true))
	}
	if otherSessions[5].HostIface != prefix+"25h" {
		t.Fatalf("other prefix's slot 5 is %s", otherSessions[5].HostIface)
	}

	a := newManager(t, w, prefix, "10.20.0.0/17", nil)
	keep := mustCreate(t, w, a, "keep", true)
	orphan := mustCreate(t, w, a, "orphan", true)
	mustCreate(t, w, a, "quiet", false)
	stale := filepath.Join(world.NetnsDir, prefix+"-stale") // a create that crashed before its mount
	if err := os.WriteFile(stale, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	cleanupSession(t, w, prefix, "stale", -1)
	a.Close()

	b := newManager(t, w, prefix, "10.20.0.0/17", nil)
	if _, err := b.Recover(); err != nil {
		t.Fatal(err)
	}
	removed, err := b.Reap(map[string]bool{"keep": true})
	if err != nil {
		t.Fatalf("Reap: %v", err)
	}
	slices.Sort(removed)
	wantRemoved := []string{"netns " + prefix + "-orphan", "netns " + prefix + "-quiet", "netns " + prefix + "-stale"}
	// The orphan's veth is listed unless the kernel removed it first.
	if len(removed) == 4 {
		wantRemoved = append([]string{"link " + orphan.HostIface}, wantRemoved...)
	}
	if !slices.Equal(removed, wantRemoved) {
		t.Errorf("Reap removed %v, want %v", removed, wantRemoved)
	}
	if got := netnsFiles(t, prefix); !slices.Equal(got, []string{prefix + "-keep"}) {
		t.Errorf("netns left of this prefix: %v, want [%s-keep]", got, prefix)
	}
	if _, err := hh.LinkByName(orphan.HostIface); err == nil {
		t.Errorf("orphan veth %s survived Reap", orphan.HostIface)
	}
	if _, err := hh.LinkByName(keep.HostIface); err != nil {
		t.Errorf("kept veth %s: %v", keep.HostIface, err)
	}
	if got := b.Sessions(); len(got) != 1 || got[0] != keep {
		t.Errorf("Sessions after Reap = %+v, want only keep", got)
	}
	for _, s := range otherSessions {
		if !mounted(t, s.NetnsPath) {
			t.Errorf("other prefix's netns %s was removed", s.Netns)
		}
		if _, err := hh.LinkByName(s.HostIface); err != nil {
			t.Errorf("other prefix's veth %s was removed: %v", s.HostIface, err)
		}
	}
	// Reaping again removes nothing.
	if removed, err := b.Reap(map[string]bool{"keep": true}); err != nil || len(removed) != 0 {
		t.Errorf("second Reap = %v, %v; want nothing", removed, err)
	}
	if err := b.Delete("keep", keep.Slot); err != nil {
		t.Error(err)
	}
	for _, s := range otherSessions {
		if err := o.Delete(s.Name, s.Slot); err != nil {
			t.Error(err)
		}
	}
}

func TestNsmgrDNSInterface(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	hh := hostHandle(t, w)
	m := newManager(t, w, prefix, "10.20.0.0/16", nil)
	name := nsmgr.DNSIfaceName(prefix)
	t.Cleanup(func() {
		if l, err := hh.LinkByName(name); err == nil {
			hh.LinkDel(l)
		}
	})
	for i := 0; i < 2; i++ {
		addr, err := m.EnsureDNSInterface()
		if err != nil {
			t.Fatalf("EnsureDNSInterface #%d: %v", i+1, err)
		}
		if addr.String() != "10.20.255.254" {
			t.Fatalf("DNS address %s, want 10.20.255.254", addr)
		}
	}
	l, err := hh.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if l.Type() != "dummy" && l.Type() != "bridge" {
		t.Errorf("%s has type %s, want dummy or bridge", name, l.Type())
	}
	t.Logf("%s is a %s", name, l.Type())
	if !isUp(l) {
		t.Errorf("%s is down", name)
	}
	if got := v4Addrs(t, hh, l); !slices.Equal(got, []string{"10.20.255.254/32"}) {
		t.Errorf("%s addresses = %v, want [10.20.255.254/32]", name, got)
	}
	if v := readSysctl(t, w.Host, "/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6"); v != "1" {
		t.Errorf("%s disable_ipv6 = %s, want 1", name, v)
	}

	// A session reaches the anycast address through its default route.
	s := mustCreate(t, w, m, "dns", true)
	if err := world.Ping(s.NetnsPath, m.DNSAddr(), 2*time.Second); err != nil {
		t.Errorf("ping %s from the session: %v", m.DNSAddr(), err)
	}
	if err := m.Delete("dns", s.Slot); err != nil {
		t.Fatal(err)
	}

	for i := 0; i < 2; i++ {
		if err := m.RemoveDNSInterface(); err != nil {
			t.Fatalf("RemoveDNSInterface #%d: %v", i+1, err)
		}
	}
	if _, err := hh.LinkByName(name); err == nil {
		t.Errorf("%s still exists", name)
	}
}

// A Manager with its own netns directory makes it a shared mount point, as
// `ip netns add` does for /run/netns (the test world's netns are mounted
// in /run/netns, so there nsmgr leaves the directory as it is), and works
// there.
func TestNsmgrCustomNetnsDir(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	dir := filepath.Join("/run", "enforcerd-test-"+w.ID)
	t.Cleanup(func() { // runs after the sessions' cleanups
		for i := 0; i < 4; i++ {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				break
			}
		}
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cleanup: remove %s: %v", dir, err)
		}
	})
	newIn := func() *nsmgr.Manager {
		m, err := nsmgr.New(nsmgr.Config{Prefix: prefix, Pool: nsmgr.DefaultPool, HostNS: w.Host, NetnsDir: dir, EtcNetnsDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	m := newIn()
	path := filepath.Join(dir, prefix+"-d1")
	cleanupNetnsFile(t, path)
	s, err := m.Create("d1", true)
	if err != nil {
		t.Fatal(err)
	}
	if s.NetnsPath != path || !mounted(t, path) {
		t.Fatalf("NetnsPath %s (mounted %v), want %s mounted", s.NetnsPath, mounted(t, path), path)
	}
	f := mountInfo(t, dir)
	if f == nil || !slices.ContainsFunc(f[6:], func(o string) bool { return strings.HasPrefix(o, "shared:") }) {
		t.Errorf("%s is not a shared mount point: %v", dir, f)
	}
	if err := world.Ping(s.NetnsPath, s.Gateway, 2*time.Second); err != nil {
		t.Errorf("ping gateway: %v", err)
	}
	got, err := newIn().Recover()
	if err != nil || len(got) != 1 || got[0] != s {
		t.Errorf("Recover in %s = %+v, %v; want [%+v]", dir, got, err, s)
	}
	if err := m.Delete("d1", s.Slot); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns file after Delete: %v", err)
	}
	// A second Manager finds the directory prepared and leaves it be.
	m2 := newIn()
	if _, err := m2.Create("d2", false); err != nil {
		t.Fatal(err)
	}
	cleanupNetnsFile(t, filepath.Join(dir, prefix+"-d2"))
	if err := m2.Delete("d2", -1); err != nil {
		t.Fatal(err)
	}
	if f := mountInfo(t, dir); f == nil {
		t.Errorf("%s is no longer a mount point", dir)
	}
}

func TestNsmgrEnableForwarding(t *testing.T) {
	w := world.New(t)
	if err := nsmgr.EnableForwarding(w.Host); err != nil {
		t.Fatal(err)
	}
	if v := readSysctl(t, w.Host, "/proc/sys/net/ipv4/ip_forward"); v != "1" {
		t.Errorf("ip_forward in the simulated host = %s, want 1", v)
	}
}

// Concurrent creates get distinct slots and leave a consistent state.
func TestNsmgrConcurrentCreateDelete(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	m := newManager(t, w, prefix, "10.20.0.0/16", nil)
	const n = 24
	sessions := make([]nsmgr.Session, n)
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		cleanupSession(t, w, prefix, fmt.Sprintf("c%d", i), -1)
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sessions[i], errs[i] = m.Create(fmt.Sprintf("c%d", i), i%4 != 0)
		}()
	}
	wg.Wait()
	seen := map[int]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Create c%d: %v", i, err)
		}
		if s := sessions[i].Slot; s >= 0 {
			if seen[s] {
				t.Fatalf("slot %d handed out twice", s)
			}
			seen[s] = true
		}
	}
	if m.SlotsInUse() != len(seen) || len(seen) != n-n/4 {
		t.Fatalf("SlotsInUse = %d, distinct slots %d", m.SlotsInUse(), len(seen))
	}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.Delete(sessions[i].Name, sessions[i].Slot)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if m.SlotsInUse() != 0 || len(m.Sessions()) != 0 || len(netnsFiles(t, prefix)) != 0 {
		t.Fatalf("after deleting all: %d slots, sessions %v, files %v", m.SlotsInUse(), m.Sessions(), netnsFiles(t, prefix))
	}
}

// BenchmarkNsmgrCreateDelete reports p50/p99 of Create (with NIC) and of
// Delete (the lazy fast path) over b.N sessions.
func BenchmarkNsmgrCreateDelete(b *testing.B) { benchCreateDelete(b, 0) }

// With the daemon's default pool of prepared netns; the create-netns step
// (the claim) is reported apart. Run it beside the one above: the machine's
// load moves both.
func BenchmarkNsmgrCreateDeletePrepared(b *testing.B) { benchCreateDelete(b, 8) }

func benchCreateDelete(b *testing.B, prepared int) {
	w := world.New(b)
	prefix := nsmgrPrefix(b, w)
	var (
		mark     time.Time
		inStep   bool
		netnsDur []time.Duration
	)
	fault := func(step string) error { // times create-netns (to the next step)
		if inStep {
			netnsDur = append(netnsDur, time.Since(mark))
			inStep = false
		}
		if step == nsmgr.StepCreateNetns {
			mark, inStep = time.Now(), true
		}
		return nil
	}
	m, err := nsmgr.New(nsmgr.Config{Prefix: prefix, Pool: nsmgr.DefaultPool, HostNS: w.Host, EtcNetnsDir: b.TempDir(),
		Prepared: prepared, Fault: fault})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	if prepared > 0 {
		m.StartPrepared()
		waitPrepared(b, m, prepared)
	}
	create := make([]time.Duration, 0, b.N)
	del := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("b%d", i)
		cleanupSession(b, w, prefix, name, -1)
		start := time.Now()
		s, err := m.Create(name, true)
		create = append(create, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		if err := m.Delete(name, s.Slot); err != nil {
			b.Fatal(err)
		}
		del = append(del, time.Since(start))
	}
	pct := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[int(float64(len(d)-1)*p)].Microseconds())
	}
	b.ReportMetric(pct(create, 0.5), "create-p50-µs")
	b.ReportMetric(pct(create, 0.99), "create-p99-µs")
	b.ReportMetric(pct(del, 0.5), "delete-p50-µs")
	b.ReportMetric(pct(del, 0.99), "delete-p99-µs")
	b.ReportMetric(pct(netnsDur, 0.5), "create-netns-p50-µs")
	if prepared > 0 {
		st := m.PreparedStats()
		b.ReportMetric(float64(st.Fresh), "pool-empty-creates")
	}
}

// TestNsmgrForeignLinks: a link that starts with the prefix but is not a
// session veth of it (an uplink named "<prefix>up", another daemon's veth)
// is reported, by name; the DNS interface and the prefix's own session veths
// are not.
func TestNsmgrForeignLinks(t *testing.T) {
	w := world.New(t)
	prefix := "f" + w.ID[:4]
	mgr, err := nsmgr.New(nsmgr.Config{Prefix: prefix, Pool: nsmgr.DefaultPool, HostNS: w.Host, EtcNetnsDir: t.TempDir()})
	if err != nil {
		t.Fatalf("nsmgr: %v", err)
	}
	defer mgr.Close()
	if _, err := mgr.EnsureDNSInterface(); err != nil {
		t.Fatalf("dns interface: %v", err)
	}
	defer mgr.RemoveDNSInterface()
	s, err := mgr.Create("own", true)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	defer mgr.Delete("own", s.Slot)
	if err := mgr.CheckNoForeignLinks(); err != nil {
		t.Fatalf("control: only the prefix's own links exist, got %v", err)
	}
	h, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	up := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: prefix + "up"}, PeerName: prefix + "upp"}
	if err := h.LinkAdd(up); err != nil {
		t.Fatalf("add %s: %v", up.Name, err)
	}
	defer h.LinkDel(up)
	err = mgr.CheckNoForeignLinks()
	if err == nil || !strings.Contains(err.Error(), "link "+prefix+"up ") {
		t.Fatalf("foreign link %s: got %v, want an error naming it", up.Name, err)
	}
}

// TestNsmgrGuestCleanQuarantines: a released slot whose address the caller
// says is not clean yet (the firewall still flushing its conntrack entries)
// is not handed out again; once clean, it is.
func TestNsmgrGuestCleanQuarantines(t *testing.T) {
	w := world.New(t)
	prefix := "q" + w.ID[:4]
	var mu sync.Mutex
	dirty := map[netip.Addr]bool{}
	clean := func(g netip.Addr) bool { mu.Lock(); defer mu.Unlock(); return !dirty[g] }
	pool := netip.MustParsePrefix("10.20.0.0/28") // three session slots
	mgr, err := nsmgr.New(nsmgr.Config{Prefix: prefix, Pool: pool, HostNS: w.Host, GuestClean: clean, EtcNetnsDir: t.TempDir()})
	if err != nil {
		t.Fatalf("nsmgr: %v", err)
	}
	defer mgr.Close()
	for _, name := range []string{"x", "y"} { // hold the other two slots
		s, err := mgr.Create(name, true)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		defer mgr.Delete(name, s.Slot)
	}
	a, err := mgr.Create("a", true)
	if err != nil {
		t.Fatalf("create a: %v", err)
	}
	mu.Lock()
	dirty[a.Guest] = true
	mu.Unlock()
	if err := mgr.Delete("a", a.Slot); err != nil {
		t.Fatalf("delete a: %v", err)
	}
	// Wait for a's veth to go, so only GuestClean can hold the slot.
	h, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := h.LinkByName(a.HostIface); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("veth %s still exists after 10s", a.HostIface)
		}
	}
	if _, err := mgr.Create("b", true); err == nil {
		t.Fatalf("the pool's last free slot was handed out while its address %s is not clean", a.Guest)
	}
	mu.Lock()
	delete(dirty, a.Guest)
	mu.Unlock()
	b, err := mgr.Create("b", true)
	if err != nil {
		t.Fatalf("control: create b once %s is clean: %v", a.Guest, err)
	}
	defer mgr.Delete("b", b.Slot)
	if b.Guest != a.Guest {
		t.Errorf("b got %s, want the reused %s", b.Guest, a.Guest)
	}
}

// The host side's disable_ipv6 is written through a directory fd of the
// daemon netns's conf directory, opened when the Manager is made: it lands
// on the daemon netns's veth even when an interface of the same name exists
// in another netns (here the netns the test created after New), and the
// session netns gets IPv6 off in "all" and "default" through its private
// procfs instance.
func TestNsmgrIPv6SysctlsHitTheRightNetns(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	m := newManager(t, w, prefix, "10.20.0.0/16", nil)

	name := w.UniqueName("x6")
	other, err := world.NewNamedNetns(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		other.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	oh, err := netlink.NewHandleAt(other)
	if err != nil {
		t.Fatal(err)
	}
	defer oh.Close()
	twin := nsmgr.HostIfaceName(prefix, 0) // the name slot 0's host veth gets
	if err := oh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: twin}, PeerName: "peer"}); err != nil {
		t.Fatalf("add %s in %s: %v", twin, name, err)
	}
	s := mustCreate(t, w, m, "s6", true)
	if s.HostIface != twin {
		t.Fatalf("host veth %s, want %s", s.HostIface, twin)
	}
	if v := readSysctl(t, w.Host, "/proc/sys/net/ipv6/conf/"+twin+"/disable_ipv6"); v != "1" {
		t.Errorf("daemon netns: %s disable_ipv6 = %s, want 1", twin, v)
	}
	if v := readSysctl(t, other, "/proc/sys/net/ipv6/conf/"+twin+"/disable_ipv6"); v != "0" {
		t.Errorf("other netns: %s disable_ipv6 = %s, want 0 (untouched)", twin, v)
	}
	if v := readSysctl(t, other, "/proc/sys/net/ipv6/conf/default/disable_ipv6"); v != "0" {
		t.Errorf("other netns: default disable_ipv6 = %s, want 0 (untouched)", v)
	}
	ns, _, release := sessionHandle(t, s.NetnsPath)
	defer release()
	for _, iface := range []string{"all", "default", "lo", "eth0"} {
		if v := readSysctl(t, ns, "/proc/sys/net/ipv6/conf/"+iface+"/disable_ipv6"); v != "1" {
			t.Errorf("session netns: %s disable_ipv6 = %s, want 1", iface, v)
		}
	}
	if err := m.Delete("s6", s.Slot); err != nil {
		t.Fatal(err)
	}
}

// TestNsmgrStepStarted: the StepStarted observer (the bench's step timer)
// is told every step of a create with a NIC, in CreateSteps' order, each
// after Fault passed it; a step Fault fails is never reported started
// (the control: the same manager, a fault at add-veth).
func TestNsmgrStepStarted(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	var (
		mu               sync.Mutex
		faulted, started []string
		failAt           string
	)
	m, err := nsmgr.New(nsmgr.Config{
		Prefix: prefix, Pool: netip.MustParsePrefix("10.20.0.0/16"), HostNS: w.Host, EtcNetnsDir: t.TempDir(),
		Fault: func(step string) error {
			mu.Lock()
			defer mu.Unlock()
			faulted = append(faulted, step)
			if step == failAt {
				return errors.New("injected")
			}
			return nil
		},
		StepStarted: func(step string) {
			mu.Lock()
			defer mu.Unlock()
			if len(faulted) == 0 || faulted[len(faulted)-1] != step {
				t.Errorf("step %s started before Fault passed it (Fault saw %v)", step, faulted)
			}
			started = append(started, step)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	mustCreate(t, w, m, "s1", true)
	mu.Lock()
	if !slices.Equal(started, nsmgr.CreateSteps) {
		t.Errorf("StepStarted saw %v, want CreateSteps %v", started, nsmgr.CreateSteps)
	}
	faulted, started, failAt = nil, nil, nsmgr.StepAddVeth
	mu.Unlock()
	if _, err := m.Create("s2", true); err == nil {
		t.Fatal("create with a fault at add-veth succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(started, nsmgr.StepAddVeth) || !slices.Contains(faulted, nsmgr.StepAddVeth) {
		t.Errorf("with a fault at add-veth: Fault saw %v, StepStarted %v; want add-veth faulted, never started", faulted, started)
	}
}
