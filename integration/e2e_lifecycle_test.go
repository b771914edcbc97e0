package integration

// The daemon's processes as an operator sees them (ps, systemctl status, the journal): the
// roles named on their command lines, and one log format.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// initPid is the pid of session name's sandbox init, found by its command line
// ("enforcerd init NAME") and checked to be pid 1 of its pid namespace.
func (e *e2eEnv) initPid(name string) int {
	e.t.Helper()
	want := "enforcerd init " + name
	var found []int
	deadline := time.Now().Add(2 * time.Second)
	for {
		found = found[:0]
		ents, _ := os.ReadDir("/proc")
		for _, ent := range ents {
			pid, err := strconv.Atoi(ent.Name())
			if err == nil && procCmdline(pid) == want {
				found = append(found, pid)
			}
		}
		if len(found) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(found) != 1 {
		e.t.Fatalf("processes whose command line is %q: %v, want one", want, found)
	}
	if !nsPidOne(strconv.Itoa(found[0])) {
		e.t.Fatalf("%q (pid %d) is not pid 1 of its pid namespace", want, found[0])
	}
	return found[0]
}

func TestE2EProcessTitles(t *testing.T) {
	e := newE2E(t)
	e.create("box")
	pid := e.initPid("box")
	if got := procComm(pid); got != "enforcerd-init" {
		t.Errorf("init comm %q, want enforcerd-init", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	info, err := e.d.Client().ExecDetach(ctx, "box", api.ExecRequest{Args: []string{"sleep", "4246"}})
	if err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(e.d.StateDir, "execs", "box", info.ID, "holder.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("holder pid: %v", err)
	}
	holder, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if got, want := procCmdline(holder), "enforcerd exec-holder box "+info.ID; got != want {
		t.Errorf("holder %d: command line %q, want %q", holder, got, want)
	}
	// The holder names its comm itself, first thing.
	for deadline := time.Now().Add(2 * time.Second); procComm(holder) != "enforcerd-exec" && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if got := procComm(holder); got != "enforcerd-exec" {
		t.Errorf("holder %d: comm %q, want enforcerd-exec", holder, got)
	}
	// The daemon still finds the holder by it: the exec is listed as running, and killed.
	if got, err := e.d.Client().InspectExec(ctx, "box", info.ID); err != nil || got.State != api.ExecRunning {
		t.Errorf("inspect exec: %+v %v", got, err)
	}
	if got, err := e.d.Client().KillExec(ctx, "box", info.ID); err != nil || got.State != api.ExecExited {
		t.Errorf("kill exec: %+v %v", got, err)
	}
	if processAlive(holder) {
		t.Errorf("holder %d runs after its exec was killed", holder)
	}
}

// A sandbox's init ends its sandbox at a SIGTERM from the host (systemd's at shutdown), and
// the daemon notices: the session's sandbox is gone, its other objects stay until deleted.
func TestE2ESandboxEndsAtSIGTERM(t *testing.T) {
	e := newE2E(t)
	e.create("box")
	e.create("other")
	pid := e.initPid("box")
	e.mustSh("box", "setsid sleep 4247 </dev/null >/dev/null 2>&1 &")
	if out, _, code := e.sh("box", "kill -TERM 1; sleep 0.3; echo still-here"); code != 0 || out != "still-here\n" {
		t.Fatalf("a SIGTERM from inside ended the sandbox: exit %d %q", code, out)
	}
	start := time.Now()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for processAlive(pid) || len(e2eProcesses("sleep", "4247")) > 0 {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("sandbox init %d still runs 2s after SIGTERM (sleep 4247: %v)", pid, e2eProcesses("sleep", "4247"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("sandbox gone %v after SIGTERM", time.Since(start))
	if out := e.mustSh("other", "echo ok"); out != "ok\n" {
		t.Errorf("the other session's sandbox: %q", out)
	}
	// Deleting the session removes what is left of it (e.cleanup checks nothing remains).
	e.cli("session", "rm", "box")
}

// With --log-format json every line on the daemon's stderr is a JSON object, libcontainer's
// own log lines (logrus) included. At debug level (ENFORCERD_DEBUG) libcontainer logs, and
// has its init process forward, lines of its own at every sandbox start: they must be there,
// as JSON records marked source=libcontainer (before, logrus wrote its lines as text).
func TestE2EJSONLogOnly(t *testing.T) {
	t.Setenv("ENFORCERD_DEBUG", "1")
	e := newE2E(t, "--log-format", "json")
	e.create("box")
	e.mustSh("box", "echo hi")
	// A sandbox whose init is gone: libcontainer logs its state as it cleans up.
	e.create("gone")
	if err := syscall.Kill(e.initPid("gone"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.cli("session", "rm", "gone")
	e.cli("session", "rm", "box")
	if err := e.d.Stop(); err != nil {
		t.Fatal(err)
	}
	e.start()
	e.create("again")
	e.cli("session", "rm", "again")

	log := e.d.Log()
	lines, libcontainer := 0, 0
	s := bufio.NewScanner(strings.NewReader(log))
	s.Buffer(make([]byte, 1<<20), 1<<20)
	for s.Scan() {
		lines++
		var rec map[string]any
		if err := json.Unmarshal(s.Bytes(), &rec); err != nil {
			t.Errorf("log line %d is not JSON: %q", lines, s.Text())
			continue
		}
		if rec["level"] == nil || rec["msg"] == nil || rec["time"] == nil {
			t.Errorf("log line %d lacks level, msg or time: %q", lines, s.Text())
		}
		if rec["source"] == "libcontainer" {
			libcontainer++
		}
	}
	if lines < 4 || libcontainer == 0 {
		t.Fatalf("the daemon logged %d lines, %d of them libcontainer's:\n%s", lines, libcontainer, log)
	}
	t.Logf("%d JSON lines, %d of them libcontainer's", lines, libcontainer)
}

// What a reboot does to sessions, played in the simulated host: the daemon is stopped, the
// shutdown's SIGTERM ends every sandbox and holder, and the kernel state is gone (the netns
// bind mounts in /run's tmpfs, the interfaces, the table), while the state dir on disk keeps
// the records. The next start reaps every session, records and exec records included.
func TestE2ESessionsEndAtReboot(t *testing.T) {
	e := newE2E(t)
	e.create("box")
	e.createNetOnly("net")
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	if _, err := e.d.Client().ExecDetach(ctx, "box", api.ExecRequest{Args: []string{"sleep", "4250"}}); err != nil {
		t.Fatal(err)
	}
	initPid := e.initPid("box")
	holders := holderPids(e.d.StateDir)
	if len(holders) != 1 {
		t.Fatalf("holders: %v", holders)
	}
	if err := e.d.Stop(); err != nil {
		t.Fatal(err)
	}

	// The shutdown: SIGTERM to what is left (systemd-shutdown sends it to every process).
	for _, pid := range append(holders, initPid) {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(2 * time.Second); processAlive(initPid) || processAlive(holders[0]); {
		if time.Now().After(deadline) {
			t.Fatalf("2s after SIGTERM: init %d alive %v, holder %d alive %v", initPid, processAlive(initPid), holders[0], processAlive(holders[0]))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The boot: /run is empty, the kernel has none of the daemon's objects.
	netns := e.objects().Netns
	if len(netns) != 2 {
		t.Fatalf("netns before the reboot: %v", netns)
	}
	for _, n := range netns {
		if out, err := exec.Command("ip", "netns", "del", e.d.Prefix+"-"+n).CombinedOutput(); err != nil {
			t.Fatalf("ip netns del: %v %s", err, out)
		}
	}
	if out, err := exec.Command("ip", "-n", e.w.HostName, "link", "del", e.dnsIface()).CombinedOutput(); err != nil {
		t.Fatalf("ip link del %s: %v %s", e.dnsIface(), err, out)
	}
	if out, err := exec.Command("nsenter", "--net="+e.w.HostPath, "nft", "delete", "table", "inet", e.d.Prefix).CombinedOutput(); err != nil {
		t.Fatalf("nft delete table: %v %s", err, out)
	}
	if recs := e.objects().Records; len(recs) != 2 {
		t.Fatalf("records on disk before the start: %v", recs)
	}

	e.start()
	if got := e.list(); len(got) != 0 {
		t.Errorf("sessions after the reboot: %v", e2eNames(got))
	}
	log := e.d.Log()
	for _, name := range []string{"box", "net"} {
		if !strings.Contains(log, `msg="reaping partial session" session=`+name) {
			t.Errorf("no log line reaping %s:\n%s", name, e2eTail(log, 30))
		}
	}
	e.expectObjects(t, "after the start that follows the reboot", e2eObjects{Links: []string{e.dnsIface()}, Table: true})
	if _, err := os.Stat(filepath.Join(e.d.StateDir, "execs", "box")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("exec records of box after the reboot: %v", err)
	}
}
