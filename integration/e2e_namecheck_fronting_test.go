package integration

// Fronting on a shared address (issue 22): a session allowed one name
// asks the same address for another by TLS SNI, by HTTP Host, on another
// port, over QUIC; the same with the check off (the control that proves
// the world fronts); a deny entry by SNI in public mode; a first payload
// that is neither TLS nor HTTP.

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// TestE2ENameCheckFrontingBySNI: `curl --connect-to` and `openssl
// s_client -servername` ask the address of an allowed name for another
// name: refused, with a name-mismatch flow event, and not one byte at the
// server; the same tools asking for the allowed name are served.
func TestE2ENameCheckFrontingBySNI(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	fe := n.followFlows("agent")

	// curl resolves through the session's proxy: the control first.
	out, errOut, code := n.curl(ns, "https://"+ncAllowed+"/")
	if code != 0 || out != "served "+ncAllowed+"\n" {
		t.Fatalf("control: curl https://%s/: exit %d %q %s", ncAllowed, code, out, errOut)
	}
	m := n.s.Mark()
	start := time.Now()
	out, errOut, code = n.curl(ns, "--connect-to", ncOther+":443:"+ncAllowed+":443", "https://"+ncOther+"/")
	took := time.Since(start)
	// 35: the TLS handshake failed (reset), 56: a receive failed, 7: no connect.
	if code == 0 || strings.Contains(out, "served") || took > ncRefuseWithin {
		t.Errorf("curl --connect-to %s:443:%s:443: exit %d after %v %q %s, want refused within %v",
			ncOther, ncAllowed, code, took.Round(time.Millisecond), out, errOut, ncRefuseWithin)
	}
	n.noPayload("curl fronting by SNI", m, "")
	fe.expect(t, "curl fronting", map[string]any{"reason": "name-mismatch", "via": "tls-sni", "name": ncOther,
		"dst": ncShared, "dport": float64(443), "lacked": ncOther + ":443"})
	fe.drain(t, 200*time.Millisecond)

	// openssl s_client, the control and the fronting.
	out, errOut, code = n.opensslGet(ns, 443, ncAllowed)
	if code != 0 || !strings.Contains(out, "served "+ncAllowed) {
		t.Errorf("control: openssl s_client -servername %s: exit %d %q %s", ncAllowed, code, out, errOut)
	}
	m = n.s.Mark()
	out, errOut, code = n.opensslGet(ns, 443, ncOther)
	if code == 0 || strings.Contains(out, "served") {
		t.Errorf("openssl s_client -servername %s: exit %d %q %s, want refused", ncOther, code, out, errOut)
	}
	n.noPayload("openssl fronting by SNI", m, "")
	fe.expect(t, "openssl fronting", map[string]any{"reason": "name-mismatch", "name": ncOther, "dst": ncShared})

	// A Go client: the refusal is a reset or an ICMP error, quickly.
	m = n.s.Mark()
	body, took, err := n.tryTLS(ns, 443, n.tlsConf(ncOther), world.HelloPlan{}, 20*time.Second)
	n.refused("go client fronting by SNI", m, "", body, err, took, ncRefuseWithin)
	body, _, err = n.tryTLS(ns, 443, n.tlsConf(ncAllowed), world.HelloPlan{}, 10*time.Second)
	n.served("go client, the allowed name", body, err, ncAllowed)

	// why answers for the name at the destination; inspect counts.
	if a := n.whySNI("agent", ncShared+":443", ncOther); a.Reason != "name-mismatch" || a.Entry != ncOther+":443" || a.Verdict == api.WhyAllowed {
		t.Errorf("why %s:443 --sni %s: %+v, want refused, name-mismatch, entry %s:443", ncShared, ncOther, a, ncOther)
	}
	if a := n.whySNI("agent", ncShared+":443", ncAllowed); a.Verdict != api.WhyAllowed {
		t.Errorf("why %s:443 --sni %s: %+v, want allowed", ncShared, ncAllowed, a)
	}
	nc := n.inspect("agent").NameCheck
	if nc == nil || nc.Mode != "tls" || nc.Refused < 3 || nc.Allowed < 3 || nc.Checked != nc.Allowed+nc.Refused+nc.Passed {
		t.Errorf("inspect name_check: %+v, want mode tls, at least 3 refused and 3 allowed, checked their sum", nc)
	}
}

