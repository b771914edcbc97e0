package integration

// `enforcerd reap`: offline, it removes every object of its prefix and the
// state records, and touches nothing of another prefix (here a second
// daemon, running in the same simulated host with its own prefix and pool).

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/enforcerd"
	"github.com/enforcerd/enforcerd/integration/world"
)

func TestE2EReap(t *testing.T) {
	e := newE2E(t)
	other := &e2eEnv{t: t, w: e.w, bin: e.bin, rootfs: e.rootfs}
	other.d = enforcerd.New(e.bin, e.w, t.TempDir(), "--pool", "10.21.0.0/16")
	other.d.Prefix = "f" + e.w.ID[:5]
	if left := other.objects(); !left.empty() {
		t.Fatalf("objects of prefix %s exist before the test: %s", other.d.Prefix, left)
	}
	t.Cleanup(other.cleanup)
	other.start()

	e.create("box", "--allow", "api.e2e.test")
	e.create("sealed")
	e.createNetOnly("net", "--egress", "public")
	if rcode, _ := e2eLookup(t, e.nsPath("box"), "api.e2e.test"); rcode != dns.RcodeSuccess {
		t.Fatalf("box: api.e2e.test: %s", dns.RcodeToString[rcode])
	}
	// A process that outlives its exec: the reap must take it down too.
	e.mustSh("box", "setsid sleep 4244 </dev/null >/dev/null 2>&1 &")
	for deadline := time.Now().Add(3 * time.Second); len(e2eProcesses("sleep", "4244")) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("box: the background sleep 4244 does not run")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// An exec that runs through the reap: its holder and its record must go too.
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	held, err := e.d.Client().ExecDetach(ctx, "box", api.ExecRequest{Args: []string{"sleep", "4248"}})
	if err != nil {
		t.Fatal(err)
	}
	execs := filepath.Join(e.d.StateDir, "execs")
	if _, err := os.Stat(filepath.Join(execs, "box", held.ID, "holder.pid")); err != nil {
		t.Fatalf("exec record: %v", err)
	}
	holders := holderPids(e.d.StateDir)
	if len(holders) != 1 {
		t.Fatalf("holders of %s: %v, want one", e.d.StateDir, holders)
	}
	keep := other.create("keep", "--allow", "api.e2e.test")
	otherDNS := netip.MustParseAddrPort("10.21.255.254:53")
	lookupOther := func(when string) {
		t.Helper()
		m, err := world.Lookup(other.nsPath("keep"), otherDNS, "api.e2e.test", dns.TypeA, false, world.ReachTimeout)
		if err != nil || m.Rcode != dns.RcodeSuccess || len(world.AddrsOf(m)) == 0 {
			t.Errorf("%s: keep: api.e2e.test through %s: %v %v", when, otherDNS, m, err)
		}
	}
	lookupOther("before the reap")
	e.expectConsistent("before the reap")
	otherBefore := other.expectConsistent("before the reap")
	objects := other.objects()
	if o := e.objects(); len(o.Netns) != 3 || len(o.Records) != 3 || len(o.NftGuests) == 0 || !o.Table || !o.Cgroups {
		t.Fatalf("objects before the reap: %s", o)
	}

	if err := e.d.Stop(); err != nil {
		t.Fatalf("stop enforcerd: %v", err)
	}
	out, err := e.d.Reap()
	if err != nil {
		t.Fatalf("enforcerd reap: %v\n%s", err, out)
	}
	for _, want := range []string{"box", "sealed", "net"} {
		if !strings.Contains(out, want) {
			t.Errorf("enforcerd reap did not log the removal of %s:\n%s", want, out)
		}
	}
	e.expectObjects(t, "after enforcerd reap", e2eObjects{})
	if left := e2eProcesses("sleep", "4244"); len(left) > 0 {
		t.Errorf("processes of a reaped sandbox still run: %v", left)
	}
	if _, err := os.Stat(execs); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("exec records after the reap: %v", err)
	}
	if processAlive(holders[0]) || len(holderPids(e.d.StateDir)) > 0 {
		t.Errorf("exec holder %d runs after the reap", holders[0])
	}
	if !strings.Contains(out, "removed exec record") {
		t.Errorf("enforcerd reap did not log the exec record's removal:\n%s", out)
	}
	// The instance registry (/run/enforcerd/instances) keeps no record of the prefix; the other
	// daemon's stays (so does the directory, which it uses).
	if recs, _ := filepath.Glob("/run/enforcerd/instances/*-" + e.d.Prefix + ".json"); len(recs) > 0 {
		t.Errorf("instance records of %s after the reap: %v", e.d.Prefix, recs)
	}
	if recs, _ := filepath.Glob("/run/enforcerd/instances/*-" + other.d.Prefix + ".json"); len(recs) != 1 {
		t.Errorf("instance records of the other daemon %s after the reap: %v, want one", other.d.Prefix, recs)
	}

	// The other prefix: untouched, and its session still works.
	if got := other.objects(); !reflect.DeepEqual(got, objects) {
		t.Errorf("reap of %s changed the objects of %s:\n got  %s\n want %s", e.d.Prefix, other.d.Prefix, got, objects)
	}
	if got := other.list(); !slices.EqualFunc(got, otherBefore, func(a, b api.SessionInfo) bool { return a.Name == b.Name }) {
		t.Errorf("after the reap the other daemon lists %v", e2eNames(got))
	}
	lookupOther("after the reap")
	e2eExpect(t,
		e2eTCP(other.nsPath("keep"), "198.18.1.10:7", e2eReach),
		e2eTCP(other.nsPath("keep"), "198.18.1.11:7", e2eRejected),
	)
	if out := other.mustSh("keep", "echo ok"); out != "ok\n" {
		t.Errorf("exec in the other prefix's session: %q", out)
	}
	if keep.GuestIP == "" || !strings.HasPrefix(keep.GuestIP, "10.21.") {
		t.Errorf("keep: guest %q, want one from 10.21.0.0/16", keep.GuestIP)
	}

	// Reap is idempotent.
	if out, err := e.d.Reap(); err != nil {
		t.Errorf("second enforcerd reap: %v\n%s", err, out)
	}
	e.expectObjects(t, "after a second reap", e2eObjects{})
}
