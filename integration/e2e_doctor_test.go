package integration

// `enforcerd doctor` in the test world's simulated host: it passes there
// (table and --json), each seeded problem makes it exit 1 naming its check
// (and, for the checks serve refuses on, makes serve refuse in one line
// naming it), and removing the problem makes it pass again. `doctor
// --datapath` proves enforcement with throwaway sessions and leaves nothing
// of their prefix.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/api/apitest"
	"github.com/enforcerd/enforcerd/doctor"
	"github.com/enforcerd/enforcerd/integration/enforcerd"
	"github.com/enforcerd/enforcerd/integration/world"
)

// doctorChecks are the checks doctor runs without --datapath, in order.
var doctorChecks = []string{
	doctor.CheckRoot, doctor.CheckNetnsVeth, doctor.CheckNftables, doctor.CheckProcSysNet, doctor.CheckOverlay, doctor.CheckSeccomp,
	doctor.CheckCgroup, doctor.CheckPropagation, doctor.CheckForeignLinks, doctor.CheckPoolOverlap,
	doctor.CheckForwardDrop, doctor.CheckLegacyTables, doctor.CheckUpstreams, doctor.CheckUnits, doctor.CheckRunning,
}

// doctorRun is one run of enforcerd doctor.
type doctorRun struct {
	out, errOut string
	code        int
	rows        map[string]string // check -> status, from the table
}

// doctor runs `enforcerd doctor` with the daemon's options (its socket
// among them) in the world's host netns; uid, when not 0, runs it as that
// user. Unless args name --units-dir, it looks for units in an empty
// directory (not the machine's).
func (e *e2eEnv) doctor(uid int, args ...string) doctorRun {
	e.t.Helper()
	return e.doctorIn("", uid, args...)
}

// doctorIn is doctor run in a mount namespace of its own (unshare -m, all
// mounts private: nothing reaches the machine's), after the shell commands
// of prelude; "" runs it in the test's mount namespace.
func (e *e2eEnv) doctorIn(prelude string, uid int, args ...string) doctorRun {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	argv := []string{"--net=" + e.w.HostPath}
	bin := e.bin
	if uid != 0 {
		argv = append(argv, "--setuid="+strconv.Itoa(uid), "--setgid="+strconv.Itoa(uid))
		bin = e2eCopyForOtherUsers(e.t, e.bin) // (the clone may live in a 0700 directory)
	}
	argv = append(argv, bin, "doctor",
		"--name-prefix", e.d.Prefix, "--state-dir", e.d.StateDir, "--socket", e.d.Socket,
		"--upstream", e.w.DNS.Addr().String(), "--public-override", e.w.PublicOverride.String())
	if !slices.Contains(args, "--units-dir") {
		argv = append(argv, "--units-dir", e.emptyDir())
	}
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, "nsenter", argv...)
	if prelude != "" {
		cmd = exec.CommandContext(ctx, "unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", prelude + ` && exec nsenter "$@"`, "sh"}, argv...)...)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	r := doctorRun{out: out.String(), errOut: errOut.String(), rows: map[string]string{}}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		e.t.Fatalf("run enforcerd doctor %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	for _, line := range strings.Split(r.out, "\n")[1:] {
		if f := strings.Fields(line); len(f) >= 2 {
			r.rows[f[0]] = f[1]
		}
	}
	return r
}

