package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// A real VM guest in a --vm session: QEMU boots Debian's kernel with a
// busybox initramfs (scripts/mkguest.sh) inside the session netns, under
// TCG (this machine's nested KVM hangs Debian's kernel; TCG is always
// there). One boot runs every probe: the lease, a lookup through the
// anycast address, a connect where the policy allows, a refused one
// elsewhere, the guest taking another address (dropped as spoofed) and
// another MAC (no lease, nothing forwarded), and, across a restart of the
// daemon while the guest sleeps, a new lease, a lookup and a connect.

// e2eGuest returns the guest's kernel and initramfs: ENFORCERD_GUEST, or
// built by scripts/mkguest.sh into .cache/guest.
func e2eGuest(t *testing.T) (kernel, initrd string) {
	t.Helper()
	dir := os.Getenv("ENFORCERD_GUEST")
	if dir == "" {
		dir = filepath.Join("..", ".cache", "guest")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, filepath.Join("..", "scripts", "mkguest.sh"), dir).CombinedOutput()
		if err != nil {
			t.Fatalf("scripts/mkguest.sh: %v\n%s", err, out)
		}
	}
	kernel, initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.cpio.gz")
	for _, f := range []string{kernel, initrd} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("guest: %v", err)
		}
	}
	return kernel, initrd
}

// tcgTimingArgs are the kernel arguments that keep a TCG guest from hanging
// in timer calibration: the TSC frequency and loops per jiffy (HZ=250)
// from the host's clock.
func tcgTimingArgs(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil && mhz > 0 {
				khz := int64(mhz * 1000)
				return fmt.Sprintf("tsc_early_khz=%d lpj=%d", khz, khz*1000/250)
			}
		}
	}
	return ""
}

// bootGuest boots the guest in netnsPath on tap with mac and the probes,
// and returns its "PROBE ..." lines (without the prefix) and the console.
// When the guest prints "PROBE sleeping", whileAsleep runs (if set).
func bootGuest(t *testing.T, netnsPath, tap, mac, probes string, whileAsleep func()) ([]string, string) {
	t.Helper()
	kernel, initrd := e2eGuest(t)
	serial := filepath.Join(t.TempDir(), "serial.txt")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	args := []string{"--net=" + netnsPath, "--",
		"qemu-system-x86_64", "-M", "microvm", "-accel", "tcg", "-m", "256", "-smp", "1",
		"-display", "none", "-monitor", "none", "-serial", "file:" + serial, "-no-reboot",
		"-kernel", kernel, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 reboot=t quiet " + tcgTimingArgs(t) + " probes=" + probes,
		"-netdev", "tap,id=n0,ifname=" + tap + ",script=no,downscript=no",
		"-device", "virtio-net-device,netdev=n0,mac=" + mac,
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	var outBuf strings.Builder
	cmd.Stdout, cmd.Stderr = &outBuf, &outBuf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start qemu: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	if whileAsleep != nil {
	wait:
		for {
			select {
			case err = <-exited:
				exited <- err
				break wait
			case <-time.After(200 * time.Millisecond):
				if b, _ := os.ReadFile(serial); strings.Contains(string(b), "PROBE sleeping") {
					whileAsleep()
					break wait
				}
			}
		}
	}
	err = <-exited
	out := outBuf.String()
	console, _ := os.ReadFile(serial)
	if err != nil {
		t.Fatalf("qemu: %v after %s\n%s\nconsole:\n%s", err, time.Since(start).Round(time.Second), out, console)
	}
	t.Logf("guest ran for %s", time.Since(start).Round(time.Second))
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(string(console)))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "PROBE "); ok {
			lines = append(lines, rest)
		}
	}
	return lines, string(console)
}

