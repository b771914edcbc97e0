package integration

// Residue checks of the end-to-end tests: every object a daemon of a prefix
// can leave, read straight from the kernel and the file system (never
// through the daemon), and compared with what the daemon says exists.

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// e2eObjects is every object of one prefix. Names are sorted; nil and empty
// are the same.
type e2eObjects struct {
	Netns     []string // session names with a netns file <prefix>-<name>
	Links     []string // links of the simulated host named <prefix>...
	Records   []string // session names with a state record
	Boxes     []string // sandbox remains: "containers/<name>", "layers/<name>", "cgroup/<name>"
	NftGuests []string // guests with an element in a per-session set of the table
	Table     bool     // the table inet <prefix> exists
	Cgroups   bool     // a "<prefix>" cgroup parent exists under some controller
}

func (o e2eObjects) empty() bool {
	return len(o.Netns)+len(o.Links)+len(o.Records)+len(o.Boxes)+len(o.NftGuests) == 0 && !o.Table && !o.Cgroups
}

func (o e2eObjects) String() string {
	return fmt.Sprintf("netns %v, links %v, records %v, sandboxes %v, nft guests %v, table %v, cgroup parent %v",
		o.Netns, o.Links, o.Records, o.Boxes, o.NftGuests, o.Table, o.Cgroups)
}

func (o e2eObjects) normal() e2eObjects {
	for _, s := range []*[]string{&o.Netns, &o.Links, &o.Records, &o.Boxes, &o.NftGuests} {
		if len(*s) == 0 {
			*s = nil
			continue
		}
		*s = slices.Clone(*s)
		slices.Sort(*s)
		*s = slices.Compact(*s)
	}
	return o
}

// objects reads every object of the daemon's prefix.
func (e *e2eEnv) objects() e2eObjects {
	e.t.Helper()
	return e2eReadObjects(e.t, e.w, e.d.Prefix, e.d.StateDir)
}

func e2eReadObjects(t *testing.T, w *world.World, prefix, stateDir string) e2eObjects {
	t.Helper()
	var o e2eObjects
	ents, err := os.ReadDir(world.NetnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("list %s: %v", world.NetnsDir, err)
	}
	for _, ent := range ents {
		if n, ok := strings.CutPrefix(ent.Name(), prefix+"-"); ok && !strings.HasPrefix(n, "pool_") {
			o.Netns = append(o.Netns, n) // (pool_: a prepared netns, see e2ePrepared)
		}
	}
	h, err := netlink.NewHandleAt(w.Host)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", w.HostName, err)
	}
	// A dump interrupted by a concurrent change (a veth the kernel is still
	// removing) is retried, as the product's own dumps are.
	links, err := h.LinkList()
	for i := 0; i < 5 && errors.Is(err, netlink.ErrDumpInterrupted); i++ {
		time.Sleep(20 * time.Millisecond)
		links, err = h.LinkList()
	}
	h.Close()
	if err != nil {
		t.Fatalf("list links of %s: %v", w.HostName, err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			o.Links = append(o.Links, l.Attrs().Name)
		}
	}
	recs, _ := filepath.Glob(filepath.Join(stateDir, "sessions", "*.json"))
	for _, r := range recs {
		o.Records = append(o.Records, strings.TrimSuffix(filepath.Base(r), ".json"))
	}
	for _, kind := range []string{"containers", "layers"} {
		dirs, _ := filepath.Glob(filepath.Join(stateDir, kind, prefix+"-*"))
		for _, d := range dirs {
			o.Boxes = append(o.Boxes, kind+"/"+strings.TrimPrefix(filepath.Base(d), prefix+"-"))
		}
	}
	// cgroup v1 (and hybrid): /sys/fs/cgroup/<controller>/<prefix>/<id>;
	// v2: /sys/fs/cgroup/<prefix>/<id>.
	parents, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", prefix))
	if fi, err := os.Stat(filepath.Join("/sys/fs/cgroup", prefix)); err == nil && fi.IsDir() {
		parents = append(parents, filepath.Join("/sys/fs/cgroup", prefix))
	}
	o.Cgroups = len(parents) > 0
	for _, p := range parents {
		dirs, _ := filepath.Glob(filepath.Join(p, prefix+"-*"))
		for _, d := range dirs {
			o.Boxes = append(o.Boxes, "cgroup/"+strings.TrimPrefix(filepath.Base(d), prefix+"-"))
		}
	}
	var guests map[string][]netip.Addr
	o.Table, guests = e2eNftRead(t, w, prefix)
	for _, gs := range guests {
		for _, g := range gs {
			o.NftGuests = append(o.NftGuests, g.String())
		}
	}
	return o.normal()
}

// e2eNftRead reads the table inet <prefix> of the simulated host (through a
// netns fd; nothing is changed) and returns whether it exists and, by set,
// the guest address of every element of the per-session sets.
func e2eNftRead(t *testing.T, w *world.World, prefix string) (bool, map[string][]netip.Addr) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(w.Host)))
	if err != nil {
		t.Fatalf("nftables in %s: %v", w.HostName, err)
	}
	defer c.CloseLasting()
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatalf("list nftables tables of %s: %v", w.HostName, err)
	}
	var table *nftables.Table
	for _, tb := range tables {
		if tb.Name == prefix {
			table = tb
		}
	}
	if table == nil {
		return false, nil
	}
	sets, err := c.GetSets(table)
	if err != nil {
		t.Fatalf("list sets of inet %s: %v", prefix, err)
	}
	out := map[string][]netip.Addr{}
	for _, s := range sets {
		if s.Name == "blocked" || s.Name == "blocked6" { // the guard's ranges: not per session
			continue
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			t.Fatalf("list elements of set %s: %v", s.Name, err)
		}
		for _, el := range elems {
			if el.IntervalEnd {
				continue
			}
			key := el.Key
			switch s.Name {
			case "ifaces": // map host veth name : the guest's address
				key = el.Val
			case "sessions": // ifname (16 bytes) . guest
				if len(key) < 20 {
					continue
				}
				key = key[16:]
			case "sessions6": // ifname (16 bytes) . guest6
				key = key[16:]
			}
			if strings.HasSuffix(s.Name, "6") || strings.Contains(s.Name, "6_") { // a dual-stack set: keyed by guest6
				if len(key) >= 16 {
					out[s.Name] = append(out[s.Name], netip.AddrFrom16([16]byte(key[:16])))
				}
				continue
			}
			if len(key) < 4 {
				continue
			}
			out[s.Name] = append(out[s.Name], netip.AddrFrom4([4]byte(key[:4])))
		}
	}
	return true, out
}

