package namecheck

import (
	"slices"
	"strings"
	"testing"
)

// A real ClientHello (crypto/tls, post-quantum key share) reads its
// server_name; without one it is NoName; every proper prefix needs more.
func TestInspectClientHello(t *testing.T) {
	h := clientHello(t, "Pkgs.Example.org")
	if len(h) < 1200 {
		t.Logf("hello is %d bytes (no post-quantum share in this Go?)", len(h))
	}
	if r := Inspect(h); r.Kind != Named || r.Via != ViaTLS || !slices.Equal(r.Names, []string{"pkgs.example.org"}) {
		t.Fatalf("Inspect(hello) = %+v, want named pkgs.example.org via tls-sni", r)
	}
	for i := 0; i < len(h); i++ {
		if r := Inspect(h[:i]); r.Kind != NeedMore {
			t.Fatalf("Inspect(hello[:%d]) = %+v, want NeedMore", i, r)
		}
	}
	if r := Inspect(clientHello(t, "")); r.Kind != NoName {
		t.Errorf("hello without server_name: %+v, want NoName", r)
	}
	if r := Inspect(clientHello(t, "198.18.1.10")); r.Kind != NoName {
		t.Errorf("hello to an address (crypto/tls sends no SNI): %+v, want NoName", r)
	}
}

// The same hello split into one-byte TLS records is read the same (a
// ClientHello may span records); a duplicated server_name is unreadable.
func TestInspectClientHelloAcrossRecords(t *testing.T) {
	h := clientHello(t, "api.example.com")
	body := h[5:]
	var split []byte
	for _, c := range body {
		split = append(split, 0x16, 3, 1, 0, 1, c)
	}
	if r := Inspect(split); r.Kind != Named || r.Names[0] != "api.example.com" {
		t.Errorf("hello in one-byte records: %+v, want named api.example.com", r)
	}
	// A record of another type before the hello is done.
	bad := append(slices.Clone(split[:60]), 0x17, 3, 3, 0, 1, 0)
	if r := Inspect(bad); r.Kind != Unreadable {
		t.Errorf("hello interleaved with application data: %+v, want Unreadable", r)
	}
}

func TestInspectHTTP(t *testing.T) {
	for _, c := range []struct {
		in    string
		kind  Kind
		names []string
	}{
		{"GET / HTTP/1.1\r\nHost: Evil.Example:8080\r\nAccept: */*\r\n\r\n", Named, []string{"evil.example"}},
		{"GET / HTTP/1.1\r\nhOsT:pkgs.example.org\r\n\r\n", Named, []string{"pkgs.example.org"}},
		{"GET http://evil.example/x HTTP/1.1\r\nHost: pkgs.example.org\r\n\r\n", Named, []string{"evil.example", "pkgs.example.org"}},
		{"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n", Named, []string{"evil.example"}},
		{"GET / HTTP/1.0\r\n\r\n", NoName, nil},
		{"GET / HTTP/1.1\r\nHost: 198.18.1.10\r\n\r\n", NoName, nil},
		{"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n", Unreadable, nil},
		{"GET / HTTP/1.1\r\nHost : b.example\r\n\r\n", Unreadable, nil},
		{"GET / HTTP/1.1\r\nX: y\r\n Host: b.example\r\n\r\n", Unreadable, nil},
		{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", Unreadable, nil},
		{"GET / HTTP/1.1\r\nHost: evil.example\r\n", NeedMore, nil},
		{"GE", NeedMore, nil},
		{"GET / HT", NeedMore, nil},
		{"SSH-2.0-OpenSSH_9.2\r\n", Other, nil},
		{"\x00\x00\x00\x08\x04\xd2\x16\x2f", Other, nil}, // Postgres SSLRequest
		{"EHLO example.com\r\n", Other, nil},
		{"hello", NeedMore, nil}, // a token may still become a method
		{"hello\r\n", Other, nil},
		// What lenient servers still read as a request (nginx skips empty
		// lines before it and takes runs of spaces and any upper-case
		// method; Go's net/http any token as a method).
		{"\r\nGET / HTTP/1.1\r\nHost: evil.example\r\n\r\n", Named, []string{"evil.example"}},
		{"\r\n", NeedMore, nil},
		{"\n\r\n\r\nGE", NeedMore, nil},
		{"GET  /   HTTP/1.1\r\nHost: evil.example\r\n\r\n", Named, []string{"evil.example"}},
		{"GET\t/\tHTTP/1.1\r\nHost: evil.example\r\n\r\n", Named, []string{"evil.example"}},
		{"get / HTTP/1.1\r\nHost: evil.example\r\n\r\n", Named, []string{"evil.example"}},
		{"FRONT_DOOR / HTTP/1.1\r\nHost: evil.example\r\n\r\n", Named, []string{"evil.example"}},
		{strings.Repeat("A", 40) + " / HTTP/1.1\r\nHost: evil.example\r\n\r\n", Named, []string{"evil.example"}},
		{strings.Repeat("A", 40), NeedMore, nil},
		{"GET / HTTP/1.2\r\nHost: evil.example\r\n\r\n", Unreadable, nil},
		{"GET / http/1.1\r\nHost: evil.example\r\n\r\n", Unreadable, nil},
		{"GET / HTTP/1.1 x\r\nHost: evil.example\r\n\r\n", Unreadable, nil},
		{"GET / HTTP/1.1\rHost: evil.example\r\n\r\n", Unreadable, nil},
		{"GET / HTTP/1.1\r\nX: a\rHost: evil.example\r\n\r\n", Unreadable, nil},
		{"GET http://evil.example/\r\n", Named, []string{"evil.example"}}, // HTTP/0.9, absolute
		{"GET /\r\n", Other, nil}, // HTTP/0.9: no name
		{"USER anonymous\r\n", Other, nil},
		{"still here", NeedMore, nil}, // may still become a request line
		{"still there before the restart", Other, nil},
		{"get / HT", NeedMore, nil},
		{"get / ht", NeedMore, nil},
		{"get / x", Other, nil},
		{"get  /", Other, nil},
		{"GET /a b c", NeedMore, nil}, // nginx takes spaces in the target
		{"GET \x00\x01", Other, nil},
		{"GET / HTTP/1.1\rHost", Unreadable, nil},
		{"GET / HTTP/1.1\r", NeedMore, nil},
	} {
		r := Inspect([]byte(c.in))
		if r.Kind != c.kind || !slices.Equal(r.Names, c.names) {
			t.Errorf("Inspect(%q) = %+v, want kind %d names %v", c.in, r, c.kind, c.names)
		}
	}
	long := "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", MaxBytes) + "\r\n"
	if r := Inspect([]byte(long)); r.Kind != Unreadable {
		t.Errorf("headers past MaxBytes without an end: %+v, want Unreadable", r.Kind)
	}
}