// emptyDir is a directory anyone may read, with nothing in it.
func (e *e2eEnv) emptyDir() string {
	e.t.Helper()
	dir, err := os.MkdirTemp("", "enforcerd-units-")
	if err != nil {
		e.t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	e.t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// expectPass checks that doctor exited 0 with no failed row.
func (r doctorRun) expectPass(t *testing.T, what string, checks []string) {
	t.Helper()
	if r.code != 0 || r.errOut != "" {
		t.Fatalf("%s: doctor exit %d, stderr %q, want 0 and nothing\n%s", what, r.code, r.errOut, r.out)
	}
	for _, c := range checks {
		if st := r.rows[c]; st != doctor.StatusOK && st != doctor.StatusWarn {
			t.Errorf("%s: check %s is %q, want ok or warn\n%s", what, c, st, r.out)
		}
	}
}

// expectFail checks that doctor exited 1 with exactly the failed checks,
// named in one line on stderr.
func (r doctorRun) expectFail(t *testing.T, what string, failed ...string) {
	t.Helper()
	if r.code != 1 {
		t.Fatalf("%s: doctor exit %d, want 1\n%s%s", what, r.code, r.out, r.errOut)
	}
	e2eOneLine(t, what, r.errOut)
	if !strings.HasSuffix(strings.TrimSpace(r.errOut), strings.Join(failed, ", ")) {
		t.Errorf("%s: stderr %q, want it to name %v", what, r.errOut, failed)
	}
	var got []string
	for _, c := range append(doctorChecks, doctor.CheckDatapath) {
		if r.rows[c] == doctor.StatusFail {
			got = append(got, c)
		}
	}
	if strings.Join(got, ",") != strings.Join(failed, ",") {
		t.Errorf("%s: failed rows %v, want %v\n%s", what, got, failed, r.out)
	}
}

// expectServeRefused checks that serve refuses to start, in one line
// naming the check.
func (e *e2eEnv) expectServeRefused(check string) {
	e.t.Helper()
	if err := e.d.Start(); err == nil {
		e.d.Stop()
		e.t.Fatalf("serve started despite a failing %s check", check)
	}
	log := e.d.Log()
	e2eOneLine(e.t, "serve refusal", log)
	if want := "enforcerd serve: preflight check " + check + " failed: "; !strings.HasPrefix(log, want) {
		e.t.Errorf("serve refusal %q, want it to start with %q", log, want)
	}
	e.d.LogPath = e.d.LogPath + ".next" // the next start logs afresh
}

// addSeedLink adds a link to the world's host: a dummy, or an empty bridge
// where the kernel has no dummy type. The returned func removes it.
func (e *e2eEnv) addSeedLink(name string, addr string) func() {
	e.t.Helper()
	h, err := netlink.NewHandleAt(e.w.Host)
	if err != nil {
		e.t.Fatal(err)
	}
	attrs := netlink.LinkAttrs{Name: name}
	err = h.LinkAdd(&netlink.Dummy{LinkAttrs: attrs})
	if errors.Is(err, unix.EOPNOTSUPP) {
		err = h.LinkAdd(&netlink.Bridge{LinkAttrs: attrs})
	}
	if err != nil {
		h.Close()
		e.t.Fatalf("add link %s: %v", name, err)
	}
	remove := func() {
		if l, err := h.LinkByName(name); err == nil {
			if err := h.LinkDel(l); err != nil {
				e.t.Errorf("remove link %s: %v", name, err)
			}
		}
	}
	if addr != "" {
		l, err := h.LinkByName(name)
		if err == nil {
			a, _ := netlink.ParseAddr(addr)
			err = h.AddrAdd(l, a)
		}
		if err != nil {
			remove()
			h.Close()
			e.t.Fatalf("address %s on %s: %v", addr, name, err)
		}
	}
	done := false
	cleanup := func() {
		if !done {
			done = true
			remove()
			h.Close()
		}
	}
	e.t.Cleanup(cleanup)
	return cleanup
}

// addForwardDrop adds the table "inet <name>" with a forward base chain
// whose policy is drop to the world's host. The returned func removes it.
func (e *e2eEnv) addForwardDrop(name string) func() {
	e.t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(e.w.Host)))
	if err != nil {
		e.t.Fatal(err)
	}
	table := c.AddTable(&nftables.Table{Name: name, Family: nftables.TableFamilyINet})
	drop := nftables.ChainPolicyDrop
	c.AddChain(&nftables.Chain{Name: "forward", Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	if err := c.Flush(); err != nil {
		e.t.Fatalf("add table inet %s: %v", name, err)
	}
	done := false
	cleanup := func() {
		if done {
			return
		}
		done = true
		c.DelTable(table)
		if err := c.Flush(); err != nil {
			e.t.Errorf("remove table inet %s: %v", name, err)
		}
	}
	e.t.Cleanup(cleanup)
	return cleanup
}

func TestE2EDoctorPasses(t *testing.T) {
	e := prepareE2E(t, "")
	r := e.doctor(0)
	r.expectPass(t, "clean world host", doctorChecks)
	if !strings.HasPrefix(r.out, "CHECK") || len(r.rows) != len(doctorChecks) {
		t.Errorf("table has %d rows, want %d under a CHECK STATUS DETAIL header:\n%s", len(r.rows), len(doctorChecks), r.out)
	}
	// The world's host is fresh: every check is ok there, none only warns.
	for _, c := range []string{doctor.CheckForwardDrop, doctor.CheckLegacyTables, doctor.CheckPropagation, doctor.CheckPoolOverlap, doctor.CheckUpstreams,
		doctor.CheckProcSysNet, doctor.CheckCgroup, doctor.CheckUnits, doctor.CheckRunning} {
		if r.rows[c] != doctor.StatusOK {
			t.Errorf("check %s is %q in a fresh world host, want ok\n%s", c, r.rows[c], r.out)
		}
	}

	js := e.doctor(0, "--json")
	var got struct {
		Failed bool           `json:"failed"`
		Checks []doctor.Check `json:"checks"`
	}
	if js.code != 0 {
		t.Fatalf("doctor --json: exit %d\n%s%s", js.code, js.out, js.errOut)
	}
	if err := json.Unmarshal([]byte(js.out), &got); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, js.out)
	}
	var names []string
	for _, c := range got.Checks {
		names = append(names, c.Name)
		if c.Detail == "" {
			t.Errorf("doctor --json: check %s has no detail", c.Name)
		}
	}
	if got.Failed || strings.Join(names, ",") != strings.Join(doctorChecks, ",") {
		t.Errorf("doctor --json: failed %v, checks %v; want false, %v", got.Failed, names, doctorChecks)
	}
	// serve starts on the same host (its fatal checks pass).
	e.start()
}