// TestE2ENameCheckFrontingByHost: plain HTTP to the address of an allowed
// name with another Host is refused, nothing reaching the server; the
// allowed Host is served. curl --connect-to does it as a user would.
func TestE2ENameCheckFrontingByHost(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	fe := n.followFlows("agent")
	n.attest(ns, ncAllowed)

	body, err := world.HTTPFetch(ns, n.at(world.SharedHTTPPort), ncAllowed, 5*time.Second)
	n.served("control: Host "+ncAllowed, body, err, ncAllowed)
	m := n.s.Mark()
	start := time.Now()
	body, err = world.HTTPFetch(ns, n.at(world.SharedHTTPPort), ncOther, 20*time.Second)
	n.refused("Host "+ncOther, m, "", body, err, time.Since(start), ncRefuseWithin)
	fe.expect(t, "fronting by Host", map[string]any{"reason": "name-mismatch", "via": "http-host", "name": ncOther,
		"dst": ncShared, "dport": float64(80), "lacked": ncOther + ":80"})

	m = n.s.Mark()
	out, errOut, code := n.curl(ns, "--connect-to", ncOther+":80:"+ncAllowed+":80", "http://"+ncOther+"/")
	if code == 0 || strings.Contains(out, "served") {
		t.Errorf("curl --connect-to %s:80:%s:80: exit %d %q %s, want refused", ncOther, ncAllowed, code, out, errOut)
	}
	n.noPayload("curl fronting by Host", m, "")
	if out, errOut, code = n.curl(ns, "http://"+ncAllowed+"/"); code != 0 || out != "served "+ncAllowed+"\n" {
		t.Errorf("control: curl http://%s/: exit %d %q %s", ncAllowed, code, out, errOut)
	}
}

// TestE2ENameCheckOff: with --name-check off the same fronting is served
// (the control that shows the world really fronts, and what the check
// stops); an update turns the check on (refused, nothing at the server)
// and off again.
func TestE2ENameCheckOff(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("open", "--allow", ncAllowed, "--name-check", "off")
	ns := n.nsPath("open")
	front := []string{"--connect-to", ncOther + ":443:" + ncAllowed + ":443", "https://" + ncOther + "/"}
	if out, errOut, code := n.curl(ns, front...); code != 0 || out != "served "+ncOther+"\n" {
		t.Fatalf("--name-check off: curl fronting: exit %d %q %s, want served by %s (the world fronts)", code, out, errOut, ncOther)
	}
	body, err := world.HTTPFetch(ns, n.at(world.SharedHTTPPort), ncOther, 5*time.Second)
	n.served("--name-check off: Host "+ncOther, body, err, ncOther)

	n.update("open", "--name-check", "tls")
	m := n.s.Mark()
	body, took, err := n.tryTLS(ns, 443, n.tlsConf(ncOther), world.HelloPlan{}, 20*time.Second)
	n.refused("after update --name-check tls", m, "", body, err, took, ncRefuseWithin)
	body, _, err = n.tryTLS(ns, 443, n.tlsConf(ncAllowed), world.HelloPlan{}, 10*time.Second)
	n.served("after update --name-check tls, the allowed name", body, err, ncAllowed)

	n.update("open", "--name-check", "off")
	body, _, err = n.tryTLS(ns, 443, n.tlsConf(ncOther), world.HelloPlan{}, 10*time.Second)
	n.served("after update --name-check off", body, err, ncOther)
}

// TestE2ENameCheckOtherPorts: the check is on every port a name admits,
// not only 443: TLS on 8443 with another SNI is refused (the allowed SNI
// served); an SSH-like first payload to the allowed name, neither TLS nor
// HTTP, keeps L3 semantics and passes.
func TestE2ENameCheckOtherPorts(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed)
	ns := n.nsPath("agent")
	n.attest(ns, ncAllowed)

	body, _, err := n.tryTLS(ns, world.SharedAltTLSPort, n.tlsConf(ncAllowed), world.HelloPlan{}, 10*time.Second)
	n.served("control: TLS :8443 "+ncAllowed, body, err, ncAllowed)
	m := n.s.Mark()
	body, took, err := n.tryTLS(ns, world.SharedAltTLSPort, n.tlsConf(ncOther), world.HelloPlan{}, 20*time.Second)
	n.refused("TLS :8443 "+ncOther, m, "", body, err, took, ncRefuseWithin)

	m = n.s.Mark()
	got, err := world.SSHLikeExchange(ns, n.at(world.SharedSSHPort), 10*time.Second)
	if err != nil || got != world.SharedSSHBanner+"ok SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n" {
		t.Errorf("ssh-like to %s:22: %q %v, want the banner and the echo (no TLS, no HTTP: passes)", ncAllowed, got, err)
	}
	n.delivered("ssh-like", m, "ssh:22", []byte("SSH-2.0-OpenSSH_9.2p1"))
	if nc := n.inspect("agent").NameCheck; nc == nil || nc.Passed < 1 || nc.Refused < 1 {
		t.Errorf("inspect name_check: %+v, want the ssh-like flow passed and the :8443 one refused", nc)
	}
}