// e2eNftAttested returns the addresses attested for guest, read from the
// kernel's attested set (port-free elements only).
func e2eNftAttested(t *testing.T, w *world.World, prefix string, guest netip.Addr) []string {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(w.Host)))
	if err != nil {
		t.Fatalf("nftables in %s: %v", w.HostName, err)
	}
	defer c.CloseLasting()
	set, err := c.GetSetByName(&nftables.Table{Name: prefix, Family: nftables.TableFamilyINet}, "attested")
	if err != nil {
		t.Fatalf("set attested of inet %s: %v", prefix, err)
	}
	elems, err := c.GetSetElements(set)
	if err != nil {
		t.Fatalf("elements of set attested: %v", err)
	}
	var out []string
	g := guest.As4()
	for _, el := range elems {
		if len(el.Key) >= 8 && [4]byte(el.Key[:4]) == g {
			out = append(out, netip.AddrFrom4([4]byte(el.Key[4:8])).String())
		}
	}
	slices.Sort(out)
	return out
}

// expected returns the objects that must exist for the sessions in list:
// each session's netns and record; a NIC session's host veth and its
// elements; a sandbox session's container state, layer dir and cgroup; plus
// the shared DNS interface, the table and the cgroup parent when any
// sandbox runs.
func (e *e2eEnv) expected(list []api.SessionInfo) e2eObjects {
	o := e2eObjects{Links: []string{e.dnsIface()}, Table: true}
	for _, s := range list {
		o.Netns = append(o.Netns, s.Name)
		o.Records = append(o.Records, s.Name)
		if s.HostVeth != "" {
			o.Links = append(o.Links, s.HostVeth)
		}
		if s.GuestIP != "" {
			o.NftGuests = append(o.NftGuests, s.GuestIP)
		}
		if s.Sandbox {
			o.Boxes = append(o.Boxes, "containers/"+s.Name, "layers/"+s.Name, "cgroup/"+s.Name)
			o.Cgroups = true
		}
	}
	return o.normal()
}

// expectObjects waits (a removed netns takes its veth with it in the
// background: the kernel's cleanup_net work, which on a loaded 2-core
// machine was seen to take more than 5 s after a flood) until the
// prefix's objects are exactly want, and reports the difference otherwise. The cgroup parent is compared only when want has
// it (it may outlive its last sandbox while the daemon runs).
func (e *e2eEnv) expectObjects(t *testing.T, when string, want e2eObjects) {
	t.Helper()
	e.expectOwnPrepared(t, when)
	want = want.normal()
	var got e2eObjects
	deadline := time.Now().Add(20 * time.Second)
	for {
		got = e.objects()
		cmp := got
		if !want.Cgroups && want.Table {
			cmp.Cgroups = false
		}
		if reflect.DeepEqual(cmp, want) {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("objects of prefix %s %s:\n got  %s\n want %s", e.d.Prefix, when, got, want)
}

// e2ePrepared lists the prepared netns of prefix ("<prefix>-pool_<pid>_<n>",
// made ahead of demand by a running daemon; '_' is in no session name).
func e2ePrepared(t testing.TB, prefix string) []string {
	t.Helper()
	ents, err := os.ReadDir(world.NetnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("list %s: %v", world.NetnsDir, err)
	}
	var out []string
	for _, ent := range ents {
		if strings.HasPrefix(ent.Name(), prefix+"-pool_") {
			out = append(out, ent.Name())
		}
	}
	return out
}

// expectOwnPrepared checks the prepared netns of the prefix: while the
// daemon runs, only its own (its pid in the name: a previous run's were
// reaped at its start); while it does not run, they are checked where it
// stopped (cleanup: a graceful stop removes them, reap removes the rest).
func (e *e2eEnv) expectOwnPrepared(t *testing.T, when string) {
	t.Helper()
	if done, _ := e.d.Exited(); done || e.d.PID() == 0 {
		return
	}
	own := fmt.Sprintf("%s-pool_%d_", e.d.Prefix, e.d.PID())
	for _, n := range e2ePrepared(t, e.d.Prefix) {
		if !strings.HasPrefix(n, own) {
			t.Errorf("%s: prepared netns %s is not the running daemon's (pid %d)", when, n, e.d.PID())
		}
	}
}

// expectConsistent checks that the prefix's objects are exactly those of
// the sessions the daemon lists: nothing missing, no orphan.
func (e *e2eEnv) expectConsistent(when string) []api.SessionInfo {
	e.t.Helper()
	list := e.list()
	e.expectObjects(e.t, when, e.expected(list))
	return list
}

// e2eProcesses returns the pids whose command line is exactly argv.
func e2eProcesses(argv ...string) []int {
	want := strings.Join(argv, "\x00")
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range ents {
		var pid int
		if _, err := fmt.Sscan(ent.Name(), &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.TrimSuffix(string(b), "\x00") == want {
			pids = append(pids, pid)
		}
	}
	return pids
}
