package integration

// Restart without loss: the daemon killed (SIGKILL) or stopped (SIGTERM) in
// steady state leaves its sessions enforced by the kernel while it is down,
// and the next start re-adopts them with their attested addresses; killed
// in the middle of creates, the next start leaves every session complete
// and usable or gone, with no orphan.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

func TestE2ERestartAfterKill9(t *testing.T) {
	e2eRestartSteady(t, syscall.SIGKILL)
}

func TestE2ERestartAfterSIGTERM(t *testing.T) {
	e2eRestartSteady(t, syscall.SIGTERM)
}

// e2eEcho sends a message over an open connection to an echo server and
// checks the echo.
func e2eEcho(t *testing.T, what string, c net.Conn) {
	t.Helper()
	msg := []byte("still there " + what)
	got := make([]byte, len(msg))
	c.SetDeadline(time.Now().Add(world.ReachTimeout))
	_, err := c.Write(msg)
	if err == nil {
		_, err = io.ReadFull(c, got)
	}
	if err == nil && !bytes.Equal(got, msg) {
		err = fmt.Errorf("echo %q, want %q", got, msg)
	}
	if err != nil {
		t.Errorf("%s: the established connection broke: %v", what, err)
	}
}

func e2eRestartSteady(t *testing.T, sig syscall.Signal) {
	e := newE2E(t)
	agent := e.create("agent", "--allow", "api.e2e.test")
	e.create("sealed")
	lab := e.createNetOnly("lab", "--lab")
	e.createNetOnly("peer", "--lab-peer", "lab")
	e.createNetOnly("open", "--egress", "public")
	ans, pns, ons := e.nsPath("agent"), e.nsPath("peer"), e.nsPath("open")
	labEcho := netip.MustParseAddrPort(lab.GuestIP + ":7")
	e2eServeTCPEcho(t, e.nsPath("lab"), labEcho)

	if rcode, addrs := e2eLookup(t, ans, "api.e2e.test"); rcode != dns.RcodeSuccess || !slices.Equal(addrs, []string{"198.18.1.10"}) {
		t.Fatalf("api.e2e.test: %s %v", dns.RcodeToString[rcode], addrs)
	}
	guest := netip.MustParseAddr(agent.GuestIP)
	attested := e2eAttested(e.inspect("agent"))
	if !slices.Equal(attested, []string{"198.18.1.10"}) {
		t.Fatalf("agent: attested %v before the restart", attested)
	}
	conn, err := world.DialTCP(ans, netip.MustParseAddrPort("198.18.1.10:7"), world.ReachTimeout)
	if err != nil {
		t.Fatalf("agent: connect to the attested 198.18.1.10:7: %v", err)
	}
	defer conn.Close()
	e2eEcho(t, "before the restart", conn)
	// A new TCP flow to an attested address is held for the name check
	// (the default): while the daemon is down nobody reads the queue and
	// the kernel drops its SYN (fail closed; the client's retry gets
	// through once it is back, TestE2ENameCheckRestart), where the
	// established connection and every flow that needs no name keep going.
	enforced := func(when string, down bool) {
		t.Helper()
		attested := e2eReach
		if down {
			attested = e2eDropped
		}
		e2eExpect(t,
			e2eTCP(ans, "198.18.1.10:7", attested), // attested: allowed stays allowed, checked by name
			e2eTCP(ans, "198.18.1.11:7", e2eRejected),
			e2eHTTP(ans, "169.254.169.254", e2eRejected),
			e2eTCP(pns, labEcho.String(), e2eReach),
			e2eTCP(ons, labEcho.String(), e2eRejected),
			e2eTCP(pns, "198.18.1.10:7", e2eRejected),
			e2eHTTP(ons, "198.18.2.10", e2eReach),
			e2eHTTP(ons, "10.99.0.10", e2eRejected),
		)
		e2eEcho(t, when, conn)
		if got := e2eNftAttested(t, e.w, e.d.Prefix, guest); !slices.Equal(got, []string{"198.18.1.10"}) {
			t.Errorf("%s: the kernel's attested set for agent is %v, want [198.18.1.10]", when, got)
		}
	}
	enforced("before the restart", false)
	objects := e.objects()

	if err := e.d.Signal(sig); err != nil {
		t.Fatalf("%s: %v", sig, err)
	}
	if done, _ := e.d.Exited(); !done {
		t.Fatalf("enforcerd still runs after %s", sig)
	}
	// Down: the kernel keeps enforcing; the CLI says it cannot reach it.
	enforced("while the daemon is down", true)
	if got := e.objects(); !reflect.DeepEqual(got, objects) {
		t.Errorf("objects changed while the daemon was down:\n got  %s\n want %s", got, objects)
	}
	msg := e.expectFail(1, "session", "ls")
	if !strings.Contains(msg, "cannot reach enforcerd") {
		t.Errorf("session ls while down: %q", msg)
	}

	e.start()
	list := e.expectConsistent("after the restart")
	if got := e2eNames(list); !slices.Equal(got, []string{"agent", "lab", "open", "peer", "sealed"}) {
		t.Errorf("after the restart the daemon lists %v", got)
	}
	if got := e2eAttested(e.inspect("agent")); !slices.Equal(got, attested) {
		t.Errorf("agent: attested %v after the restart, want %v (kept)", got, attested)
	}
	enforced("after the restart", false)
	// Usable: exec, DNS (allowed and denied), and the lifecycle says so.
	if out := e.mustSh("agent", "echo alive"); out != "alive\n" {
		t.Errorf("exec in agent after the restart: %q", out)
	}
	if out := e.mustSh("sealed", "ip -o link | wc -l"); strings.TrimSpace(out) != "1" {
		t.Errorf("sealed after the restart: %q links", out)
	}
	if out, code := e.nslookup("agent", "api.e2e.test"); code != 0 || !slices.Contains(world.NslookupAddrs(out), "198.18.1.10") {
		t.Errorf("agent: nslookup api.e2e.test after the restart: exit %d\n%s", code, out)
	}
	if rcode, _ := e2eLookup(t, ans, "other.e2e.test"); rcode != dns.RcodeNameError {
		t.Errorf("agent: other.e2e.test after the restart: %s, want NXDOMAIN", dns.RcodeToString[rcode])
	}
	evs := e2eParseEvents(t, "agent", e.cli("session", "events", "agent"))
	if !e2eHasEvent(evs, "lifecycle", "adopted", "") || !e2eHasEvent(evs, "dns", "allowed", "api.e2e.test.") {
		t.Errorf("agent: events after the restart lack adopted or the new decision: %+v", evs)
	}
	// A new session after the restart takes a slot of its own.
	fresh := e.create("fresh", "--allow", "api.e2e.test")
	for _, s := range list {
		if s.GuestIP != "" && s.GuestIP == fresh.GuestIP {
			t.Errorf("fresh got guest %s, already %s's", fresh.GuestIP, s.Name)
		}
	}
	if rcode, addrs := e2eLookup(t, e.nsPath("fresh"), "api.e2e.test"); rcode != dns.RcodeSuccess || len(addrs) == 0 {
		t.Errorf("fresh: api.e2e.test: %s %v", dns.RcodeToString[rcode], addrs)
	}
	e2eExpect(t, e2eTCP(e.nsPath("fresh"), "198.18.1.10:7", e2eReach))
	conn.Close()
	e.expectConsistent("after a create following the restart")
}