// probeLine returns the first line starting with prefix.
func probeLine(lines []string, prefix string) (string, bool) {
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

func TestE2EVMGuestQEMU(t *testing.T) {
	world.RequireTool(t, "qemu-system-x86_64")
	world.RequireTool(t, "nsenter")
	e := newE2E(t)
	info := e.createWith([]string{"--vm", "--allow", "api.e2e.test"}, "guest")
	vm := info.VM
	if vm == nil {
		t.Fatalf("create --vm: no vm in %+v", info)
	}
	const otherMAC = "02:00:00:00:00:99"
	spoofed := "10.20.0.6" // inside the pool, not this session's
	if info.GuestIP == spoofed {
		spoofed = "10.20.0.10"
	}
	probes := strings.Join([]string{
		"resolve:api.e2e.test",
		"tcp:198.18.1.10:7",      // attested by the lookup: allowed
		"tcp:198.18.1.11:7",      // never attested: rejected
		"resolve:other.e2e.test", // not allowed: NXDOMAIN
		"spoof:" + spoofed + ":198.18.1.10:7",
		"tcp:198.18.1.10:7", // back on its own address: allowed again (control)
		"mac:" + strings.ReplaceAll(otherMAC, ":", "-"),
		"sleep:6", // the daemon restarts meanwhile
		"renew",
		"resolve:api.e2e.test",
		"tcp:198.18.1.10:7",
	}, ",")
	restarted := false
	lines, console := bootGuest(t, vm.NetnsPath, vm.Tap, vm.MAC, probes, func() {
		if err := e.d.Stop(); err != nil {
			t.Errorf("stop enforcerd: %v", err)
			return
		}
		e.start()
		restarted = true
	})
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format+"\nprobes:\n%s", append(args, strings.Join(lines, "\n"))...)
	}
	t.Logf("guest probes:\n%s", strings.Join(lines, "\n"))
	if _, ok := probeLine(lines, "done"); !ok {
		t.Fatalf("the guest did not finish its probes; console:\n%s", console)
	}
	if l, _ := probeLine(lines, "mac "); l != "mac "+vm.MAC {
		fail("guest NIC %q, want mac %s", l, vm.MAC)
	}
	wantLease := fmt.Sprintf("lease %s/30 router=%s dns=%s mtu=1500 lease=300 serverid=%s", info.GuestIP, info.GatewayIP, vm.DNS, info.GatewayIP)
	if l, _ := probeLine(lines, "lease "); l != wantLease {
		fail("guest lease %q, want %q", l, wantLease)
	}
	if l, _ := probeLine(lines, "resolve api.e2e.test"); strings.TrimSpace(l) != "resolve api.e2e.test ok 198.18.1.10" {
		fail("allowed lookup through %s: %q", vm.DNS, l)
	}
	if l, _ := probeLine(lines, "resolve other.e2e.test"); !strings.HasPrefix(l, "resolve other.e2e.test fail") {
		fail("lookup of a name not allowed: %q, want a failure", l)
	}
	var tcp []string
	for _, l := range lines {
		if strings.HasPrefix(l, "tcp ") {
			tcp = append(tcp, l)
		}
	}
	if len(tcp) != 4 || tcp[0] != "tcp 198.18.1.10:7 ok" || tcp[2] != "tcp 198.18.1.10:7 ok" || tcp[3] != "tcp 198.18.1.10:7 ok" {
		fail("connects to the attested 198.18.1.10:7: %q, want ok before and after the spoof probe and after the restart", tcp)
	}
	if l, _ := probeLine(lines, "mac "+otherMAC); !strings.HasPrefix(l, "mac "+otherMAC+" nolease fail") {
		fail("with another MAC %s: %q, want no lease and no connection", otherMAC, l)
	}
	if !restarted {
		fail("the daemon was not restarted while the guest slept")
	}
	if l, _ := probeLine(lines, "renew"); l != "renew ok" {
		fail("a new lease after the daemon's restart: %q", l)
	}
	var resolves []string
	for _, l := range lines {
		if strings.HasPrefix(l, "resolve api.e2e.test") {
			resolves = append(resolves, strings.TrimSpace(l))
		}
	}
	if len(resolves) != 2 || resolves[1] != "resolve api.e2e.test ok 198.18.1.10" {
		fail("lookups of api.e2e.test before and after the restart: %q", resolves)
	}
	if len(tcp) < 2 || !strings.HasPrefix(tcp[1], "tcp 198.18.1.11:7 fail") || !strings.Contains(tcp[1], "No route to host") {
		fail("connect to 198.18.1.11:7 (never attested): %q, want rejected (No route to host)", tcp)
	}
	if l, _ := probeLine(lines, "spoof "); !strings.HasPrefix(l, "spoof "+spoofed+" 198.18.1.10:7 fail") {
		fail("from the spoofed %s: %q, want no connection", spoofed, l)
	}
	// The table dropped them as spoofed (the guest's DHCP broadcasts from
	// 0.0.0.0 reach the host veth too, and are dropped the same way: this
	// looks for the spoofed address).
	found := false
	for _, ev := range e2eParseEvents(t, "guest", e.cli("session", "events", "guest")) {
		if ev.Kind == "flow" && ev.Action == "dropped" && ev.Detail["reason"] == "spoofed" && ev.Detail["src"] == spoofed {
			found = true
		}
	}
	if !found {
		fail("no flow event dropped as spoofed from %s", spoofed)
	}
}