// TestE2ENameCheckQUICFallback: UDP/443 to an address a name admitted is refused
// with an ICMP error (clients fall back to TCP, where the name is
// checked), the datagram never reaching the server; with --name-check off
// the same datagram arrives (the control).
func TestE2ENameCheckQUICFallback(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed)
	n.createNetOnly("open", "--allow", ncAllowed, "--name-check", "off")
	fe := n.followFlows("agent")
	for _, s := range []string{"agent", "open"} {
		n.attest(n.nsPath(s), ncAllowed)
	}
	m := n.s.Mark()
	if err := world.QUICInitial(n.nsPath("open"), n.at(world.SharedQUICPort), world.BlockTimeout); !world.IsTimeout(err) {
		t.Errorf("--name-check off: quic initial: %v, want it sent and unanswered (the sink answers nothing)", err)
	}
	if cs := n.s.Since(m, "udp:443"); len(cs) != 1 || len(cs[0].Bytes()) != 1200 {
		t.Errorf("--name-check off: the sink got %v, want the 1200-byte datagram (the control)", cs)
	}
	m = n.s.Mark()
	err := world.QUICInitial(n.nsPath("agent"), n.at(world.SharedQUICPort), e2eRejectWait)
	if !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Errorf("quic initial to a name-admitted address: %v, want EHOSTUNREACH (ICMP admin-prohibited)", err)
	}
	n.noPayload("quic initial", m, "udp:443")
	fe.expect(t, "quic", map[string]any{"reason": "quic", "proto": "udp", "dst": ncShared, "dport": float64(443)})
}

// TestE2ENameCheckDenyBySNIPublic: in public mode a deny entry by name is
// enforced by the name a flow asks for, not only in DNS: a TLS connection
// by address with the denied SNI is refused (nothing at the server), the
// same address with another SNI is served; a public session without the
// deny is served the denied name (the control).
func TestE2ENameCheckDenyBySNIPublic(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("pub", "--egress", "public", "--deny", ncOther)
	n.createNetOnly("free", "--egress", "public")
	ns := n.nsPath("pub")
	e2eLookupWant(t, ns, "denied name", ncOther, dns.RcodeNameError)
	body, _, err := n.tryTLS(n.nsPath("free"), 443, n.tlsConf(ncOther), world.HelloPlan{}, 10*time.Second)
	n.served("control: public without the deny", body, err, ncOther)
	body, _, err = n.tryTLS(ns, 443, n.tlsConf(ncAllowed), world.HelloPlan{}, 10*time.Second)
	n.served("public with the deny, another name", body, err, ncAllowed)
	m := n.s.Mark()
	body, took, err := n.tryTLS(ns, 443, n.tlsConf(ncOther), world.HelloPlan{}, 20*time.Second)
	n.refused("public, denied name by SNI on a direct connection", m, "", body, err, took, ncRefuseWithin)
	m = n.s.Mark()
	start := time.Now()
	body, err = world.HTTPFetch(ns, n.at(world.SharedHTTPPort), ncOther, 20*time.Second)
	n.refused("public, denied name by Host", m, "", body, err, time.Since(start), ncRefuseWithin)
}

// TestE2ENameCheckOnDeny: a refused name gets the session's --on-deny, as
// every refusal does: reset is a TCP reset (ECONNRESET), drop is silence
// (the client's own timeout), the flow event's action says which; in
// every mode nothing reaches the server and the allowed name is served.
func TestE2ENameCheckOnDeny(t *testing.T) {
	n := newNameCheckE2E(t)
	n.createNetOnly("agent", "--allow", ncAllowed, "--on-deny", "reset")
	ns := n.nsPath("agent")
	fe := n.followFlows("agent")
	n.attest(ns, ncAllowed)
	for _, tc := range []struct {
		mode, action string
		want         error // nil: a timeout
	}{
		{"reset", "rejected", syscall.ECONNRESET},
		{"drop", "dropped", nil},
	} {
		n.update("agent", "--on-deny", tc.mode)
		body, _, err := n.tryTLS(ns, 443, n.tlsConf(ncAllowed), world.HelloPlan{}, 10*time.Second)
		n.served(tc.mode+": the allowed name", body, err, ncAllowed)
		m := n.s.Mark()
		body, took, err := n.tryTLS(ns, 443, n.tlsConf(ncOther), world.HelloPlan{}, 3*time.Second)
		switch {
		case err == nil:
			t.Errorf("%s: fronting answered %q, want refused", tc.mode, body)
		case tc.want == nil && !world.IsTimeout(err):
			t.Errorf("%s: fronting: %v after %v, want silence (a timeout)", tc.mode, err, took.Round(time.Millisecond))
		case tc.want != nil && (!errors.Is(err, tc.want) || took > ncRefuseWithin):
			t.Errorf("%s: fronting: %v after %v, want %v within %v", tc.mode, err, took.Round(time.Millisecond), tc.want, ncRefuseWithin)
		}
		n.noPayload(tc.mode+": fronting", m, "")
		fe.expect(t, tc.mode+": fronting", map[string]any{"action": tc.action, "reason": "name-mismatch", "name": ncOther})
		fe.drain(t, 300*time.Millisecond)
	}
}