func TestE2EDoctorNotRoot(t *testing.T) {
	e := prepareE2E(t, "")
	r := e.doctor(65534)
	r.expectFail(t, "as uid 65534", doctor.CheckRoot)
	if r.rows[doctor.CheckNftables] != doctor.StatusWarn || !strings.Contains(r.out, "not checked: needs root") {
		t.Errorf("as uid 65534: the kernel checks should be skipped with a warning\n%s", r.out)
	}
}

// Each fatal host problem fails doctor and serve's start, naming the check.
func TestE2EDoctorFatalSeeds(t *testing.T) {
	e := prepareE2E(t, "")
	for _, seed := range []struct {
		check string
		add   func() func()
	}{
		// An uplink named like the daemon's veths would be cut off.
		{doctor.CheckForeignLinks, func() func() { return e.addSeedLink(e.d.Prefix+"up", "") }},
		// The host already numbers addresses of the default pool 10.20.0.0/16.
		{doctor.CheckPoolOverlap, func() func() { return e.addSeedLink(e.w.UniqueName("xp"), "10.20.7.1/24") }},
	} {
		remove := seed.add()
		e.doctor(0).expectFail(t, "seeded "+seed.check, seed.check)
		e.expectServeRefused(seed.check)
		remove()
		if left := e.objects(); !left.empty() {
			t.Errorf("the refused serve left objects of %s: %s", e.d.Prefix, left)
		}
		e.doctor(0).expectPass(t, seed.check+" removed", doctorChecks)
	}
}

// Non-fatal problems fail doctor, naming the check; serve still starts.
func TestE2EDoctorOtherSeeds(t *testing.T) {
	e := prepareE2E(t, "")
	// Another table dropping forwarded traffic: the datapath check sees the
	// accepted packet go undelivered.
	remove := e.addForwardDrop(e.w.UniqueName("xf"))
	r := e.doctor(0, "--datapath")
	r.expectFail(t, "forward drop", doctor.CheckForwardDrop, doctor.CheckDatapath)
	if !strings.Contains(r.out, "never delivered") {
		t.Errorf("datapath under a forward drop: want it to report the packet undelivered\n%s", r.out)
	}
	e.start() // not a check serve refuses on: sessions fail closed
	remove()
	e.doctor(0).expectPass(t, "forward drop removed", doctorChecks)

	// An upstream that does not answer (a port of the world's resolver
	// nothing listens on).
	silent := net.JoinHostPort(e.w.DNS.Addr().Addr().String(), "5353")
	e.doctor(0, "--upstream", silent).expectFail(t, "silent upstream", doctor.CheckUpstreams)
}

var throwawayRE = regexp.MustCompile(`nothing of prefix (dr[a-z0-9]{4}) left`)

