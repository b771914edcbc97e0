package namecheck

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
)

// Kind is what the first bytes of a flow turned out to be.
type Kind uint8

const (
	// NeedMore: the bytes so far begin a ClientHello or an HTTP request
	// whose name is not known yet.
	NeedMore Kind = iota
	// Named: the flow asks for Names (all of them must be allowed).
	Named
	// NoName: a ClientHello without server_name, or an address literal:
	// nothing a front end could route by name. It passes.
	NoName
	// Other: neither TLS nor HTTP/1.x (SSH, Postgres, a raw probe): L3
	// semantics, it passes.
	Other
	// Unreadable: it claims to be TLS or HTTP but does not parse as
	// servers parse it (a malformed or duplicated server_name, two Host
	// headers, HTTP/2 with prior knowledge whose authority is compressed):
	// refused, since a lenient server could read a name from it.
	Unreadable
)

// Via says where a name came from.
const (
	ViaTLS  = "tls-sni"
	ViaHTTP = "http-host"
)

// Result is what Inspect read.
type Result struct {
	Kind  Kind
	Via   string   // ViaTLS or ViaHTTP, for Named, NoName and Unreadable
	Names []string // Named: normalised (lower case, no trailing dot, no port)
}

// MaxBytes bounds what a flow may send before its name is known: a
// ClientHello with post-quantum key shares is ~1.8 KB; 16 KiB is a full
// TLS record, and more headers than any HTTP client sends before Host.
const MaxBytes = 16 << 10

// Inspect reads the first bytes a guest sent on a flow, b from the
// flow's first byte on, contiguous.
func Inspect(b []byte) Result {
	if len(b) == 0 {
		return Result{Kind: NeedMore}
	}
	if b[0] == 0x16 {
		return inspectTLS(b)
	}
	return inspectHTTP(b)
}

// inspectTLS reads a ClientHello, which may span several handshake
// records (content type 22).
func inspectTLS(b []byte) Result {
	need := Result{Kind: NeedMore}
	bad := Result{Kind: Unreadable, Via: ViaTLS}
	var hs []byte
	for {
		if len(hs) >= 1 && hs[0] != 1 {
			return bad // not a ClientHello
		}
		if len(hs) >= 4 {
			n := handshakeLen(hs)
			if 4+n > MaxBytes {
				return bad
			}
			if len(hs) >= 4+n {
				return parseClientHello(hs[4 : 4+n])
			}
		}
		if len(b) < 5 {
			return need
		}
		if b[0] != 0x16 {
			return bad // a ClientHello interleaved with another record
		}
		if b[1] != 3 {
			if len(hs) == 0 {
				return Result{Kind: Other}
			}
			return bad
		}
		n := int(binary.BigEndian.Uint16(b[3:5]))
		if n == 0 || n > 1<<14+256 {
			return bad
		}
		if len(b) < 5+n {
			hs = append(hs, b[5:]...)
			b = nil
			continue
		}
		hs = append(hs, b[5:5+n]...)
		b = b[5+n:]
	}
}

func handshakeLen(hs []byte) int { return int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3]) }

// reader is a bounds-checked cursor over a message.
type reader struct {
	b  []byte
	ok bool
}

