package integration

// The name check (issue 22), through the daemon, with a simple capture
// server on an attested address: what each connection's server received,
// byte for byte. The shared-address world (two certificates by SNI, HTTP
// routing by Host) and the big attack tests are e2e_sni_*.

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// captureServer accepts on addr in the simulated internet and keeps, per
// connection, every byte it received.
type captureServer struct {
	mu    sync.Mutex
	conns []*bytes.Buffer
	ends  []error // how each connection's reading ended (nil: not yet)
}

func startCapture(t *testing.T, w *world.World, addr netip.AddrPort) *captureServer {
	t.Helper()
	l, err := world.ListenTCP(w.NetPath, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	cs := &captureServer{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			buf := &bytes.Buffer{}
			cs.mu.Lock()
			i := len(cs.conns)
			cs.conns = append(cs.conns, buf)
			cs.ends = append(cs.ends, nil)
			cs.mu.Unlock()
			go func() {
				defer c.Close()
				b := make([]byte, 4096)
				for {
					_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
					n, err := c.Read(b)
					cs.mu.Lock()
					buf.Write(b[:n])
					if err != nil {
						cs.ends[i] = err
					}
					cs.mu.Unlock()
					if err != nil {
						return
					}
					if n > 0 {
						c.Write([]byte("ok\n"))
					}
				}
			}()
		}
	}()
	return cs
}

// since returns what the connections accepted after the first n received.
func (cs *captureServer) since(n int) (conns int, received []byte) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, b := range cs.conns[min(n, len(cs.conns)):] {
		received = append(received, b.Bytes()...)
	}
	return len(cs.conns) - min(n, len(cs.conns)), received
}

// resets counts the connections after the first n whose server side
// ended with a reset from the client.
func (cs *captureServer) resets(n int) int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	r := 0
	for _, err := range cs.ends[min(n, len(cs.ends)):] {
		if errors.Is(err, syscall.ECONNRESET) {
			r++
		}
	}
	return r
}

func (cs *captureServer) count() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.conns)
}

// tlsHello is crypto/tls's first flight for sni, read off a pipe: a real
// ClientHello with the post-quantum key share (more than one MSS with
// the extensions Go sends).
func tlsHello(t *testing.T, sni string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	go tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: sni == ""}).Handshake()
	_ = s.SetReadDeadline(time.Now().Add(5 * time.Second))
	var out []byte
	buf := make([]byte, 8192)
	for {
		n, err := s.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			t.Fatalf("read the hello: %v", err)
		}
		if len(out) >= 5 && len(out) >= 5+int(binary.BigEndian.Uint16(out[3:5])) {
			return out
		}
	}
}