func TestE2EDoctorDatapath(t *testing.T) {
	e := prepareE2E(t, "")
	for _, running := range []bool{false, true} {
		if running {
			e.start() // beside a live daemon: its table must not judge the throwaway sessions
		}
		r := e.doctor(0, "--datapath")
		r.expectPass(t, "doctor --datapath", append(doctorChecks, doctor.CheckDatapath))
		if r.rows[doctor.CheckDatapath] != doctor.StatusOK {
			t.Fatalf("datapath %q, want ok\n%s", r.rows[doctor.CheckDatapath], r.out)
		}
		m := throwawayRE.FindStringSubmatch(r.out)
		if m == nil {
			t.Fatalf("datapath detail names no throwaway prefix:\n%s", r.out)
		}
		if left := e2eReadObjects(t, e.w, m[1], t.TempDir()); !left.empty() {
			t.Errorf("doctor --datapath left objects of %s: %s", m[1], left)
		}
	}
}

// detail is the DETAIL column of check's row in a table run.
func (r doctorRun) detail(check string) string {
	for _, line := range strings.Split(r.out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == check {
			return strings.Join(f[2:], " ")
		}
	}
	return ""
}

// cgroupMounts lists the cgroup (v1) and cgroup2 mount points of this
// mount namespace. It reads the calling thread's mountinfo, not
// /proc/self's: that is the main thread's view, and a test process's main
// thread may be one an in-process sandbox create wedged with a file system
// state of its own (container.mountIn's thread; once such a view listed
// no cgroup mount).
func cgroupMounts(t *testing.T) []string {
	t.Helper()
	runtime.LockOSThread()
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 5 && len(g) >= 1 && (g[0] == "cgroup" || g[0] == "cgroup2") {
			out = append(out, f[4])
		}
	}
	if len(out) == 0 {
		t.Fatalf("no cgroup mount in /proc/thread-self/mountinfo (%d lines):\n%s", strings.Count(string(b), "\n"), b)
	}
	return out
}

// TestE2EDoctorReadOnlyKernelFiles: doctor in a mount namespace where the
// cgroup hierarchies are remounted read-only fails cgroup, and where
// /proc/sys is (as some container runtimes mount it) fails proc-sys-net,
// on which serve also refuses to start. Control: the same mount namespace
// without the remount passes.
func TestE2EDoctorReadOnlyKernelFiles(t *testing.T) {
	e := prepareE2E(t, "")
	world.RequireTool(t, "unshare") // util-linux (PKGS)
	world.RequireTool(t, "mount")   // Debian's mount, priority required
	e.doctorIn("true", 0).expectPass(t, "own mount namespace, nothing remounted", doctorChecks)

	var remount []string
	for _, m := range cgroupMounts(t) {
		remount = append(remount, "mount -o remount,ro,bind "+m)
	}
	r := e.doctorIn(strings.Join(remount, " && "), 0)
	r.expectFail(t, "cgroups read-only", doctor.CheckCgroup)
	if d := r.detail(doctor.CheckCgroup); !strings.Contains(d, "is on a read-only mount: sandboxes cannot be made") {
		t.Errorf("cgroups read-only: detail %q, want it to say the cgroup dir is on a read-only mount", d)
	}

	const roProcSys = "mount --bind /proc/sys /proc/sys && mount -o remount,ro,bind /proc/sys"
	r = e.doctorIn(roProcSys, 0)
	r.expectFail(t, "/proc/sys read-only", doctor.CheckProcSysNet)
	if d := r.detail(doctor.CheckProcSysNet); !strings.Contains(d, "write /proc/sys/net/ipv4/ip_forward in a throwaway netns: ") || !strings.Contains(d, "read-only") {
		t.Errorf("/proc/sys read-only: detail %q, want the refused write named", d)
	}
	// serve refuses on it too, before any kernel change.
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	serve := exec.CommandContext(ctx, "unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", roProcSys + ` && exec nsenter "$@"`, "sh",
		"--net=" + e.w.HostPath, e.bin}, e.d.ServeArgs()...)...)
	serve.Env = enforcerd.Environ() // (the text log a daemon writes off systemd, even when the tests run under it)
	out, err := serve.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.HasPrefix(string(out), "enforcerd serve: preflight check proc-sys-net failed: ") {
		t.Errorf("serve under a read-only /proc/sys: %v, output %q; want exit 1 naming the check", err, out)
	}
	e2eOneLine(t, "serve under a read-only /proc/sys", string(out))
	if left := e.objects(); !left.empty() {
		t.Errorf("the refused serve left objects of %s: %s", e.d.Prefix, left)
	}
}