func (r *reader) take(n int) []byte {
	if !r.ok || n < 0 || len(r.b) < n {
		r.ok = false
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u8() int {
	b := r.take(1)
	if b == nil {
		return 0
	}
	return int(b[0])
}

func (r *reader) u16() int {
	b := r.take(2)
	if b == nil {
		return 0
	}
	return int(binary.BigEndian.Uint16(b))
}

// parseClientHello reads the server_name of a ClientHello body (RFC 8446
// 4.1.2, RFC 6066 3). With encrypted_client_hello this is the outer name,
// which is what a front end routes by until it decrypts the inner hello.
func parseClientHello(body []byte) Result {
	bad := Result{Kind: Unreadable, Via: ViaTLS}
	r := reader{b: body, ok: true}
	r.take(2 + 32)  // legacy_version, random
	r.take(r.u8())  // legacy_session_id
	r.take(r.u16()) // cipher_suites
	r.take(r.u8())  // legacy_compression_methods
	if !r.ok {
		return bad
	}
	if len(r.b) == 0 {
		return Result{Kind: NoName, Via: ViaTLS} // no extensions at all
	}
	exts := reader{b: r.take(r.u16()), ok: r.ok}
	if !r.ok || len(r.b) != 0 {
		return bad
	}
	seen := map[int]bool{}
	var name string
	for len(exts.b) > 0 {
		typ := exts.u16()
		data := exts.take(exts.u16())
		if !exts.ok {
			return bad
		}
		if seen[typ] {
			return bad // RFC 8446 4.2: a duplicate extension is an error
		}
		seen[typ] = true
		if typ != 0 {
			continue
		}
		sr := reader{b: data, ok: true}
		list := reader{b: sr.take(sr.u16()), ok: sr.ok}
		if !sr.ok || len(sr.b) != 0 {
			return bad
		}
		for len(list.b) > 0 {
			nt := list.u8()
			h := list.take(list.u16())
			if !list.ok {
				return bad
			}
			if nt != 0 {
				continue
			}
			if name != "" || len(h) == 0 {
				return bad // RFC 6066: one host_name
			}
			name = string(h)
		}
		if name == "" {
			return bad
		}
	}
	if name == "" {
		return Result{Kind: NoName, Via: ViaTLS}
	}
	return named(ViaTLS, name)
}

// named normalises a name as a front end reads it: lower case, without a
// trailing dot; an address literal is NoName.
func named(via, name string) Result {
	n := strings.TrimSuffix(strings.ToLower(name), ".")
	if _, err := netip.ParseAddr(strings.Trim(n, "[]")); err == nil {
		return Result{Kind: NoName, Via: via}
	}
	if n == "" {
		return Result{Kind: Unreadable, Via: via}
	}
	return Result{Kind: Named, Via: via, Names: []string{n}}
}

// isTchar reports whether c may appear in an HTTP token (RFC 9110 5.6.2):
// the request method. Servers differ in which methods they take (nginx
// upper case only, Go's net/http any token), so any token counts here.
func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// nginxMethod reports whether m is a method nginx reads (upper case,
// '_' and '-'): nginx then takes runs of spaces, and spaces inside the
// target, so only the line's end tells whether it is HTTP/1.x.
func nginxMethod(m []byte) bool {
	for _, c := range m {
		if (c < 'A' || c > 'Z') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// goRequestLinePrefix reports whether rest, what follows a method of any
// other token (which Go's net/http takes) and its space, can still become
// "TARGET SP HTTP/..." as Go parses it: one space each, no space in the
// target.
func goRequestLinePrefix(rest string) bool {
	target, proto, ok := strings.Cut(rest, " ")
	if !ok {
		return true // the target goes on
	}
	if target == "" {
		return false
	}
	if len(proto) < len("HTTP/") {
		return strings.HasPrefix("HTTP/", strings.ToUpper(proto))
	}
	return strings.HasPrefix(strings.ToUpper(proto), "HTTP/")
}

// inspectHTTP reads an HTTP/1.x request's Host header and, for the
// absolute form (GET http://host/ ...) and CONNECT, its target's host: a
// server uses the target's authority over Host (RFC 9112 3.2.2).
//
// What a lenient server could still read as a request never passes as
// Other: empty lines before the request line are skipped (RFC 9112 2.2
// lets servers ignore them, and nginx does); a method of any length and
// case is a method; fields may be separated by runs of spaces or tabs; a
// line that names an HTTP version it does not parse as, or a bare CR or
// NUL inside the request line or a header, is Unreadable (refused).
func inspectHTTP(b []byte) Result {
	for len(b) > 0 && (b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	// The method: a token, then a space or tab. Until one of them comes
	// the bytes may still become a request line.
	i := 0
	for i < len(b) && isTchar(b[i]) {
		i++
	}
	switch {
	case i == len(b):
		return Result{Kind: NeedMore}
	case i == 0 || b[i] != ' ' && b[i] != '\t':
		return Result{Kind: Other}
	}
	eol := bytes.IndexByte(b, '\n')
	if eol < 0 {
		partial := strings.TrimSuffix(string(b), "\r")
		switch {
		case len(b) >= MaxBytes:
			return Result{Kind: Unreadable, Via: ViaHTTP}
		case strings.ContainsAny(partial, "\r\x00") && strings.Contains(strings.ToUpper(partial), "HTTP/"):
			return Result{Kind: Unreadable, Via: ViaHTTP}
		case strings.ContainsAny(partial, "\r\x00"):
			return Result{Kind: Other} // no request line holds them
		case !nginxMethod(b[:i]) && !goRequestLinePrefix(partial[i+1:]):
			return Result{Kind: Other}
		}
		return Result{Kind: NeedMore}
	}
	line := strings.TrimSuffix(string(b[:eol]), "\r")
	claimsHTTP := strings.Contains(strings.ToUpper(line), "HTTP/")
	if strings.ContainsAny(line, "\r\x00") {
		if claimsHTTP {
			return Result{Kind: Unreadable, Via: ViaHTTP}
		}
		return Result{Kind: Other}
	}
	parts := strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' })
	if !claimsHTTP {
		// Not HTTP/1.x (SMTP's EHLO, FTP's USER, HTTP/0.9): no Host is
		// read, but an absolute target's authority still names a host.
		if len(parts) >= 2 {
			if _, ok := authority(parts[1]); ok {
				return absoluteTarget(parts[1])
			}
		}
		return Result{Kind: Other}
	}
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "HTTP/") {
		return Result{Kind: Unreadable, Via: ViaHTTP}
	}
	if parts[0] == "PRI" && parts[2] == "HTTP/2.0" {
		// HTTP/2 with prior knowledge: its :authority is in HPACK.
		return Result{Kind: Unreadable, Via: ViaHTTP}
	}
	if parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0" {
		return Result{Kind: Unreadable, Via: ViaHTTP}
	}
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if e := bytes.Index(b, []byte("\n\n")); e >= 0 && (end < 0 || e < end) {
		end = e
	}
	if end < 0 {
		if len(b) >= MaxBytes {
			return Result{Kind: Unreadable, Via: ViaHTTP}
		}
		return Result{Kind: NeedMore}
	}
	var names []string
	target := parts[1]
	if parts[0] == "CONNECT" {
		names = append(names, target)
	} else if auth, ok := authority(target); ok {
		names = append(names, auth)
	}
	hosts := 0
	headers := ""
	if end > eol {
		headers = string(b[eol+1 : end])
	}
	for _, h := range strings.Split(headers, "\n") {
		h = strings.TrimSuffix(h, "\r")
		if strings.ContainsAny(h, "\r\x00") {
			return Result{Kind: Unreadable, Via: ViaHTTP} // a bare CR ends a line for some servers
		}
		k := strings.IndexByte(h, ':')
		if k < 0 {
			if h == "" {
				continue
			}
			return Result{Kind: Unreadable, Via: ViaHTTP}
		}
		if h[0] == ' ' || h[0] == '\t' {
			return Result{Kind: Unreadable, Via: ViaHTTP} // obs-fold
		}
		key := h[:k]
		if !strings.EqualFold(strings.TrimRight(key, " \t"), "host") {
			continue
		}
		if key != strings.TrimRight(key, " \t") {
			return Result{Kind: Unreadable, Via: ViaHTTP} // "Host :": RFC 9112 5.1
		}
		hosts++
		names = append(names, strings.TrimSpace(h[k+1:]))
	}
	if hosts > 1 {
		return Result{Kind: Unreadable, Via: ViaHTTP}
	}
	out := Result{Kind: NoName, Via: ViaHTTP}
	for _, n := range names {
		r := named(ViaHTTP, stripPort(n))
		switch r.Kind {
		case Unreadable:
			return r
		case Named:
			out.Kind = Named
			if len(out.Names) == 0 || out.Names[len(out.Names)-1] != r.Names[0] {
				out.Names = append(out.Names, r.Names[0])
			}
		}
	}
	return out
}

// authority is the host[:port] of an absolute-form target
// (scheme://userinfo@host:port/path), and whether target is one.
func authority(target string) (string, bool) {
	k := strings.Index(target, "://")
	if k <= 0 || strings.HasPrefix(target, "/") {
		return "", false
	}
	auth := target[k+3:]
	if j := strings.IndexAny(auth, "/?#"); j >= 0 {
		auth = auth[:j]
	}
	if j := strings.LastIndexByte(auth, '@'); j >= 0 {
		auth = auth[j+1:]
	}
	return auth, true
}

// absoluteTarget is what a request line without an HTTP version (HTTP/0.9,
// which nginx still reads) asks for when its target is absolute.
func absoluteTarget(target string) Result {
	auth, _ := authority(target)
	return named(ViaHTTP, stripPort(auth))
}

// stripPort removes a :port from a host (and the brackets of an IPv6
// literal are kept for named to see).
func stripPort(h string) string {
	if strings.HasPrefix(h, "[") {
		if j := strings.IndexByte(h, ']'); j >= 0 {
			return h[:j+1]
		}
		return h
	}
	if j := strings.LastIndexByte(h, ':'); j >= 0 {
		return h[:j]
	}
	return h
}
