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
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/daemon"
)

// doctorChecks are the checks doctor runs without --datapath, in order.
var doctorChecks = []string{
	daemon.CheckRoot, daemon.CheckNetnsVeth, daemon.CheckNftables, daemon.CheckOverlay, daemon.CheckSeccomp,
	daemon.CheckCgroup, daemon.CheckPropagation, daemon.CheckForeignLinks, daemon.CheckPoolOverlap,
	daemon.CheckForwardDrop, daemon.CheckLegacyTables, daemon.CheckUpstreams,
}

// doctorRun is one run of enforcerd doctor.
type doctorRun struct {
	out, errOut string
	code        int
	rows        map[string]string // check -> status, from the table
}

// doctor runs `enforcerd doctor` with the daemon's options in the world's
// host netns; uid, when not 0, runs it as that user.
func (e *e2eEnv) doctor(uid int, args ...string) doctorRun {
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
		"--name-prefix", e.d.Prefix, "--state-dir", e.d.StateDir,
		"--upstream", e.w.DNS.Addr().String(), "--public-override", e.w.PublicOverride.String())
	cmd := exec.CommandContext(ctx, "nsenter", append(argv, args...)...)
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

// expectPass checks that doctor exited 0 with no failed row.
func (r doctorRun) expectPass(t *testing.T, what string, checks []string) {
	t.Helper()
	if r.code != 0 || r.errOut != "" {
		t.Fatalf("%s: doctor exit %d, stderr %q, want 0 and nothing\n%s", what, r.code, r.errOut, r.out)
	}
	for _, c := range checks {
		if st := r.rows[c]; st != daemon.StatusOK && st != daemon.StatusWarn {
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
	for _, c := range append(doctorChecks, daemon.CheckDatapath) {
		if r.rows[c] == daemon.StatusFail {
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
	for _, c := range []string{daemon.CheckForwardDrop, daemon.CheckLegacyTables, daemon.CheckPropagation, daemon.CheckPoolOverlap, daemon.CheckUpstreams} {
		if r.rows[c] != daemon.StatusOK {
			t.Errorf("check %s is %q in a fresh world host, want ok\n%s", c, r.rows[c], r.out)
		}
	}

	js := e.doctor(0, "--json")
	var got struct {
		Failed bool           `json:"failed"`
		Checks []daemon.Check `json:"checks"`
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
	r.expectFail(t, "as uid 65534", daemon.CheckRoot)
	if r.rows[daemon.CheckNftables] != daemon.StatusWarn || !strings.Contains(r.out, "not checked: needs root") {
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
		{daemon.CheckForeignLinks, func() func() { return e.addSeedLink(e.d.Prefix+"up", "") }},
		// The host already numbers addresses of the default pool 10.20.0.0/16.
		{daemon.CheckPoolOverlap, func() func() { return e.addSeedLink(e.w.UniqueName("xp"), "10.20.7.1/24") }},
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
	r.expectFail(t, "forward drop", daemon.CheckForwardDrop, daemon.CheckDatapath)
	if !strings.Contains(r.out, "never delivered") {
		t.Errorf("datapath under a forward drop: want it to report the packet undelivered\n%s", r.out)
	}
	e.start() // not a check serve refuses on: sessions fail closed
	remove()
	e.doctor(0).expectPass(t, "forward drop removed", doctorChecks)

	// An upstream that does not answer (a port of the world's resolver
	// nothing listens on).
	silent := net.JoinHostPort(e.w.DNS.Addr().Addr().String(), "5353")
	e.doctor(0, "--upstream", silent).expectFail(t, "silent upstream", daemon.CheckUpstreams)
}

var throwawayRE = regexp.MustCompile(`nothing of prefix (dr[a-z0-9]{4}) left`)

func TestE2EDoctorDatapath(t *testing.T) {
	e := prepareE2E(t, "")
	for _, running := range []bool{false, true} {
		if running {
			e.start() // beside a live daemon: its table must not judge the throwaway sessions
		}
		r := e.doctor(0, "--datapath")
		r.expectPass(t, "doctor --datapath", append(doctorChecks, daemon.CheckDatapath))
		if r.rows[daemon.CheckDatapath] != daemon.StatusOK {
			t.Fatalf("datapath %q, want ok\n%s", r.rows[daemon.CheckDatapath], r.out)
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
