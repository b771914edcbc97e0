package integration

// Grants with an end (issue 24, item 1): --allow ENTRY --for DURATION
// revokes the entries at the deadline as --revoke does, a download under
// them is cut while a permanent entry keeps working, and the deadline in
// the record holds across a restart and a kill -9.

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// e2eGrantEnded polls inspect until the session's grant i has ended.
func (e *e2eEnv) grantEnded(name string, i int, within time.Duration) api.SessionInfo {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		in := e.inspect(name)
		if len(in.Policy.Grants) > i && in.Policy.Grants[i].Ended != nil {
			return in
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: grant %d not ended within %v: %+v", name, i, within, in.Policy.Grants)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// grantEvent returns the session's grant_expired operator event's line.
func (e *e2eEnv) grantEvent(name string) string {
	e.t.Helper()
	for _, line := range strings.Split(e.cli("session", "events", name), "\n") {
		if strings.Contains(line, `"action":"grant_expired"`) {
			return line
		}
	}
	e.t.Fatalf("%s: no grant_expired event", name)
	return ""
}

// TestE2EGrantExpiresMidDownload: a download (wget in the sandbox) under a
// 3 s grant is cut at its end and wget fails within a second of the
// deadline; the control, an idle connection (nc) to an entry without
// --for, stays connected; a new connection to the granted address is
// refused afterwards, the control's still reaches; inspect, why and the
// operator's events say so.
func TestE2EGrantExpiresMidDownload(t *testing.T) {
	e := newE2E(t)
	e.create("gr", "--allow", "198.18.1.11")
	info := e.update("gr", "--allow", "198.18.1.10", "--for", "3s")
	if len(info.Policy.Grants) != 1 || !slices.Equal(info.Policy.Grants[0].Entries, []string{"198.18.1.10"}) || info.Policy.Grants[0].Ended != nil {
		t.Fatalf("grants after the update: %+v", info.Policy.Grants)
	}
	deadline := *info.Policy.Grants[0].Deadline
	if until := time.Until(deadline); until < time.Second || until > 4*time.Second {
		t.Fatalf("deadline %v is %v away, want about 3 s", deadline, until)
	}
	rs := startRevokeServers(t, e)
	done := guestClients(e, "gr", rs)
	rs.waitAccepted(t)
	if time.Until(deadline) < 500*time.Millisecond {
		t.Fatal("the clients connected too late to see the grant's end")
	}
	select {
	case c := <-done:
		t.Fatalf("%s ended before the grant's deadline", c)
	case <-time.After(time.Until(deadline) - 200*time.Millisecond):
	}
	if n := rs.sentTotal(); n == 0 {
		t.Fatal("the download sent nothing before the deadline")
	}
	select {
	case c := <-done:
		if c != "wget (download)" {
			t.Fatalf("%s ended at the grant's end, want the download (the idle nc is the control)", c)
		}
		t.Logf("%s ended %v after the deadline", c, time.Since(deadline).Round(time.Millisecond))
	case <-time.After(time.Until(deadline.Add(1500 * time.Millisecond))):
		t.Fatalf("the download still runs %v after the grant's deadline", time.Since(deadline).Round(time.Millisecond))
	}
	select {
	case c := <-done:
		t.Errorf("%s (the control, no --for) ended too", c)
	case <-time.After(time.Second):
	}
	in := e.grantEnded("gr", 0, 2*time.Second)
	if slices.Contains(in.Policy.Allow, "198.18.1.10") || !slices.Contains(in.Policy.Allow, "198.18.1.11") {
		t.Errorf("allow after the grant's end: %v", in.Policy.Allow)
	}
	ns := e.nsPath("gr")
	e2eExpect(t,
		e2eTCP(ns, "198.18.1.10:7", e2eRejected),
		e2eTCP(ns, "198.18.1.11:7", e2eReach),
	)
	if a := e.why("gr", "198.18.1.10:7"); a.Reason != "grant-expired" || a.Verdict == api.WhyAllowed {
		t.Errorf("why 198.18.1.10:7: %+v", a)
	}
	if a := e.why("gr", "198.18.1.11:7"); a.Verdict != api.WhyAllowed {
		t.Errorf("why of the control 198.18.1.11:7: %+v", a)
	}
	if ev := e.grantEvent("gr"); !strings.Contains(ev, `"kind":"lifecycle"`) || !strings.Contains(ev, `"revoked":["198.18.1.10"]`) {
		t.Errorf("grant_expired event: %s", ev)
	}
	rs.closeAll()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the control's nc did not end when its server closed")
	}
}

func TestE2EGrantExpiresAcrossKill9(t *testing.T) {
	e2eGrantAcrossRestart(t, syscall.SIGKILL)
}

func TestE2EGrantExpiresAcrossRestart(t *testing.T) {
	e2eGrantAcrossRestart(t, syscall.SIGTERM)
}

// e2eGrantAcrossRestart: the daemon is stopped with sig before a grant's
// deadline and started after it: it ends the grant as it adopts the
// session (the deadline is in the record), cutting the connection opened
// under it, while the control entry's connection keeps echoing.
func e2eGrantAcrossRestart(t *testing.T, sig syscall.Signal) {
	e := newE2E(t)
	e.createNetOnly("gk", "--allow", "198.18.1.11")
	info := e.update("gk", "--allow", "198.18.1.10", "--for", "2s")
	deadline := *info.Policy.Grants[0].Deadline
	ns := e.nsPath("gk")
	granted := e2eDial(t, ns, "198.18.1.10:7")
	kept := e2eDial(t, ns, "198.18.1.11:7")
	e2eEcho(t, "granted, before the restart", granted)
	e2eEcho(t, "kept, before the restart", kept)
	if err := e.d.Signal(sig); err != nil {
		t.Fatalf("%s: %v", sig, err)
	}
	if done, _ := e.d.Exited(); !done {
		t.Fatalf("enforcerd still runs after %s", sig)
	}
	time.Sleep(time.Until(deadline) + 500*time.Millisecond)
	e.start()
	in := e.grantEnded("gk", 0, 3*time.Second)
	if slices.Contains(in.Policy.Allow, "198.18.1.10") {
		t.Errorf("allow after the restart past the deadline: %v", in.Policy.Allow)
	}
	e2eCut(t, "granted, after the restart", granted)
	e2eEcho(t, "kept, after the restart", kept)
	e2eExpect(t,
		e2eTCP(ns, "198.18.1.10:7", e2eRejected),
		e2eTCP(ns, "198.18.1.11:7", e2eReach),
	)
	e.grantEvent("gk")
}
