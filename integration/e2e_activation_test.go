package integration

// Socket activation: the test plays systemd's part for scripts/enforcerd.socket.
// It binds the sockets the unit lists (in the simulated host), starts the
// daemon with them (LISTEN_FDS), and restarts it while a session sends a
// DNS lookup every 20 ms. With the sockets held across the restart, every
// lookup is answered (late, never lost); the control phase restarts a
// daemon that binds its own sockets and sees lookups fail.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/world"
)

// socketUnit is what scripts/enforcerd.socket asks systemd to bind.
type socketUnit struct {
	streams   []string // ListenStream=: a path or ADDR:PORT
	datagrams []string // ListenDatagram=
	freeBind  bool
}

func readSocketUnit(t *testing.T) socketUnit {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "scripts", "enforcerd.socket"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var u socketUnit
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || strings.HasPrefix(k, "#") {
			continue
		}
		switch k {
		case "ListenStream":
			u.streams = append(u.streams, v)
		case "ListenDatagram":
			u.datagrams = append(u.datagrams, v)
		case "FreeBind":
			u.freeBind = v == "yes" || v == "true"
		}
	}
	if len(u.streams) == 0 || len(u.datagrams) == 0 {
		t.Fatalf("scripts/enforcerd.socket lists no sockets: %+v", u)
	}
	return u
}

// heldSockets are the sockets bound as systemd would, and the files to
// pass; closing them is the socket unit stopping.
type heldSockets struct {
	files []*os.File
	names []string
	dns   netip.AddrPort
}

func (h *heldSockets) close() {
	for _, f := range h.files {
		f.Close()
	}
}

// bindSocketUnit binds u's sockets in the simulated host; a unix path is
// replaced by the test daemon's socket (it cannot use /run/enforcerd).
func bindSocketUnit(t *testing.T, e *e2eEnv, u socketUnit) *heldSockets {
	t.Helper()
	h := &heldSockets{}
	t.Cleanup(h.close)
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			if u.freeBind {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
			}
		}); err != nil {
			return err
		}
		return serr
	}}
	add := func(name string, f *os.File, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("bind %s as enforcerd.socket would: %v", name, err)
		}
		h.files = append(h.files, f)
		h.names = append(h.names, name)
	}
	err := world.DoPath(e.w.HostPath, func() error {
		for _, s := range u.streams {
			if strings.HasPrefix(s, "/") {
				os.Remove(e.d.Socket)
				l, err := net.ListenUnix("unix", &net.UnixAddr{Name: e.d.Socket, Net: "unix"})
				if err != nil {
					return err
				}
				l.SetUnlinkOnClose(false)
				os.Chmod(e.d.Socket, 0o600)
				f, err := l.File()
				l.Close()
				add("api", f, err)
				continue
			}
			h.dns = netip.MustParseAddrPort(s)
			l, err := lc.Listen(context.Background(), "tcp4", s)
			if err != nil {
				return err
			}
			f, err := l.(*net.TCPListener).File()
			l.Close()
			add("dns-tcp", f, err)
		}
		for _, s := range u.datagrams {
			c, err := lc.ListenPacket(context.Background(), "udp4", s)
			if err != nil {
				return err
			}
			f, err := c.(*net.UDPConn).File()
			c.Close()
			add("dns-udp", f, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("bind the sockets of enforcerd.socket: %v", err)
	}
	return h
}

// lookupResult is one lookup a session's stub resolver made.
type lookupResult struct {
	sent    time.Time
	took    time.Duration
	retried bool  // the first try timed out (a query the daemon had read when it was killed)
	err     error // no good answer after both tries
}

// lookupEvery starts a lookup of api.e2e.test every interval until stop is
// closed, each as a stub resolver makes it: a try of 2 s, then one more
// (glibc's "attempts:2"). It returns the results once all have ended.
func lookupEvery(nsPath string, server netip.AddrPort, interval time.Duration, stop <-chan struct{}) func() []lookupResult {
	var (
		mu  sync.Mutex
		out []lookupResult
		wg  sync.WaitGroup
	)
	one := func(sent time.Time) {
		defer wg.Done()
		r := lookupResult{sent: sent}
		for try := 0; try < 2; try++ {
			m, err := world.Lookup(nsPath, server, "api.e2e.test", dns.TypeA, false, 2*time.Second)
			if err == nil && (m.Rcode != dns.RcodeSuccess || !slices.Equal(addrStrs(world.AddrsOf(m)), []string{"198.18.1.10"})) {
				err = fmt.Errorf("answer %s %v", dns.RcodeToString[m.Rcode], world.AddrsOf(m))
			}
			r.err = err
			if err == nil {
				break
			}
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				if !strings.Contains(err.Error(), "i/o timeout") {
					break // refused or wrong: a stub resolver would give up too
				}
			}
			r.retried = true
		}
		r.took = time.Since(sent)
		mu.Lock()
		out = append(out, r)
		mu.Unlock()
	}
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				wg.Add(1)
				go one(now)
			}
		}
	}()
	return func() []lookupResult {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		sort.Slice(out, func(i, j int) bool { return out[i].sent.Before(out[j].sent) })
		return out
	}
}