// qemuGuest is a QEMU process running the guest in a session netns.
type qemuGuest struct {
	cmd     *exec.Cmd
	serial  string
	monitor string
	exited  chan error
	out     *strings.Builder
}

// startGuest starts QEMU in netnsPath on tap with mac, the probes and
// extra arguments (-incoming), with a human monitor on a unix socket.
func startGuest(t *testing.T, netnsPath, tap, mac, probes string, extra ...string) *qemuGuest {
	t.Helper()
	kernel, initrd := e2eGuest(t)
	dir := t.TempDir()
	g := &qemuGuest{serial: filepath.Join(dir, "serial.txt"), monitor: filepath.Join(dir, "monitor.sock"), exited: make(chan error, 1), out: &strings.Builder{}}
	args := append([]string{"--net=" + netnsPath, "--",
		"qemu-system-x86_64", "-M", "microvm", "-accel", "tcg", "-m", "256", "-smp", "1",
		"-display", "none", "-monitor", "unix:" + g.monitor + ",server=on,wait=off", "-serial", "file:" + g.serial, "-no-reboot",
		"-kernel", kernel, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 reboot=t quiet " + tcgTimingArgs(t) + " probes=" + probes,
		"-netdev", "tap,id=n0,ifname=" + tap + ",script=no,downscript=no",
		"-device", "virtio-net-device,netdev=n0,mac=" + mac,
	}, extra...)
	g.cmd = exec.Command("nsenter", args...)
	g.cmd.Stdout, g.cmd.Stderr = g.out, g.out
	if err := g.cmd.Start(); err != nil {
		t.Fatalf("start qemu: %v", err)
	}
	go func() { g.exited <- g.cmd.Wait() }()
	t.Cleanup(func() {
		if g.cmd.ProcessState == nil {
			g.cmd.Process.Kill() // ours, by pid
			<-g.exited
		}
	})
	return g
}

// waitSerial waits until the console holds want, or fails the test.
func (g *qemuGuest) waitSerial(t *testing.T, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(g.serial); strings.Contains(string(b), want) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	b, _ := os.ReadFile(g.serial)
	t.Fatalf("guest console has no %q after %s:\n%s\nqemu: %s", want, d, b, g.out)
}