// nameProbe connects from the session's netns to dst and sends first in
// the given writes (a pause between them: a split hello), then waits for
// the server's "ok". It returns nil when the server answered, else the
// error the client saw.
func nameProbe(ns string, dst netip.AddrPort, writes ...[]byte) error {
	c, err := world.DialTCP(ns, dst, world.ReachTimeout)
	if err != nil {
		return err
	}
	defer c.Close()
	for i, w := range writes {
		if i > 0 {
			time.Sleep(150 * time.Millisecond)
		}
		if _, err := c.Write(w); err != nil {
			return err
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, 3)
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if string(b) != "ok\n" {
		return errors.New("server answered " + string(b))
	}
	return nil
}

// TestE2ENameCheck: a session allowed api.e2e.test (attested 198.18.1.10)
// sends, to that address on a port no test server uses, a ClientHello for
// api.e2e.test (passes: the server receives every byte, split in two
// writes too), one for evil.example (refused: the guest's connection is
// rejected, the server receives nothing, a flow event says name-mismatch
// with the name and the entry the policy lacks; the server's connection
// ends with a reset), an HTTP request with Host
// evil.example (refused) and with Host api.e2e.test (passes), SSH's first
// line (passes: L3 semantics); update --name-check off lets the fronting
// through (the control that the refusal is the check's), and tls again
// refuses it. inspect counts each kind.
func TestE2ENameCheck(t *testing.T) {
	e := newE2E(t)
	dst := netip.MustParseAddrPort("198.18.1.10:8443")
	cs := startCapture(t, e.w, dst)
	info := e.createNetOnly("nc", "--allow", "api.e2e.test")
	if info.Policy.NameCheck != "tls" {
		t.Errorf("created: policy.name_check %q, want tls (the default)", info.Policy.NameCheck)
	}
	ns := e.nsPath("nc")
	e.resolveTo("nc", "api.e2e.test", "198.18.1.10")
	fe := e.followFlows("nc")

	good, evil := tlsHello(t, "api.e2e.test"), tlsHello(t, "evil.example")
	t.Logf("ClientHello: %d bytes", len(good))
	probe := func(what string, wantPass bool, writes ...[]byte) {
		t.Helper()
		n := cs.count()
		err := nameProbe(ns, dst, writes...)
		if wantPass && err != nil {
			t.Errorf("%s: %v, want the server's answer", what, err)
		}
		if !wantPass && err == nil {
			t.Errorf("%s: the server answered, want the flow refused", what)
		}
		time.Sleep(300 * time.Millisecond) // let a late byte arrive
		conns, got := cs.since(n)
		want := bytes.Join(writes, nil)
		switch {
		case wantPass && !bytes.Equal(got, want):
			t.Errorf("%s: the server received %d bytes over %d connections, want the %d sent", what, len(got), conns, len(want))
		case !wantPass && len(got) != 0:
			t.Errorf("%s: refused, yet the server received %d bytes: %q", what, len(got), got[:min(len(got), 64)])
		case !wantPass && cs.resets(n) != conns:
			t.Errorf("%s: refused; of the server's %d connections %d ended with a reset, want all", what, conns, cs.resets(n))
		}
	}
	probe("allowed SNI", true, good)
	probe("allowed SNI, split", true, good[:60], good[60:])
	probe("SSH first line", true, []byte("SSH-2.0-OpenSSH_9.2\r\n"))
	probe("HTTP, allowed Host", true, []byte("GET / HTTP/1.1\r\nHost: api.e2e.test:8443\r\n\r\n"))
	fe.drain(t, 100*time.Millisecond)
	probe("SNI evil.example on the attested address", false, evil[:60], evil[60:])
	fe.expect(t, "fronting by SNI", map[string]any{"reason": "name-mismatch", "name": "evil.example",
		"lacked": "evil.example:8443", "dst": "198.18.1.10", "dport": float64(8443), "via": "tls-sni", "answer": "tcp-reset"})
	probe("HTTP Host evil.example on the attested address", false, []byte("GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n"))
	fe.expect(t, "fronting by Host", map[string]any{"reason": "name-mismatch", "name": "evil.example", "via": "http-host"})

	if a := e.whySNI("nc", "198.18.1.10:8443", "evil.example"); a.Verdict != "rejected" || a.Reason != "name-mismatch" || a.Entry != "evil.example:8443" {
		t.Errorf("why --sni evil.example: %+v, want rejected, name-mismatch, entry evil.example:8443", a)
	}
	if a := e.whySNI("nc", "198.18.1.10:8443", "api.e2e.test"); a.Verdict != "allowed" || a.Reason != "attested" {
		t.Errorf("why --sni api.e2e.test: %+v, want allowed, attested", a)
	}
	v := e.inspect("nc").NameCheck
	if v == nil || v.Mode != "tls" || v.Allowed != 3 || v.Passed != 1 || v.Refused != 2 || v.Checked != 6 {
		t.Errorf("inspect name_check: %+v, want tls, allowed 3, passed 1, refused 2, checked 6", v)
	}

	// The control: with the check off the same fronting goes through.
	if got := e.update("nc", "--name-check", "off").Policy.NameCheck; got != "off" {
		t.Fatalf("update --name-check off: policy.name_check %q", got)
	}
	probe("SNI evil.example, check off", true, evil)
	if a := e.whySNI("nc", "198.18.1.10:8443", "evil.example"); a.Verdict != "allowed" || !strings.Contains(a.Detail, "name check is off") {
		t.Errorf("why --sni evil.example, check off: %+v, want allowed, the detail saying the check is off", a)
	}
	if got := e.update("nc", "--name-check", "tls").Policy.NameCheck; got != "tls" {
		t.Fatalf("update --name-check tls: policy.name_check %q", got)
	}
	probe("SNI evil.example, check on again", false, evil)
	probe("allowed SNI, check on again", true, good)
}

func (e *e2eEnv) whySNI(name, dest, sni string) api.WhyAnswer {
	e.t.Helper()
	out := e.cli("session", "why", name, dest, "--sni", sni, "--json")
	var a api.WhyAnswer
	if err := json.Unmarshal([]byte(out), &a); err != nil {
		e.t.Fatalf("why %s %s --sni %s: %v\n%s", name, dest, sni, err, out)
	}
	return a
}

// TestE2ENameCheckPublicDeny: in public mode a deny entry by name is
// enforced on the flows too: a ClientHello for the denied name to any
// address is refused (no byte reaches the server), another name passes;
// the control, a public session without deny entries by name, is not
// checked (the same hello passes).
func TestE2ENameCheckPublicDeny(t *testing.T) {
	e := newE2E(t)
	dst := netip.MustParseAddrPort("198.18.1.11:8443")
	cs := startCapture(t, e.w, dst)
	e.createNetOnly("pub", "--egress", "public", "--deny", "evil.example")
	e.createNetOnly("open", "--egress", "public")
	evil, good := tlsHello(t, "evil.example"), tlsHello(t, "docs.e2e.test")
	fe := e.followFlows("pub")
	for _, c := range []struct {
		session string
		hello   []byte
		pass    bool
	}{{"pub", good, true}, {"pub", evil, false}, {"open", evil, true}} {
		n := cs.count()
		err := nameProbe(e.nsPath(c.session), dst, c.hello)
		time.Sleep(300 * time.Millisecond)
		_, got := cs.since(n)
		switch {
		case c.pass && (err != nil || !bytes.Equal(got, c.hello)):
			t.Errorf("%s: %v, server got %d of %d bytes; want it through", c.session, err, len(got), len(c.hello))
		case !c.pass && (err == nil || len(got) != 0):
			t.Errorf("%s, denied name: %v, server got %d bytes; want refused, nothing received", c.session, err, len(got))
		}
	}
	fe.expect(t, "denied name by SNI", map[string]any{"reason": "name-mismatch", "name": "evil.example", "lacked": "evil.example:8443"})
	if a := e.whySNI("pub", "198.18.1.11:8443", "evil.example"); a.Reason != "name-mismatch" {
		t.Errorf("why pub --sni evil.example: %+v, want name-mismatch", a)
	}
}

// TestE2ENameCheckQUIC: UDP/443 to an attested address of a session under
// the check is rejected (reason quic: clients fall back to TCP, where the
// name is read); with the check off it passes (the control), and UDP to
// another port of the same address passes throughout.
func TestE2ENameCheckQUIC(t *testing.T) {
	e := newE2E(t)
	u, err := world.ListenUDP(e.w.NetPath, netip.MustParseAddrPort("198.18.1.10:443"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	go world.ServeUDPEcho(u)
	e.createNetOnly("q", "--allow", "api.e2e.test")
	e.resolveTo("q", "api.e2e.test", "198.18.1.10")
	ns := e.nsPath("q")
	fe := e.followFlows("q")
	if err := world.UDPEcho(ns, netip.MustParseAddrPort("198.18.1.10:7"), world.ReachTimeout); err != nil {
		t.Fatalf("control: UDP to port 7 of the attested address: %v", err)
	}
	if err := world.UDPEcho(ns, netip.MustParseAddrPort("198.18.1.10:443"), world.ReachTimeout); err == nil {
		t.Error("UDP/443 to the attested address passed under the name check")
	}
	fe.expect(t, "QUIC", map[string]any{"reason": "quic", "dst": "198.18.1.10", "dport": float64(443)})
	e.update("q", "--name-check", "off")
	if err := world.UDPEcho(ns, netip.MustParseAddrPort("198.18.1.10:443"), world.ReachTimeout); err != nil {
		t.Errorf("UDP/443 with the check off: %v, want it through", err)
	}
}

// TestE2ENameCheckRestart: the check's state is the kernel's. A flow
// checked before a kill -9 keeps the plain path while the daemon is down
// (its bytes reach the server); a ClientHello held when the daemon died
// (its first part sent, the rest sent while it is down) is refused after
// the restart, never passed, and the server receives none of it; a
// connection opened while the daemon is down waits (its SYN is dropped,
// not passed) and is checked once it is back.
func TestE2ENameCheckRestart(t *testing.T) {
	e := newE2E(t)
	dst := netip.MustParseAddrPort("198.18.1.10:8443")
	cs := startCapture(t, e.w, dst)
	e.createNetOnly("rs", "--allow", "api.e2e.test")
	e.resolveTo("rs", "api.e2e.test", "198.18.1.10")
	ns := e.nsPath("rs")
	good, evil := tlsHello(t, "api.e2e.test"), tlsHello(t, "evil.example")

	checked, err := world.DialTCP(ns, dst, world.ReachTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer checked.Close()
	echoOK := func(what string, c net.Conn, msg []byte) {
		t.Helper()
		if _, err := c.Write(msg); err != nil {
			t.Fatalf("%s: write: %v", what, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 3)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("%s: no answer from the server: %v", what, err)
		}
	}
	echoOK("checked flow, before the kill", checked, good)

	n := cs.count()
	held, err := world.DialTCP(ns, dst, world.ReachTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := held.Write(evil[:60]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := e.d.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := held.Write(evil[60:]); err != nil {
		t.Fatal(err)
	}
	echoOK("checked flow, daemon down", checked, []byte("more\n"))
	late := make(chan error, 1)
	go func() { late <- nameProbe(ns, dst, good) }()
	time.Sleep(time.Second)
	e.start()

	_ = held.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := held.Read(make([]byte, 3)); err == nil || world.IsTimeout(err) {
		t.Errorf("held hello after the restart: read %v, want the flow refused (a reset)", err)
	}
	if err := <-late; err != nil {
		t.Errorf("connection opened while the daemon was down, allowed name: %v, want it checked and through after the restart", err)
	}
	time.Sleep(300 * time.Millisecond)
	_, got := cs.since(n)
	if !bytes.Equal(got, good) {
		t.Errorf("after the restart the server received %d bytes from the new connections, want only the allowed hello's %d (none of the held evil one)", len(got), len(good))
	}
	echoOK("checked flow, after the restart", checked, []byte("again\n"))
}

// TestE2ENameCheckPinned: a pinned name's address (--pin: in the static
// sets, no DNS needed) is checked like an attested one: its own name
// passes, another name on it is refused with nothing at the server; an
// address entry's address is not checked (any name passes: the control
// that only names are), and neither is the pinned address with the check
// off.
func TestE2ENameCheckPinned(t *testing.T) {
	e := newE2E(t)
	pinned, byAddr := netip.MustParseAddrPort("198.18.1.10:8443"), netip.MustParseAddrPort("198.18.2.10:8443")
	cs, ca := startCapture(t, e.w, pinned), startCapture(t, e.w, byAddr)
	e.createNetOnly("pin", "--allow", "api.e2e.test", "--allow", "198.18.2.10", "--pin")
	ns := e.nsPath("pin")
	good, evil := tlsHello(t, "api.e2e.test"), tlsHello(t, "evil.example")
	try := func(what string, cs *captureServer, dst netip.AddrPort, hello []byte, pass bool) {
		t.Helper()
		n := cs.count()
		err := nameProbe(ns, dst, hello)
		time.Sleep(300 * time.Millisecond)
		_, got := cs.since(n)
		switch {
		case pass && (err != nil || !bytes.Equal(got, hello)):
			t.Errorf("%s: %v, server got %d of %d bytes; want it through", what, err, len(got), len(hello))
		case !pass && (err == nil || len(got) != 0):
			t.Errorf("%s: %v, server got %d bytes; want refused, nothing received", what, err, len(got))
		}
	}
	try("pinned address, its own name", cs, pinned, good, true)
	try("pinned address, another name", cs, pinned, evil, false)
	try("address entry, any name", ca, byAddr, evil, true)
	if a := e.whySNI("pin", "198.18.1.10:8443", "evil.example"); a.Reason != "name-mismatch" {
		t.Errorf("why --sni evil.example on the pinned address: %+v, want name-mismatch", a)
	}
	e.update("pin", "--name-check", "off")
	try("pinned address, another name, check off", cs, pinned, evil, true)
}

// TestE2ENameCheckTrickle: a hello trickled a few bytes a second never
// completes within the bound: after 10 s the flow is refused (cause
// incomplete), the client's socket reset, and the server has received
// none of it; a hello without SNI (no name to route by) passes at once.
func TestE2ENameCheckTrickle(t *testing.T) {
	e := newE2E(t)
	dst := netip.MustParseAddrPort("198.18.1.10:8443")
	cs := startCapture(t, e.w, dst)
	e.createNetOnly("tr", "--allow", "api.e2e.test")
	e.resolveTo("tr", "api.e2e.test", "198.18.1.10")
	ns := e.nsPath("tr")
	fe := e.followFlows("tr")

	noSNI := tlsHello(t, "")
	n := cs.count()
	if err := nameProbe(ns, dst, noSNI); err != nil {
		t.Errorf("hello without SNI: %v, want it through", err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, got := cs.since(n); !bytes.Equal(got, noSNI) {
		t.Errorf("hello without SNI: the server received %d of %d bytes", len(got), len(noSNI))
	}

	evil := tlsHello(t, "evil.example")
	n = cs.count()
	c, err := world.DialTCP(ns, dst, world.ReachTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	var werr error
	for i := 0; i < 40 && werr == nil && time.Since(start) < 14*time.Second; i++ {
		_, werr = c.Write(evil[i*4 : i*4+4])
		time.Sleep(350 * time.Millisecond)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, rerr := c.Read(make([]byte, 1))
	if !errors.Is(werr, syscall.ECONNRESET) && !errors.Is(rerr, syscall.ECONNRESET) {
		t.Errorf("trickled hello: write %v, read %v after %s; want the connection reset", werr, rerr, time.Since(start).Round(time.Second))
	}
	if took := time.Since(start); took < 9*time.Second {
		t.Errorf("trickled hello refused after %s, want the 10 s bound", took)
	}
	if _, got := cs.since(n); len(got) != 0 {
		t.Errorf("trickled hello: the server received %d bytes, want none", len(got))
	}
	fe.expect(t, "trickle", map[string]any{"reason": "name-mismatch", "cause": "incomplete", "dst": "198.18.1.10"})
}

// TestE2ENameCheckUrgent: an unprivileged client can mark a byte urgent
// (MSG_OOB); the server's TCP takes it out of the stream, so "Hosxt:
// evil.example" with an urgent x reads as a Host header there while the
// check would see none. Such a request is refused with nothing at the
// server; the same bytes without the urgent mark pass (the control: only
// the mark is refused), and with the check off the server does read
// Host evil.example (what the attack would reach).
func TestE2ENameCheckUrgent(t *testing.T) {
	e := newE2E(t)
	dst := netip.MustParseAddrPort("198.18.1.10:8443")
	cs := startCapture(t, e.w, dst)
	e.createNetOnly("urg", "--allow", "api.e2e.test")
	e.resolveTo("urg", "api.e2e.test", "198.18.1.10")
	ns := e.nsPath("urg")
	head, tail := []byte("GET / HTTP/1.1\r\nHos"), []byte("t: evil.example\r\nHost: api.e2e.test\r\n\r\n")
	send := func(urgent bool) ([]byte, error) {
		n := cs.count()
		c, err := world.DialTCP(ns, dst, world.ReachTimeout)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if _, err := c.Write(head); err != nil {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
		flags := 0
		if urgent {
			flags = unix.MSG_OOB
		}
		raw, _ := c.(*net.TCPConn).SyscallConn()
		var serr error
		if err := raw.Write(func(fd uintptr) bool { serr = unix.Sendto(int(fd), []byte("x"), flags, nil); return true }); err != nil || serr != nil {
			return nil, errors.Join(err, serr)
		}
		time.Sleep(100 * time.Millisecond)
		if _, err := c.Write(tail); err != nil {
			return nil, err
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, rerr := io.ReadFull(c, make([]byte, 3))
		time.Sleep(300 * time.Millisecond)
		_, got := cs.since(n)
		return got, rerr
	}
	if got, err := send(false); err != nil || len(got) != len(head)+1+len(tail) {
		t.Errorf("control, no urgent mark: %v, server got %d bytes; want it through", err, len(got))
	}
	if got, err := send(true); err == nil || len(got) != 0 {
		t.Errorf("urgent byte in the request: %v, server got %q; want refused, nothing received", err, got)
	}
	e.update("urg", "--name-check", "off")
	if got, _ := send(true); !bytes.Contains(got, []byte("Host: evil.example")) {
		t.Errorf("check off: the server read %q, want the urgent byte taken out (Host: evil.example): the attack the check refuses", got)
	}
}

// TestE2ENameCheckLenientHTTP: requests a lenient front end still reads
// as HTTP, each sent in two writes (the first alone in its segment, so
// that the check must not decide on it): empty lines before the request
// line (nginx skips them), a lower-case or long method (Go's net/http
// takes any token; nginx any upper-case run), runs of spaces, a bare CR
// ending the request line. With Host evil.example each is refused with
// nothing at the server; the same bytes with the allowed Host pass (the
// control), and a request line naming a version it does not parse as is
// refused whatever its Host.
func TestE2ENameCheckLenientHTTP(t *testing.T) {
	e := newE2E(t)
	dst := netip.MustParseAddrPort("198.18.1.10:8443")
	cs := startCapture(t, e.w, dst)
	e.createNetOnly("lenient", "--allow", "api.e2e.test")
	e.resolveTo("lenient", "api.e2e.test", "198.18.1.10")
	ns := e.nsPath("lenient")
	send := func(first, rest string) ([]byte, error) {
		n := cs.count()
		c, err := world.DialTCP(ns, dst, world.ReachTimeout)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		if _, err := c.Write([]byte(first)); err != nil {
			return nil, err
		}
		time.Sleep(150 * time.Millisecond)
		if _, err := c.Write([]byte(rest)); err != nil {
			return nil, err
		}
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		_, rerr := io.ReadFull(c, make([]byte, 3))
		time.Sleep(300 * time.Millisecond)
		_, got := cs.since(n)
		return got, rerr
	}
	for _, v := range []struct{ name, first, rest string }{
		{"empty lines first", "\r\n", "GET / HTTP/1.1\r\nHost: %s\r\n\r\n"},
		{"lower-case method", "get", " / HTTP/1.1\r\nHost: %s\r\n\r\n"},
		{"long method", strings.Repeat("A", 40), " / HTTP/1.1\r\nHost: %s\r\n\r\n"},
		{"runs of spaces", "GET  /", "   HTTP/1.1\r\nHost: %s\r\n\r\n"},
	} {
		allowed := v.first + fmt.Sprintf(v.rest, "api.e2e.test")
		if got, err := send(v.first, fmt.Sprintf(v.rest, "api.e2e.test")); err != nil || string(got) != allowed {
			t.Errorf("%s, control with the allowed Host: %v, server got %q; want it through", v.name, err, got)
		}
		if got, err := send(v.first, fmt.Sprintf(v.rest, "evil.example")); err == nil || len(got) != 0 {
			t.Errorf("%s with Host evil.example: %v, server got %q; want refused, nothing received", v.name, err, got)
		}
	}
	if got, err := send("GET / HTTP/1.1\r", "Host: api.e2e.test\r\n\r\n"); err == nil || len(got) != 0 {
		t.Errorf("a bare CR ending the request line: %v, server got %q; want refused, nothing received", err, got)
	}
}