// serveDNSRcode serves, in the world's internet, a DNS server at addr that
// answers every query with rcode.
func serveDNSRcode(t *testing.T, w *world.World, addr netip.AddrPort, rcode int) {
	t.Helper()
	pc, err := world.ListenUDP(w.NetPath, addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(rw dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(req, rcode)
		rw.WriteMsg(m)
	})}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
}

// TestE2EDoctorUpstreamRcodes: an upstream that answers REFUSED or
// SERVFAIL fails upstreams, naming it and the rcode; the world's resolver
// (which answers NXDOMAIN for the root, having no zone for it) passes.
func TestE2EDoctorUpstreamRcodes(t *testing.T) {
	e := prepareE2E(t, "")
	resolver := e.w.DNS.Addr().Addr()
	e.doctor(0).expectPass(t, "the world's resolver", doctorChecks)
	for i, rc := range []int{dns.RcodeRefused, dns.RcodeServerFailure} {
		at := netip.AddrPortFrom(resolver, uint16(5400+i))
		serveDNSRcode(t, e.w, at, rc)
		r := e.doctor(0, "--upstream", at.String())
		r.expectFail(t, "upstream answering "+dns.RcodeToString[rc], doctor.CheckUpstreams)
		if want := fmt.Sprintf("upstream %s answered %s", at, dns.RcodeToString[rc]); !strings.Contains(r.detail(doctor.CheckUpstreams), want) {
			t.Errorf("%s: detail %q, want %q", dns.RcodeToString[rc], r.detail(doctor.CheckUpstreams), want)
		}
	}
}

