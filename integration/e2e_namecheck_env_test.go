package integration

// The name check's end-to-end tests (issue 22) share this environment: a
// world whose shared address (198.18.3.10, world.ServeShared) serves two
// names, as a CDN's front end does, and a DNS zone that maps both to it.
// A session allowed ncAllowed may reach the address; asking it for
// ncOther by SNI or Host is fronting. Each refusal is checked where it
// matters: the guest's client ends with a refusal (never a timeout, never
// an answer), and the shared server's captures prove that no payload byte
// of the refused flow reached the simulated internet. Each stands next to
// a control that is served.

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/integration/world"
)

const (
	ncAllowed = "pkgs.example.org" // the name a session is given
	ncOther   = "evil.example"     // another tenant of the same address
	ncShared  = "198.18.3.10"
	// ncSettle is how long the test waits after a refusal before it reads
	// the captures: a byte let through would have arrived by then.
	ncSettle = 300 * time.Millisecond
	// ncRefuseWithin bounds how long a refused fetch may take.
	ncRefuseWithin = 5 * time.Second
)

// ncEnv is an end-to-end environment with the shared address served.
type ncEnv struct {
	*e2eEnv
	s *world.Shared
}

func newNameCheckE2E(t *testing.T, extra ...string) *ncEnv {
	t.Helper()
	e := newE2E(t, extra...)
	s, err := e.w.ServeShared(ncAllowed, ncOther)
	if err != nil {
		t.Fatalf("serve the shared address: %v", err)
	}
	for _, name := range []string{ncAllowed, ncOther} {
		e.w.DNS.AddRR(name + ". 300 IN A " + ncShared)
	}
	return &ncEnv{e2eEnv: e, s: s}
}

// attest looks name up through the session's proxy (which opens the
// shared address for the session) and checks the answer.
func (n *ncEnv) attest(ns, name string) {
	n.t.Helper()
	e2eLookupWant(n.t, ns, "look up "+name, name, dns.RcodeSuccess, ncShared)
}

func (n *ncEnv) at(port uint16) netip.AddrPort {
	return netip.AddrPortFrom(n.s.Addr, port)
}

func (n *ncEnv) tlsConf(sni string) *tls.Config {
	return &tls.Config{ServerName: sni, RootCAs: n.s.CA, MinVersion: tls.VersionTLS13}
}

// fetchTLS fetches https://sni/ from the shared address's port (Host the
// same as the SNI), the hello sent as plan says.
func (n *ncEnv) fetchTLS(ns string, port uint16, conf *tls.Config, plan world.HelloPlan, timeout time.Duration) (string, error) {
	host := conf.ServerName
	if host == "" {
		host = ncAllowed
	}
	return world.TLSFetch(ns, n.at(port), conf, plan, host, timeout)
}

// served checks that a fetch was answered by want's server.
func (n *ncEnv) served(what, body string, err error, want string) {
	n.t.Helper()
	if err != nil || body != "served "+want+"\n" {
		n.t.Errorf("%s: %q %v, want served by %s", what, body, err, want)
	}
}

// refused checks that a fetch that began after mark ended in a refusal
// within limit, and that no capture on server (all when "") begun since
// mark holds a byte.
func (n *ncEnv) refused(what string, mark world.Mark, server, body string, err error, took, limit time.Duration) {
	n.t.Helper()
	switch {
	case err == nil:
		n.t.Errorf("%s: answered %q, want refused", what, body)
	case !world.IsRefusal(err):
		n.t.Errorf("%s: %v after %v, want a refusal (reset or ICMP error)", what, err, took.Round(time.Millisecond))
	case took > limit:
		n.t.Errorf("%s: refused after %v, want within %v", what, took.Round(time.Millisecond), limit)
	}
	n.noPayload(what, mark, server)
}

// noPayload checks that no capture on server begun since mark holds a
// byte: the connection may have been accepted (the check reads payload,
// not the handshake), nothing it carried may have arrived.
func (n *ncEnv) noPayload(what string, mark world.Mark, server string) {
	n.t.Helper()
	time.Sleep(ncSettle)
	for _, c := range n.s.Since(mark, server) {
		if b := c.Bytes(); len(b) > 0 {
			n.t.Errorf("%s: %d payload bytes reached the simulated internet: %s (first %q)", what, len(b), c, head(b, 48))
		}
	}
}

// delivered checks that a capture on server begun since mark holds want.
func (n *ncEnv) delivered(what string, mark world.Mark, server string, want []byte) {
	n.t.Helper()
	for _, c := range n.s.Since(mark, server) {
		if bytes.Contains(c.Bytes(), want) {
			return
		}
	}
	n.t.Errorf("%s: no capture on %s holds the %d bytes sent; captures: %v", what, server, len(want), n.s.Since(mark, server))
}

func head(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// tryTLS runs fetchTLS, timed.
func (n *ncEnv) tryTLS(ns string, port uint16, conf *tls.Config, plan world.HelloPlan, timeout time.Duration) (string, time.Duration, error) {
	start := time.Now()
	body, err := n.fetchTLS(ns, port, conf, plan, timeout)
	return body, time.Since(start), err
}

// tool runs a host tool (curl, openssl) in a session's network namespace,
// with the guest's resolver: a private mount namespace binds a
// resolv.conf naming the session's DNS proxy over /etc/resolv.conf, so
// the tool resolves names through the proxy as the guest does. It
// returns stdout, stderr and the exit status.
func (n *ncEnv) tool(ns string, stdin string, argv ...string) (string, string, int) {
	n.t.Helper()
	world.RequireTool(n.t, "unshare")
	world.RequireTool(n.t, "nsenter")
	world.RequireTool(n.t, argv[0])
	resolv := filepath.Join(n.t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+e2eAnycastDNS.Addr().String()+"\noptions timeout:2 attempts:1\n"), 0o644); err != nil {
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	script := `r=$1; n=$2; shift 2; mount --bind "$r" /etc/resolv.conf && exec nsenter --net="$n" -- "$@"`
	cmd := exec.CommandContext(ctx, "unshare", append([]string{"-m", "--propagation", "private", "sh", "-c", script, "sh", resolv, ns}, argv...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		n.t.Fatalf("run %s in %s: %v", strings.Join(argv, " "), ns, err)
	}
	return out.String(), errOut.String(), code
}

// curl runs curl in the session with the test CA, bounded in time.
func (n *ncEnv) curl(ns string, args ...string) (string, string, int) {
	n.t.Helper()
	return n.tool(ns, "", append([]string{"curl", "-sS", "--max-time", "15", "--cacert", n.s.CAFile}, args...)...)
}

// opensslGet runs openssl s_client to the shared address's port with
// -servername sni, verifying against the test CA, and asks GET / with Host
// sni over it.
func (n *ncEnv) opensslGet(ns string, port uint16, sni string) (string, string, int) {
	n.t.Helper()
	req := "GET / HTTP/1.1\r\nHost: " + sni + "\r\nConnection: close\r\n\r\n"
	return n.tool(ns, req, "timeout", "15", "openssl", "s_client", "-connect", n.at(port).String(),
		"-servername", sni, "-CAfile", n.s.CAFile, "-verify_return_error", "-quiet")
}