// e2eResult is the outcome of one CLI run.
type e2eResult struct {
	code   int
	stderr string
}

// killMidway runs the command lines concurrently and kills the daemon
// (SIGKILL) once `after` of them succeeded (at once when 0) plus a random
// delay up to jitter, so that the others are cut off in flight. It returns
// each command's outcome.
func (e *e2eEnv) killMidway(cmds [][]string, after int, jitter time.Duration, rng *rand.Rand) []e2eResult {
	e.t.Helper()
	type indexed struct {
		i int
		e2eResult
	}
	results := make(chan indexed, len(cmds))
	for i, args := range cmds {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
			defer cancel()
			_, errOut, code, err := e.d.CLIStatus(ctx, args...)
			if err != nil {
				errOut, code = err.Error(), -1
			}
			results <- indexed{i, e2eResult{code, errOut}}
		}()
	}
	out := make([]e2eResult, len(cmds))
	var fire <-chan time.Time
	if after == 0 {
		fire = time.After(time.Duration(rng.Int64N(int64(jitter))))
	}
	got, ok := 0, 0
	for fire == nil || got < len(cmds) {
		select {
		case r := <-results:
			out[r.i] = r.e2eResult
			got++
			if r.code == 0 {
				ok++
			}
			if fire == nil && (ok >= after || got == len(cmds)) {
				fire = time.After(time.Duration(rng.Int64N(int64(jitter))))
			}
			continue
		case <-fire:
		}
		break
	}
	if err := e.d.Kill(); err != nil {
		e.t.Fatalf("kill -9: %v", err)
	}
	for ; got < len(cmds); got++ {
		r := <-results
		out[r.i] = r.e2eResult
	}
	return out
}