// TestE2EDoctorUnits: a socket unit in the directory --units-dir names is
// compared with the config: the shipped unit pointed at the daemon's socket
// matches; a socket-group the unit does not grant, and a pool whose DNS
// address the unit does not bind, fail naming both values; a drop-in that
// grants the group makes it match again.
func TestE2EDoctorUnits(t *testing.T) {
	e := prepareE2E(t, "")
	dir := e.emptyDir()
	shipped, err := os.ReadFile(filepath.Join("..", "scripts", "enforcerd.socket"))
	if err != nil {
		t.Fatal(err)
	}
	unit := strings.Replace(string(shipped), "ListenStream=/run/enforcerd/enforcerd.sock", "ListenStream="+e.d.Socket, 1)
	if err := os.WriteFile(filepath.Join(dir, doctor.SocketUnitName), []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	r := e.doctor(0, "--units-dir", dir)
	r.expectPass(t, "the shipped unit", doctorChecks)
	if d := r.detail(doctor.CheckUnits); !strings.Contains(d, "matches the config") {
		t.Errorf("the shipped unit: units %q, want it to match", d)
	}

	r = e.doctor(0, "--units-dir", dir, "--socket-group", "65534")
	r.expectFail(t, "socket-group only in the config", doctor.CheckUnits)
	for _, want := range []string{`SocketGroup=unset (root only), but the config's socket-group is "65534"`, `SocketMode=0600, but the config wants 0660 (socket-group "65534")`} {
		if !strings.Contains(r.detail(doctor.CheckUnits), want) {
			t.Errorf("socket-group: detail %q, want %q", r.detail(doctor.CheckUnits), want)
		}
	}
	r = e.doctor(0, "--units-dir", dir, "--pool", "10.21.0.0/16")
	r.expectFail(t, "pool only in the config", doctor.CheckUnits)
	if want := "ListenDatagram=10.20.255.254:53, but the pool 10.21.0.0/16 resolves through 10.21.255.254:53"; !strings.Contains(r.detail(doctor.CheckUnits), want) {
		t.Errorf("pool: detail %q, want %q", r.detail(doctor.CheckUnits), want)
	}

	if err := os.MkdirAll(filepath.Join(dir, doctor.SocketUnitName+".d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, doctor.SocketUnitName+".d", "group.conf"), []byte("[Socket]\nSocketGroup=65534\nSocketMode=0660\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.doctor(0, "--units-dir", dir, "--socket-group", "65534").expectPass(t, "the group granted by a drop-in", doctorChecks)
}

// serveFakeDaemon serves the API of an in-memory engine that says it runs
// version on a socket of its own, and returns the socket.
func serveFakeDaemon(t *testing.T, build api.HandlerOptions, unhealthy error) string {
	t.Helper()
	eng := apitest.New()
	eng.Unhealthy = unhealthy
	sock := filepath.Join(t.TempDir(), "fake.sock")
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- api.ListenAndServe(ctx, api.ListenConfig{Socket: sock}, api.NewHandler(eng, build), func() { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("serve a fake daemon: %v", err)
	}
	t.Cleanup(func() { cancel(); <-done })
	return sock
}

// TestE2EDoctorRunningDaemon: with no daemon, daemon is ok (nothing runs);
// with the test daemon it is ok, healthy and of this binary's version;
// a daemon whose table was removed behind its back fails as unhealthy; a
// daemon of another version warns (exit 0), naming both versions.
func TestE2EDoctorRunningDaemon(t *testing.T) {
	e := prepareE2E(t, "")
	r := e.doctor(0)
	r.expectPass(t, "no daemon", doctorChecks)
	if d := r.detail(doctor.CheckRunning); !strings.HasPrefix(d, "no daemon running") {
		t.Errorf("no daemon: detail %q", d)
	}
	e.start()
	r = e.doctor(0)
	r.expectPass(t, "the test daemon", doctorChecks)
	if d := r.detail(doctor.CheckRunning); !strings.Contains(d, "is healthy and runs version ") || r.rows[doctor.CheckRunning] != doctor.StatusOK {
		t.Errorf("the test daemon: %s %q, want ok and healthy", r.rows[doctor.CheckRunning], d)
	}

	// Another version, healthy: a warning, exit 0.
	old := serveFakeDaemon(t, api.HandlerOptions{Version: "0.0.9-old"}, nil)
	r = e.doctor(0, "--socket", old)
	r.expectPass(t, "a daemon of another version", doctorChecks)
	if d := r.detail(doctor.CheckRunning); r.rows[doctor.CheckRunning] != doctor.StatusWarn || !strings.Contains(d, "runs version 0.0.9-old, this binary is ") {
		t.Errorf("version skew: %s %q, want warn naming both versions", r.rows[doctor.CheckRunning], d)
	}

	// The same version string built from another commit (two dev builds):
	// a warning naming both commits.
	out, err := exec.Command(e.bin, "version", "--json", "--socket", filepath.Join(t.TempDir(), "none.sock")).Output()
	if err != nil {
		t.Fatalf("version --json: %v", err)
	}
	var mine struct{ Version, Commit string }
	if err := json.Unmarshal(out, &mine); err != nil || mine.Commit == "" {
		t.Fatalf("version --json: %q (%v), want this binary's version and commit", out, err)
	}
	otherCommit := serveFakeDaemon(t, api.HandlerOptions{Version: mine.Version, Commit: "feedfacecafe"}, nil)
	r = e.doctor(0, "--socket", otherCommit)
	if d := r.detail(doctor.CheckRunning); r.rows[doctor.CheckRunning] != doctor.StatusWarn || !strings.Contains(d, "built from commit feedfacecafe, this binary from "+mine.Commit) {
		t.Errorf("commit skew: %s %q, want warn naming both commits", r.rows[doctor.CheckRunning], d)
	}
	sameBuild := serveFakeDaemon(t, api.HandlerOptions{Version: mine.Version, Commit: mine.Commit}, nil)
	r = e.doctor(0, "--socket", sameBuild)
	if r.rows[doctor.CheckRunning] != doctor.StatusOK {
		t.Errorf("the same build: %s %q, want ok (control)", r.rows[doctor.CheckRunning], r.detail(doctor.CheckRunning))
	}

	// The test daemon made unhealthy: its table removed behind its back.
	c, err := nftables.New(nftables.WithNetNSFd(int(e.w.Host)))
	if err != nil {
		t.Fatal(err)
	}
	c.DelTable(&nftables.Table{Name: e.d.Prefix, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil {
		t.Fatalf("remove the daemon's table: %v", err)
	}
	r = e.doctor(0)
	r.expectFail(t, "the daemon's table removed", doctor.CheckRunning)
	if d := r.detail(doctor.CheckRunning); !strings.Contains(d, "is unhealthy: ") {
		t.Errorf("unhealthy daemon: detail %q", d)
	}
	// Stopped here: the cleanup's check of a running daemon's objects
	// expects its table.
	start := time.Now()
	if err := e.d.Stop(); err != nil {
		t.Fatalf("stop the unhealthy daemon: %v", err)
	}
	t.Logf("the unhealthy daemon stopped in %s", time.Since(start).Round(time.Millisecond))
}
