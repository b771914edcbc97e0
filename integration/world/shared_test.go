package world

import (
	"bytes"
	"crypto/tls"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestWorldSharedFronts checks, from the simulated host (no enforcerd in
// the way), that the shared address really fronts: the name a client
// asks for by SNI, by Host or inside ECH is the name served, whatever
// name the client resolved; every client of the name-check tests works;
// and every byte the servers got is in their captures. These are the
// positive controls the name-check tests stand on.
func TestWorldSharedFronts(t *testing.T) {
	w := New(t)
	s, err := w.ServeShared("pkgs.example.org", "evil.example")
	if err != nil {
		t.Fatal(err)
	}
	tlsAt := netip.AddrPortFrom(s.Addr, SharedTLSPort)
	conf := func(name string) *tls.Config {
		return &tls.Config{ServerName: name, RootCAs: s.CA, MinVersion: tls.VersionTLS13}
	}
	for _, tc := range []struct {
		what string
		dst  netip.AddrPort
		conf *tls.Config
		plan HelloPlan
		want string
	}{
		{"sni pkgs", tlsAt, conf("pkgs.example.org"), HelloPlan{}, "served pkgs.example.org\n"},
		{"sni evil", tlsAt, conf("evil.example"), HelloPlan{}, "served evil.example\n"},
		{"sni evil on 8443", netip.AddrPortFrom(s.Addr, SharedAltTLSPort), conf("evil.example"), HelloPlan{}, "served evil.example\n"},
		{"split", tlsAt, conf("evil.example"), HelloPlan{SplitAt: 40, Gap: 50 * time.Millisecond}, "served evil.example\n"},
		{"trickle", tlsAt, conf("evil.example"), HelloPlan{Trickle: time.Millisecond}, "served evil.example\n"},
		{"no sni", tlsAt, noSNI(s), HelloPlan{}, "served pkgs.example.org\n"},
	} {
		m := s.Mark()
		body, err := TLSFetch(w.HostPath, tc.dst, tc.conf, tc.plan, "ignored.example", 20*time.Second)
		if err != nil || body != tc.want {
			t.Errorf("%s: %q %v, want %q", tc.what, body, err, tc.want)
			continue
		}
		cs := s.Since(m, "")
		if len(cs) != 1 || len(cs[0].Bytes()) < 200 || cs[0].Bytes()[0] != 0x16 {
			t.Errorf("%s: captures %v, want one holding a TLS hello", tc.what, cs)
		}
	}

	// ECH: the outer name is the config's public name, the name served is
	// the inner one.
	list, err := s.ECHConfigList("pkgs.example.org")
	if err != nil {
		t.Fatal(err)
	}
	ech := conf("evil.example")
	ech.EncryptedClientHelloConfigList = list
	m := s.Mark()
	if body, err := TLSFetch(w.HostPath, tlsAt, ech, HelloPlan{}, "x", 5*time.Second); err != nil || body != "served evil.example\n" {
		t.Errorf("ech (outer pkgs, inner evil): %q %v", body, err)
	}
	if cs := s.Since(m, ""); len(cs) != 1 || !bytes.Contains(cs[0].Bytes(), []byte("pkgs.example.org")) || bytes.Contains(cs[0].Bytes(), []byte("evil.example")) {
		t.Errorf("ech: capture %v: want the outer name in the clear and the inner one not", cs)
	}

	// GREASE ECH: the server reads the rewritten hello and chooses by its
	// SNI; the client's transcript differs, so the handshake fails after.
	m = s.Mark()
	_, err = TLSFetch(w.HostPath, tlsAt, conf("evil.example"), HelloPlan{Rewrite: AddGreaseECH}, "x", 5*time.Second)
	if err == nil {
		t.Error("grease ech: the handshake completed over a rewritten hello")
	}
	if cs := s.Since(m, ""); len(cs) != 1 || cs[0].ServerName() != "evil.example" {
		t.Errorf("grease ech: captures %v, want one whose hello the server read (sni evil.example)", cs)
	}

	m = s.Mark()
	if body, err := HTTPFetch(w.HostPath, netip.AddrPortFrom(s.Addr, SharedHTTPPort), "evil.example", 3*time.Second); err != nil || body != "served evil.example\n" {
		t.Errorf("http host evil: %q %v", body, err)
	}
	if cs := s.Since(m, "http:80"); len(cs) != 1 || cs[0].Host() != "evil.example" || !strings.HasPrefix(string(cs[0].Bytes()), "GET / HTTP/1.1\r\n") {
		t.Errorf("http: captures %v", cs)
	}
	if got, err := SSHLikeExchange(w.HostPath, netip.AddrPortFrom(s.Addr, SharedSSHPort), 3*time.Second); err != nil || got != SharedSSHBanner+"ok SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n" {
		t.Errorf("ssh-like: %q %v", got, err)
	}
	m = s.Mark()
	if err := QUICInitial(w.HostPath, netip.AddrPortFrom(s.Addr, SharedQUICPort), 300*time.Millisecond); !IsTimeout(err) {
		t.Errorf("quic initial to the sink: %v, want a timeout (the sink answers nothing)", err)
	}
	if cs := s.Since(m, "udp:443"); len(cs) != 1 || len(cs[0].Bytes()) != 1200 {
		t.Errorf("udp sink: captures %v, want one of 1200 bytes", cs)
	}
}

// noSNI is a client config that sends no server_name and checks the
// default certificate itself.
func noSNI(s *Shared) *tls.Config {
	return NoSNIConfig(s.CA, s.Names[0])
}