// hmp sends one human-monitor command and returns what came back before
// the next prompt.
func (g *qemuGuest) hmp(t *testing.T, command string) string {
	t.Helper()
	c, err := net.Dial("unix", g.monitor)
	if err != nil {
		t.Fatalf("monitor: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	readPrompt := func() string {
		var b strings.Builder
		for !strings.HasSuffix(b.String(), "(qemu) ") {
			ch, err := r.ReadByte()
			if err != nil {
				t.Fatalf("monitor %q: %v after %q", command, err, b.String())
			}
			b.WriteByte(ch)
		}
		return b.String()
	}
	readPrompt()
	fmt.Fprintf(c, "%s\n", command)
	if command == "quit" {
		io.Copy(io.Discard, r) // QEMU closes the monitor as it exits
		return ""
	}
	return readPrompt()
}

// TestE2EVMForkQEMU: a guest running in SRC is migrated to a file and
// restored (-incoming) on the tap of NEW, a fork of SRC with SRC's MAC.
// The restored guest still holds SRC's address: its connects fail (its
// packets are dropped as spoofed at NEW's veth, a spoofed flow event of
// NEW names SRC's address); it renews, leases NEW's address, looks the
// name up through NEW's policy (SRC's, copied) and connects.
func TestE2EVMForkQEMU(t *testing.T) {
	world.RequireTool(t, "qemu-system-x86_64")
	world.RequireTool(t, "nsenter")
	e := newE2E(t)
	src := e.createWith([]string{"--vm", "--allow", "api.e2e.test"}, "src")
	g := startGuest(t, src.VM.NetnsPath, src.VM.Tap, src.VM.MAC, "resolve:api.e2e.test,resume")
	g.waitSerial(t, "PROBE ready", 3*time.Minute)

	var dst api.SessionInfo
	if err := json.Unmarshal([]byte(e.cli("session", "fork", "src", "dst", "--mac", src.VM.MAC, "--json")), &dst); err != nil || dst.VM == nil {
		t.Fatalf("fork: %v", err)
	}
	state := filepath.Join(t.TempDir(), "state")
	g.hmp(t, fmt.Sprintf("migrate \"exec:cat > %s\"", state))
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out := g.hmp(t, "info migrate")
		if strings.Contains(out, "Migration status: completed") {
			break
		}
		if strings.Contains(out, "Migration status: failed") || time.Now().After(deadline) {
			t.Fatalf("migration: %s", out)
		}
		time.Sleep(300 * time.Millisecond)
	}
	g.hmp(t, "quit")
	<-g.exited
	g.exited <- nil

	r := startGuest(t, dst.VM.NetnsPath, dst.VM.Tap, dst.VM.MAC, "resolve:api.e2e.test,resume", "-incoming", "exec:cat "+state)
	select {
	case err := <-r.exited:
		r.exited <- err
	case <-time.After(3 * time.Minute):
		t.Fatalf("the restored guest did not finish in 3 minutes:\n%s", mustRead(r.serial))
	}
	console := mustRead(r.serial)
	var lines []string
	for _, l := range strings.Split(console, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "PROBE "); ok {
			lines = append(lines, rest)
		}
	}
	t.Logf("restored guest probes:\n%s", strings.Join(lines, "\n"))
	// Whether the renewal is NAK'd here depends on the guest's ARP entry
	// for SRC's gateway: once it has expired, the unicast REQUEST is never
	// sent and the client falls back to a DISCOVER (TestE2EVMFork drives the
	// NAK itself on the tap). Either way the guest leases NEW's address.
	want := []string{
		"dark " + src.GuestIP + "/30",
		fmt.Sprintf("lease %s/30 router=%s", dst.GuestIP, dst.GatewayIP),
		"resumed " + dst.GuestIP + "/30 tcp ok",
	}
	at := 0
	for _, l := range lines {
		if at < len(want) && strings.HasPrefix(l, want[at]) {
			at++
		}
	}
	if at < len(want) {
		t.Errorf("restored guest: missing %q (in order: %q)\nconsole:\n%s", want[at], want, console)
	}
	found := false
	for _, ev := range e2eParseEvents(t, "dst", e.cli("session", "events", "dst")) {
		if ev.Kind == "flow" && ev.Action == "dropped" && ev.Detail["reason"] == "spoofed" && ev.Detail["src"] == src.GuestIP {
			found = true
		}
	}
	if !found {
		t.Errorf("dst has no flow dropped as spoofed from the source's %s", src.GuestIP)
	}
}

func mustRead(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