func addrStrs(as []netip.Addr) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

// summarize counts the failed and retried lookups and the slowest answer.
func summarize(rs []lookupResult) (failed, retried int, slowest time.Duration, firstErr error) {
	for _, r := range rs {
		if r.err != nil {
			failed++
			if firstErr == nil {
				firstErr = r.err
			}
		}
		if r.retried {
			retried++
		}
		if r.err == nil && r.took > slowest {
			slowest = r.took
		}
	}
	return
}

// restartDuringLookups restarts the daemon with sig, twice, while a session
// looks up a name every 20 ms, and returns every lookup's result.
func restartDuringLookups(t *testing.T, e *e2eEnv, nsPath string, server netip.AddrPort, sig syscall.Signal, start func() error) []lookupResult {
	t.Helper()
	stop := make(chan struct{})
	results := lookupEvery(nsPath, server, 20*time.Millisecond, stop)
	for i := 0; i < 2; i++ {
		time.Sleep(300 * time.Millisecond)
		if err := e.d.Signal(sig); err != nil {
			close(stop)
			t.Fatalf("%s the daemon: %v", sig, err)
		}
		if err := start(); err != nil {
			close(stop)
			t.Fatalf("restart the daemon: %v", err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	return results()
}

func TestE2ESocketActivationDNSSurvivesRestart(t *testing.T) {
	e := prepareE2E(t, "")
	unit := readSocketUnit(t)
	held := bindSocketUnit(t, e, unit)
	start := func() error { return e.d.StartActivated(held.files, held.names) }
	if err := start(); err != nil {
		t.Fatalf("start enforcerd with the sockets of enforcerd.socket: %v", err)
	}
	if !strings.Contains(e.d.Log(), "socket_activated=true") {
		t.Fatalf("the daemon did not serve on the passed sockets:\n%s", e2eTail(e.d.Log(), 20))
	}
	e.createNetOnly("agent", "--allow", "api.e2e.test")
	ns := e.nsPath("agent")
	if held.dns.Addr().String() != e.inspect("agent").DNS {
		t.Fatalf("enforcerd.socket binds DNS on %s, the session resolves through %s", held.dns, e.inspect("agent").DNS)
	}

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		rs := restartDuringLookups(t, e, ns, held.dns, sig, start)
		failed, retried, slowest, firstErr := summarize(rs)
		t.Logf("%s restarts x2 with the sockets held: %d lookups, %d failed, %d needed the resolver's second try, slowest answer %s",
			sig, len(rs), failed, retried, slowest.Round(time.Millisecond))
		if len(rs) < 20 {
			t.Fatalf("%s: only %d lookups were made", sig, len(rs))
		}
		if failed > 0 {
			t.Errorf("%s: %d of %d lookups lost across the restarts (first: %v)", sig, failed, len(rs), firstErr)
		}
		// A graceful stop answers every query it read before it exits; only a
		// kill can take one that was read and not yet answered.
		if sig == syscall.SIGTERM && retried > 0 {
			t.Errorf("SIGTERM: %d lookups were dropped by the daemon and needed a second try", retried)
		}
		if slowest > 5*time.Second {
			t.Errorf("%s: the slowest answer took %s", sig, slowest)
		}
	}

	// The control: the same restarts when the daemon binds its own sockets
	// (no socket unit) lose lookups: the sessions' DNS is down while the
	// daemon restarts. This shows the test sees a loss when there is one.
	if err := e.d.Stop(); err != nil {
		t.Fatal(err)
	}
	held.close()
	os.Remove(e.d.Socket)
	e.start()
	rs := restartDuringLookups(t, e, ns, held.dns, syscall.SIGTERM, func() error { return e.d.Start() })
	failed, _, _, firstErr := summarize(rs)
	t.Logf("control, no socket unit: %d lookups, %d failed (first: %v)", len(rs), failed, firstErr)
	if failed == 0 {
		t.Errorf("control: no lookup failed while a daemon without held sockets restarted; the test cannot see a loss")
	}
}

// expectActivatedRefusal starts the daemon with the held sockets and checks
// that it refuses to start in one line holding want, before any kernel
// change.
func expectActivatedRefusal(t *testing.T, e *e2eEnv, held *heldSockets, what, want string) {
	t.Helper()
	if err := e.d.StartActivated(held.files, held.names); err == nil {
		e.d.Stop()
		t.Fatalf("%s: serve started on sockets that do not match its config", what)
	}
	log := e.d.Log()
	e2eOneLine(t, what, log)
	if !strings.Contains(log, want) {
		t.Errorf("%s: serve's refusal\n %q\nwant it to hold\n %q", what, log, want)
	}
	if left := e.objects(); !left.empty() {
		t.Errorf("%s: the refused serve changed the kernel: %s", what, left)
	}
	e.d.LogPath += ".next" // the next start logs afresh
}

// TestE2ESocketActivationRefusesMismatch: sockets handed over that do not
// match the config (a socket-group the unit's root-only socket would never
// grant; a pool changed only in the config) make serve refuse to start,
// naming both values; the same sockets made to match start it.
func TestE2ESocketActivationRefusesMismatch(t *testing.T) {
	e := prepareE2E(t, "")
	held := bindSocketUnit(t, e, readSocketUnit(t))
	const gid = 65534 // nogroup on Debian: any group that is not root's
	group := strconv.Itoa(gid)
	groupShown := "gid 65534"
	if g, err := user.LookupGroupId(group); err == nil {
		groupShown = g.Name + " (gid 65534)"
	}

	// socket-group in the config, the unit's socket root-only (0600).
	e.d.Args = []string{"--socket-group", group}
	expectActivatedRefusal(t, e, held, "socket-group against a root-only socket",
		fmt.Sprintf("enforcerd serve: socket activation: the API socket %s has group root (gid 0), mode 0600, but the config's socket-group is %q (want group %s, mode 0660); set SocketGroup=%s and SocketMode=0660 in enforcerd.socket",
			e.d.Socket, group, groupShown, group))

	// A pool changed only in the config: the unit still binds the old
	// pool's DNS address.
	e.d.Args = []string{"--pool", "10.21.0.0/16"}
	expectActivatedRefusal(t, e, held, "pool changed in the config only",
		"enforcerd serve: socket activation: a DNS socket is bound to "+held.dns.String()+", but the pool 10.21.0.0/16 resolves through 10.21.255.254:53; make enforcerd.socket listen on 10.21.255.254:53")

	// A group on the socket the config does not name.
	if err := os.Chown(e.d.Socket, -1, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(e.d.Socket, 0o660); err != nil {
		t.Fatal(err)
	}
	e.d.Args = nil
	expectActivatedRefusal(t, e, held, "a group socket, no socket-group",
		fmt.Sprintf("enforcerd serve: socket activation: the API socket %s has group %s, mode 0660, but the config has no socket-group (root only: mode 0600)", e.d.Socket, groupShown))

	// Control: the socket as SocketGroup=65534 SocketMode=0660 makes it and
	// the config saying so: serve starts on it and keeps its group and mode.
	e.d.Args = []string{"--socket-group", group}
	if err := e.d.StartActivated(held.files, held.names); err != nil {
		t.Fatalf("matching socket-group: %v", err)
	}
	fi, err := os.Stat(e.d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Gid != gid || fi.Mode().Perm() != 0o660 || !strings.Contains(e.d.Log(), "socket_activated=true") {
		t.Errorf("matched start: socket gid %d mode %04o, want %d 0660, activated:\n%s", st.Gid, fi.Mode().Perm(), gid, e2eTail(e.d.Log(), 5))
	}
}