// The daemon is killed while creates are in flight, three times (early,
// after the first create is confirmed, after half are); after each restart
// every session is complete and usable or gone with no orphan, and every
// create the CLI reported as done survived. Then the same for deletes.
func TestE2ERestartKillDuringCreate(t *testing.T) {
	e := newE2E(t)
	e.create("steady", "--allow", "api.e2e.test")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	var confirmed []string
	interrupted := 0
	for round, after := range []int{0, 1, 4} {
		var cmds [][]string
		var names []string
		for i := range 8 {
			name := string(rune('a'+round)) + string(rune('a'+i))
			args := []string{"session", "create", name, "--allow", "api.e2e.test"}
			if i%2 == 0 {
				args = append(args, "--rootfs", e.rootfs)
			} else {
				args = append(args, "--network-only")
			}
			cmds, names = append(cmds, args), append(names, name)
		}
		done := 0
		for i, r := range e.killMidway(cmds, after, 150*time.Millisecond, rng) {
			switch r.code {
			case 0:
				confirmed = append(confirmed, names[i])
				done++
			case 1:
				interrupted++
				e2eOneLine(t, "create "+names[i]+" cut off by the kill", r.stderr)
			default:
				t.Errorf("round %d: create %s: exit %d: %s", round, names[i], r.code, r.stderr)
			}
		}

		logged := len(e.d.Log())
		e.start()
		list := e.expectConsistent(fmt.Sprintf("after the restart of round %d", round))
		reaped := 0
		for _, line := range strings.Split(e.d.Log()[logged:], "\n") {
			if strings.Contains(line, "reap") {
				reaped++
			}
		}
		t.Logf("round %d: %d of 8 creates confirmed before the kill; the restart reaped %d partial objects", round, done, reaped)
		e.expectUsable(t, list, confirmed, nil)
	}
	t.Logf("%d creates confirmed, %d cut off by the kills", len(confirmed), interrupted)

	var cmds [][]string
	var names []string
	for _, s := range e.list() {
		cmds, names = append(cmds, []string{"session", "rm", s.Name}), append(names, s.Name)
	}
	var deleted []string
	for i, r := range e.killMidway(cmds, 2, 50*time.Millisecond, rng) {
		if r.code == 0 {
			deleted = append(deleted, names[i])
		}
	}
	e.start()
	list := e.expectConsistent("after the restart following the deletes")
	t.Logf("deletes: %d of %d confirmed before the kill, %d sessions left", len(deleted), len(names), len(list))
	e.expectUsable(t, list, nil, deleted)
}

// expectUsable checks that every listed session answers DNS through the
// proxy, reaches the attested address and nothing else, and (with a
// sandbox) runs commands; that every name in present is listed and no name
// in absent is.
func (e *e2eEnv) expectUsable(t *testing.T, list []api.SessionInfo, present, absent []string) {
	t.Helper()
	names := e2eNames(list)
	for _, n := range present {
		if !slices.Contains(names, n) {
			t.Errorf("session %s, whose create was confirmed to the CLI, is gone after the restart", n)
		}
	}
	for _, n := range absent {
		if slices.Contains(names, n) {
			t.Errorf("session %s, whose delete was confirmed to the CLI, is back after the restart", n)
		}
	}
	var probes []e2eProbe
	for _, s := range list {
		ns := e.nsPath(s.Name)
		if rcode, addrs := e2eLookup(t, ns, "api.e2e.test"); rcode != dns.RcodeSuccess || !slices.Equal(addrs, []string{"198.18.1.10"}) {
			t.Errorf("%s: api.e2e.test: %s %v", s.Name, dns.RcodeToString[rcode], addrs)
		}
		probes = append(probes, e2eTCP(ns, "198.18.1.10:7", e2eReach), e2eTCP(ns, "198.18.1.11:7", e2eRejected))
		if s.Sandbox {
			if out := e.mustSh(s.Name, "echo ok"); out != "ok\n" {
				t.Errorf("exec in %s: %q", s.Name, out)
			}
		}
	}
	e2eExpect(t, probes...)
}

// A lab peer whose lab target was removed keeps running: a restart neither
// reaps it nor lets it reach a new lab target that took the old one's name
// (the policy is fixed at create, by address; a restart must not change it).
func TestE2ERestartLabPeerOfRemovedTarget(t *testing.T) {
	e := newE2E(t)
	lab := e.createNetOnly("lab", "--lab")
	e.create("peer", "--lab-peer", "lab")
	echo := e2eServeTCPEcho(t, e.nsPath("lab"), netip.MustParseAddrPort(lab.GuestIP+":7"))
	e2eExpect(t, e2eTCP(e.nsPath("peer"), lab.GuestIP+":7", e2eReach))
	echo.Close() // so that nothing holds the lab's netns once it is removed
	if _, errOut, code := e.run("session", "rm", "lab"); code != 0 {
		// Refusing to remove a target that still has peers is a fine
		// answer too; then there is nothing more to check.
		e2eOneLine(t, "rm of a lab target with a peer", errOut)
		t.Logf("rm lab refused: %s", errOut)
		return
	}
	restart := func(when string, want []string) {
		t.Helper()
		if err := e.d.Stop(); err != nil {
			t.Fatal(err)
		}
		e.start()
		list := e.expectConsistent(when)
		if got := e2eNames(list); !slices.Equal(got, want) {
			t.Fatalf("%s the daemon lists %v, want %v (a restart must not reap a live session)", when, got, want)
		}
		if out := e.mustSh("peer", "echo ok"); out != "ok\n" {
			t.Errorf("exec in peer %s: %q", when, out)
		}
	}
	restart("after a restart with the lab target gone", []string{"peer"})

	// A new lab target under the old name; the peer was never given it.
	lab2 := e.createNetOnly("lab", "--lab")
	e2eServeTCPEcho(t, e.nsPath("lab"), netip.MustParseAddrPort(lab2.GuestIP+":7"))
	e2eExpect(t, e2eTCP(e.nsPath("peer"), lab2.GuestIP+":7", e2eRejected))
	restart("after a restart with a new lab target of the same name", []string{"lab", "peer"})
	e2eExpect(t, e2eTCP(e.nsPath("peer"), lab2.GuestIP+":7", e2eRejected))
}
