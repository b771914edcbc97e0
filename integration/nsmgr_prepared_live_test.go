package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
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

// Live tests of the pool of prepared netns (nsmgr/prepared.go): a claimed
// netns is indistinguishable from a fresh one, never one a session used;
// Reap and Close remove pool entries; Create falls back to a fresh netns
// when the pool is empty.

// preparedFiles lists the pool entries of prefix under /run/netns.
func preparedFiles(t testing.TB, prefix string) []string {
	t.Helper()
	var out []string
	for _, n := range netnsFiles(t, prefix) {
		if strings.HasPrefix(n, prefix+"-pool_") {
			out = append(out, n)
		}
	}
	return out
}

// waitPreparedFiles waits until prefix has n pool entries under /run/netns
// (a claimed entry's pool name is removed in the background).
func waitPreparedFiles(t testing.TB, prefix string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := preparedFiles(t, prefix)
		if len(got) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool entries %v after 5s, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// netnsSnapshot is what a guest could see of its network namespace's
// configuration, with the slot's own addresses replaced by names.
type netnsSnapshot struct {
	links   []string          // name, type, flags
	addrs   []string          // every address of every family, per link
	routes  []string          // every route of every family and table
	sysctls map[string]string // net/ipv4/conf and net/ipv6/conf of all, default, lo, eth0, and net/core
}

func snapshotNetns(t *testing.T, s nsmgr.Session) netnsSnapshot {
	t.Helper()
	ns, h, release := sessionHandle(t, s.NetnsPath)
	defer release()
	var norm *strings.Replacer
	if s.Slot >= 0 {
		norm = strings.NewReplacer(s.Guest.String(), "GUEST", s.Gateway.String(), "GW",
			s.Subnet.Masked().Addr().String(), "NET", s.Guest.Next().String(), "BCAST")
	} else {
		norm = strings.NewReplacer()
	}
	var snap netnsSnapshot
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		a := l.Attrs()
		// Without RUNNING and LOWER_UP: a veth's carrier comes up a moment
		// after both ends are up (linkwatch), in either kind of netns.
		flags := a.RawFlags &^ (unix.IFF_RUNNING | unix.IFF_LOWER_UP)
		snap.links = append(snap.links, fmt.Sprintf("%d %s %s %#x mtu %d", a.Index, a.Name, l.Type(), flags, a.MTU))
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		for _, ad := range addrs {
			snap.addrs = append(snap.addrs, norm.Replace(fmt.Sprintf("%s %s scope %d flags %#x", a.Name, ad.IPNet, ad.Scope, ad.Flags)))
		}
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		snap.routes = append(snap.routes, norm.Replace(fmt.Sprintf("table %d dst %v gw %v src %v dev %d scope %d type %d proto %d",
			r.Table, r.Dst, r.Gw, r.Src, r.LinkIndex, r.Scope, r.Type, r.Protocol)))
	}
	sort.Strings(snap.routes)
	snap.sysctls = map[string]string{}
	err = nsmgr.Do(ns, func() error {
		var dirs []string
		for _, fam := range []string{"ipv4", "ipv6"} {
			for _, iface := range []string{"all", "default", "lo", "eth0"} {
				dirs = append(dirs, "/proc/sys/net/"+fam+"/conf/"+iface)
			}
		}
		dirs = append(dirs, "/proc/sys/net/core")
		for _, dir := range dirs {
			entries, err := os.ReadDir(dir)
			if errors.Is(err, os.ErrNotExist) && strings.HasSuffix(dir, "/eth0") {
				continue // a session without NIC
			}
			if err != nil {
				return err
			}
			for _, e := range entries {
				b, err := os.ReadFile(filepath.Join(dir, e.Name()))
				if err != nil {
					continue // write-only or unreadable (stable_secret): the same in both
				}
				snap.sysctls[strings.TrimPrefix(dir, "/proc/sys/net/")+"/"+e.Name()] = strings.TrimSpace(string(b))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read sysctls of %s: %v", s.NetnsPath, err)
	}
	return snap
}

func diffSnapshots(t *testing.T, what string, got, want netnsSnapshot) {
	t.Helper()
	for _, c := range []struct {
		name      string
		got, want []string
	}{{"links", got.links, want.links}, {"addresses", got.addrs, want.addrs}, {"routes", got.routes, want.routes}} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: %s\n%v\nwant (fresh)\n%v", what, c.name, c.got, c.want)
		}
	}
	for k, v := range want.sysctls {
		if got.sysctls[k] != v {
			t.Errorf("%s: sysctl %s = %q, fresh %q", what, k, got.sysctls[k], v)
		}
	}
	if len(got.sysctls) != len(want.sysctls) {
		t.Errorf("%s: %d sysctls, fresh %d", what, len(got.sysctls), len(want.sysctls))
	}
}

// nsInode identifies a live netns (its nsfs device and inode: unique while
// it lives; a file not mounted yet has its own filesystem's).
func nsInode(t *testing.T, path string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// A session whose netns comes from the pool looks exactly like one made on
// the spot: same links, addresses, routes and sysctls; and no netns a
// session used is ever handed out again, even with state left in it.
func TestNsmgrPreparedClaimLikeFresh(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	fresh := newManager(t, w, freshPrefix(t, "f"+w.ID[:5]), "10.20.64.0/18", nil)
	checkNoLeftovers(t, fresh.Prefix())
	m := newManagerPrepared(t, w, prefix, "10.20.0.0/18", nil, 2)
	if got := preparedFiles(t, prefix); len(got) != 2 {
		t.Fatalf("pool entries %v, want 2", got)
	}
	for _, p := range preparedFiles(t, prefix) {
		if !mounted(t, filepath.Join(world.NetnsDir, p)) {
			t.Errorf("pool entry %s is not a mounted netns", p)
		}
	}

	for _, nic := range []bool{true, false} {
		name := fmt.Sprintf("c%v", nic)
		before := m.PreparedStats()
		s := mustCreate(t, w, m, name, nic)
		if st := m.PreparedStats(); st.Claimed != before.Claimed+1 {
			t.Fatalf("Create(%s): %+v, want a netns claimed from the pool", name, st)
		}
		f := mustCreate(t, w, fresh, name, nic)
		diffSnapshots(t, fmt.Sprintf("claimed (nic %v)", nic), snapshotNetns(t, s), snapshotNetns(t, f))
		if !mounted(t, s.NetnsPath) {
			t.Errorf("%s is not a mount point", s.NetnsPath)
		}
		if nic {
			if err := world.Ping(s.NetnsPath, s.Gateway, 2*time.Second); err != nil {
				t.Errorf("ping gateway from the claimed session: %v", err)
			}
		}
	}
	if got := m.Sessions(); len(got) != 2 {
		t.Errorf("Sessions = %+v, want the two", got)
	}
	waitPrepared(t, m, 2)
	waitPreparedFiles(t, prefix, 2)

	// Leave state in a session's netns (an address on lo, a changed
	// sysctl), keep the netns alive, delete the session: the next creates
	// never get that netns or its state.
	used := map[string]string{}
	var holders []netns.NsHandle
	defer func() {
		for _, h := range holders {
			h.Close()
		}
	}()
	for i := 0; i < 6; i++ {
		name := fmt.Sprintf("u%d", i)
		s := mustCreate(t, w, m, name, true)
		ino := nsInode(t, s.NetnsPath)
		if prev, ok := used[ino]; ok {
			t.Fatalf("session %s got the netns session %s used", name, prev)
		}
		ns, h, release := sessionHandle(t, s.NetnsPath)
		lo, _ := h.LinkByName("lo")
		if err := h.AddrAdd(lo, mustAddr(t, "192.0.2.77/32")); err != nil {
			t.Fatal(err)
		}
		if err := nsmgr.Do(ns, func() error {
			return os.WriteFile("/proc/sys/net/ipv4/conf/eth0/rp_filter", []byte("2"), 0)
		}); err != nil {
			t.Fatal(err)
		}
		holder, err := netns.GetFromPath(s.NetnsPath)
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, holder)
		release()
		used[ino] = name
		if err := m.Delete(name, s.Slot); err != nil {
			t.Fatal(err)
		}
		waitPreparedFiles(t, prefix, 2) // the claimed entries' pool names are gone
		for _, p := range preparedFiles(t, prefix) {
			if n, ok := used[nsInode(t, filepath.Join(world.NetnsDir, p))]; ok {
				t.Fatalf("pool entry %s is the netns session %s used", p, n)
			}
		}
		n := mustCreate(t, w, m, "n"+name, true)
		if n2, ok := used[nsInode(t, n.NetnsPath)]; ok {
			t.Fatalf("session n%s got the netns session %s used", name, n2)
		}
		_, nh, nrel := sessionHandle(t, n.NetnsPath)
		nlo, _ := nh.LinkByName("lo")
		if got := v4Addrs(t, nh, nlo); !slices.Equal(got, []string{"127.0.0.1/8"}) {
			t.Errorf("session n%s: lo addresses %v, want [127.0.0.1/8]", name, got)
		}
		nrel()
		if err := m.Delete("n"+name, n.Slot); err != nil {
			t.Fatal(err)
		}
	}
	if st := m.PreparedStats(); st.Claimed < 2 || st.Failures != 0 {
		t.Errorf("pool stats %+v", st)
	}
	for _, s := range m.Sessions() {
		m.Delete(s.Name, s.Slot)
	}
	for _, s := range fresh.Sessions() {
		fresh.Delete(s.Name, s.Slot)
	}
	// Close removes the pool.
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := preparedFiles(t, prefix); len(got) != 0 {
		t.Errorf("pool entries after Close: %v", got)
	}
}

func mustAddr(t *testing.T, s string) *netlink.Addr {
	t.Helper()
	a, err := netlink.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Reap removes pool entries left by another run (a crash leaves them
// mounted) and by a file a crash left unmounted, but not the Manager's own
// live pool; Recover does not take them for sessions; a prefix that
// extends this one keeps its own.
func TestNsmgrPreparedReap(t *testing.T) {
	w := world.New(t)
	prefix := freshPrefix(t, "q"+w.ID[:4])
	other := freshPrefix(t, prefix+"2")
	checkNoLeftovers(t, prefix)
	checkNoLeftovers(t, other)

	o := newManagerPrepared(t, w, other, "10.20.128.0/17", nil, 1)
	old := newManagerPrepared(t, w, prefix, "10.20.0.0/17", nil, 2) // "crashes": its pool stays
	oldPool := preparedFiles(t, prefix)
	if len(oldPool) != 2 {
		t.Fatalf("pool entries %v, want 2", oldPool)
	}
	unmounted := prefix + "-pool_999999" // a crash between the file and its mount
	if err := os.WriteFile(filepath.Join(world.NetnsDir, unmounted), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	cleanupNetnsFile(t, filepath.Join(world.NetnsDir, unmounted))
	for _, p := range oldPool {
		cleanupNetnsFile(t, filepath.Join(world.NetnsDir, p)) // if the code under test fails
	}

	// The old Manager's own Reap keeps its live pool (and removes the
	// stray file).
	removed, err := old.Reap(nil)
	if err != nil || !slices.Equal(removed, []string{"netns " + unmounted}) {
		t.Fatalf("own Reap = %v, %v; want [netns %s]", removed, err, unmounted)
	}
	if got := preparedFiles(t, prefix); !slices.Equal(got, oldPool) {
		t.Fatalf("own Reap left pool %v, want %v", got, oldPool)
	}

	next := newManager(t, w, prefix, "10.20.0.0/17", nil) // the next run
	if got, err := next.Recover(); err != nil || len(got) != 0 {
		t.Fatalf("Recover = %+v, %v; want no session", got, err)
	}
	removed, err = next.Reap(nil)
	if err != nil {
		t.Fatalf("Reap: %v", err)
	}
	slices.Sort(removed)
	var want []string
	for _, p := range oldPool {
		want = append(want, "netns "+p)
	}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("Reap removed %v, want %v", removed, want)
	}
	if got := preparedFiles(t, prefix); len(got) != 0 {
		t.Errorf("pool entries after Reap: %v", got)
	}
	if got := preparedFiles(t, other); len(got) != 1 {
		t.Errorf("the other prefix's pool %v, want its 1 entry", got)
	}
	// The crashed Manager's Close finds its entries gone: no error.
	if err := old.Close(); err != nil {
		t.Errorf("Close after the pool was reaped: %v", err)
	}
	if err := o.Close(); err != nil || len(preparedFiles(t, other)) != 0 {
		t.Errorf("Close: %v; pool left %v", err, preparedFiles(t, other))
	}
}

// With the pool empty (more creates at once than it holds), Create makes
// its netns itself, and every session is right either way.
func TestNsmgrPreparedFallbackWhenEmpty(t *testing.T) {
	w := world.New(t)
	prefix := nsmgrPrefix(t, w)
	checkNoLeftovers(t, prefix)
	m := newManagerPrepared(t, w, prefix, "10.20.0.0/18", nil, 1)
	const n = 12
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		all  []nsmgr.Session
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s, err := m.Create(fmt.Sprintf("e%d", i), i%3 != 0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			all = append(all, s)
		}(i)
	}
	wg.Wait()
	for _, s := range all {
		cleanupSession(t, w, prefix, s.Name, s.Slot)
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	st := m.PreparedStats()
	if st.Claimed < 1 || st.Fresh < 1 || st.Claimed+st.Fresh != n {
		t.Errorf("pool stats %+v: want both claimed and fresh creates, %d in all", st, n)
	}
	for _, s := range all {
		ns, h, release := sessionHandle(t, s.NetnsPath)
		want := []string{"lo"}
		if s.Slot >= 0 {
			want = []string{"lo", "eth0"}
		}
		if got := linkNames(t, h); !slices.Equal(got, want) {
			t.Errorf("%s: links %v, want %v", s.Name, got, want)
		}
		for _, iface := range want {
			if v := readSysctl(t, ns, "/proc/sys/net/ipv6/conf/"+iface+"/disable_ipv6"); v != "1" {
				t.Errorf("%s: %s disable_ipv6 = %s", s.Name, iface, v)
			}
		}
		if addrs, _ := h.AddrList(nil, netlink.FAMILY_V6); len(addrs) != 0 {
			t.Errorf("%s: IPv6 addresses %v", s.Name, addrs)
		}
		release()
		if err := m.Delete(s.Name, s.Slot); err != nil {
			t.Error(err)
		}
	}
	waitPrepared(t, m, 1)
}
