package world

import (
	"bufio"
	"context"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Ports the shared address serves on.
const (
	SharedTLSPort      = 443  // TLS, certificate chosen by SNI, HTTP/1.1 inside
	SharedAltTLSPort   = 8443 // the same TLS server on a port that is not 443
	SharedHTTPPort     = 80   // HTTP/1.1 routed by Host
	SharedSSHPort      = 22   // an SSH-like server: a banner, then a line echoed
	SharedQUICPort     = 443  // UDP: a sink that records every datagram
	SharedSSHBanner    = "SSH-2.0-WorldSSH_1.0\r\n"
	sharedCaptureLimit = 1 << 20
)

// Shared is a CDN's front end in the simulated internet: one address (the
// world's SharedAddr) serving several names, the TLS certificate chosen by
// SNI (the inner name under ECH) and the HTTP answer by Host. Every
// connection it accepts and every datagram it receives is a Capture of
// every byte that arrived: the evidence that no payload of a refused flow
// reached the simulated internet.
//
// Answers name what was served: "served NAME\n", NAME the certificate's
// name over TLS, the Host over plain HTTP.
type Shared struct {
	Addr netip.Addr
	// Addr6 is the v6 twin of Addr (SharedAddr6, once ServeIPv6 ran):
	// the same servers, names and captures.
	Addr6 netip.Addr
	Names []string // the names served; the first is the default (a hello without SNI)
	// CAFile is the PEM of the test CA that signed every certificate, for
	// curl --cacert and openssl s_client -CAfile; CA the same as a pool.
	CAFile string
	CA     *x509.CertPool

	echKeys []tls.EncryptedClientHelloKey
	echPub  []byte // the X25519 public key every ECH config carries
	tlsConf *tls.Config

	mu       sync.Mutex
	captures []*Capture
}

// Capture is what one accepted TCP connection (or one UDP source) brought
// to a shared server.
type Capture struct {
	Server string         // "tls:443", "tls:8443", "http:80", "ssh:22", "udp:443"
	From   netip.AddrPort // as the server saw it (after any NAT)
	At     time.Time      // accepted (the first datagram, for UDP)

	mu         sync.Mutex
	data       []byte
	serverName string // TLS: the name the certificate was chosen by
	host       string // HTTP: the Host of the first request
	closed     bool
}

// Bytes returns every byte received so far.
func (c *Capture) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.data...)
}

// ServerName is the name a TLS server chose its certificate by ("" before
// a whole ClientHello arrived, or over plain HTTP).
func (c *Capture) ServerName() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.serverName
}

// Host is the Host of the first HTTP request ("" before one arrived).
func (c *Capture) Host() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.host
}

// Closed reports whether the server closed the connection (a reset it
// got ends its read at once).
func (c *Capture) Closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *Capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%s from %s: %d bytes, sni %q, host %q, closed %v", c.Server, c.From, len(c.data), c.serverName, c.host, c.closed)
}

func (c *Capture) add(b []byte) {
	c.mu.Lock()
	if len(c.data)+len(b) <= sharedCaptureLimit {
		c.data = append(c.data, b...)
	}
	c.mu.Unlock()
}

// Mark is a point in a Shared's log of captures: Since(mark) lists those
// that began after it.
type Mark int

// Mark returns the current end of the log.
func (s *Shared) Mark() Mark {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Mark(len(s.captures))
}

// Since lists the captures that began after m, on server (all servers when
// server is "").
func (s *Shared) Since(m Mark, server string) []*Capture {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Capture
	for _, c := range s.captures[m:] {
		if server == "" || c.Server == server {
			out = append(out, c)
		}
	}
	return out
}

func (s *Shared) newCapture(server string, from net.Addr) *Capture {
	c := &Capture{Server: server, At: time.Now()}
	if ap, err := netip.ParseAddrPort(from.String()); err == nil {
		c.From = ap
	}
	s.mu.Lock()
	s.captures = append(s.captures, c)
	s.mu.Unlock()
	return c
}

// ServeShared starts the shared address's servers for names (the first is
// the default certificate), with a CA made for this world, and stops them
// when the world closes.
func (w *World) ServeShared(names ...string) (*Shared, error) {
	if len(names) == 0 {
		return nil, errors.New("serve shared: want at least one name")
	}
	s := &Shared{Addr: w.SharedAddr, Names: names}
	dir, err := os.MkdirTemp("", "ew"+w.ID+"ca")
	if err != nil {
		return nil, fmt.Errorf("serve shared: %w", err)
	}
	w.onClose(func() error { return os.RemoveAll(dir) })
	certs, err := s.makeCertificates(dir)
	if err != nil {
		return nil, err
	}
	if err := s.makeECHKeys(); err != nil {
		return nil, err
	}
	tlsConf := &tls.Config{
		MinVersion: tls.VersionTLS13, // ECH keys want TLS 1.3 at least
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			name := strings.ToLower(hi.ServerName)
			if rc, ok := hi.Conn.(*recordingConn); ok {
				rc.capture.mu.Lock()
				rc.capture.serverName = name
				rc.capture.mu.Unlock()
			}
			if c, ok := certs[name]; ok {
				return c, nil
			}
			return certs[names[0]], nil
		},
		EncryptedClientHelloKeys: s.echKeys,
	}
	s.tlsConf = tlsConf
	if err := s.serveAt(w, s.Addr); err != nil {
		return nil, err
	}
	return s, nil
}

// SharedAddr6 is the shared address's v6 twin in the world's IPv6
// internet (2001:2::/48), as 198.18.3.10 is in the IPv4 one.
var SharedAddr6 = netip.MustParseAddr("2001:2:0:3::10")

// ServeIPv6 serves the same names, by SNI and Host, on SharedAddr6 too
// (the world must have IPv6: EnableIPv6); its connections are captures of
// the same log, told apart by their From.
func (s *Shared) ServeIPv6(w *World) error {
	if len(w.Web6) == 0 {
		return errors.New("serve shared over ipv6: the world has no ipv6 (want EnableIPv6 first)")
	}
	if err := w.addLoopback6(SharedAddr6); err != nil {
		return fmt.Errorf("serve shared over ipv6: %w", err)
	}
	s.Addr6 = SharedAddr6
	return s.serveAt(w, SharedAddr6)
}

// serveAt starts every server of the shared address on addr.
func (s *Shared) serveAt(w *World, addr netip.Addr) error {
	for _, port := range []int{SharedTLSPort, SharedAltTLSPort} {
		if err := s.serveHTTP(w, addr, port, "tls", s.tlsConf); err != nil {
			return err
		}
	}
	if err := s.serveHTTP(w, addr, SharedHTTPPort, "http", nil); err != nil {
		return err
	}
	if err := s.serveSSHLike(w, addr); err != nil {
		return err
	}
	return s.serveUDPSink(w, addr)
}

// serveHTTP serves HTTP/1.1 on port (over TLS when conf is set), each
// answer naming what was served.
func (s *Shared) serveHTTP(w *World, addr netip.Addr, port int, kind string, conf *tls.Config) error {
	l, err := ListenTCP(w.NetPath, netip.AddrPortFrom(addr, uint16(port)))
	if err != nil {
		return err
	}
	rl := &recordingListener{Listener: l, shared: s, server: fmt.Sprintf("%s:%d", kind, port)}
	type captureKey struct{}
	srv := &http.Server{
		// Longer than any bound of the check under test: a client held
		// by it must learn its fate from the check, not from this
		// server's own timeout (a FIN that reads as EOF).
		ReadHeaderTimeout: 60 * time.Second,
		TLSConfig:         conf,
		// A refused or rewritten hello is a handshake error the tests
		// cause on purpose; the captures say what arrived.
		ErrorLog: log.New(io.Discard, "", 0),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*tls.Conn); ok {
				c = tc.NetConn()
			}
			if rc, ok := c.(*recordingConn); ok {
				return context.WithValue(ctx, captureKey{}, rc.capture)
			}
			return ctx
		},
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			host, _, err := net.SplitHostPort(r.Host)
			if err != nil {
				host = r.Host
			}
			host = strings.ToLower(host)
			served := host
			if r.TLS != nil {
				served = strings.ToLower(r.TLS.ServerName)
				if served == "" {
					served = s.Names[0]
				}
			}
			if c, ok := r.Context().Value(captureKey{}).(*Capture); ok {
				c.mu.Lock()
				if c.host == "" {
					c.host = host
				}
				c.mu.Unlock()
			}
			io.WriteString(rw, "served "+served+"\n")
		}),
	}
	w.onClose(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return srv.Shutdown(ctx)
	})
	if conf != nil {
		go srv.Serve(tls.NewListener(rl, conf))
	} else {
		go srv.Serve(rl)
	}
	return nil
}

// serveSSHLike speaks first, as an SSH server does: a banner; then it
// answers every line it reads with "ok LINE".
func (s *Shared) serveSSHLike(w *World, addr netip.Addr) error {
	l, err := ListenTCP(w.NetPath, netip.AddrPortFrom(addr, SharedSSHPort))
	if err != nil {
		return err
	}
	w.onClose(l.Close)
	rl := &recordingListener{Listener: l, shared: s, server: fmt.Sprintf("ssh:%d", SharedSSHPort)}
	go func() {
		for {
			c, err := rl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err := io.WriteString(c, SharedSSHBanner); err != nil {
					return
				}
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, "ok "+line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return nil
}

// serveUDPSink records every datagram to UDP :443, one Capture per source,
// and answers none (no QUIC server: a datagram that arrives is the leak).
func (s *Shared) serveUDPSink(w *World, addr netip.Addr) error {
	pc, err := ListenUDP(w.NetPath, netip.AddrPortFrom(addr, SharedQUICPort))
	if err != nil {
		return err
	}
	w.onClose(pc.Close)
	go func() {
		bySource := map[string]*Capture{}
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			c := bySource[from.String()]
			if c == nil {
				c = s.newCapture(fmt.Sprintf("udp:%d", SharedQUICPort), from)
				bySource[from.String()] = c
			}
			c.add(buf[:n])
		}
	}()
	return nil
}

// recordingListener hands out connections that record what they read.
type recordingListener struct {
	net.Listener
	shared *Shared
	server string
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: c, capture: l.shared.newCapture(l.server, c.RemoteAddr())}, nil
}

type recordingConn struct {
	net.Conn
	capture *Capture
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.capture.add(b[:n])
	}
	return n, err
}

func (c *recordingConn) Close() error {
	c.capture.mu.Lock()
	c.capture.closed = true
	c.capture.mu.Unlock()
	return c.Conn.Close()
}

// makeCertificates makes a CA (written to dir/ca.pem) and one certificate
// per name signed by it.
func (s *Shared) makeCertificates(dir string) (map[string]*tls.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("serve shared: ca key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "enforcerd test world CA " + filepath.Base(dir)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("serve shared: ca certificate: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("serve shared: parse ca: %w", err)
	}
	s.CA = x509.NewCertPool()
	s.CA.AddCert(caCert)
	s.CAFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(s.CAFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		return nil, fmt.Errorf("serve shared: %w", err)
	}
	certs := map[string]*tls.Certificate{}
	for i, name := range s.Names {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("serve shared: key for %s: %w", name, err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)),
			Subject:      pkix.Name{CommonName: name},
			DNSNames:     []string{name},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return nil, fmt.Errorf("serve shared: certificate for %s: %w", name, err)
		}
		certs[strings.ToLower(name)] = &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	return certs, nil
}

// makeECHKeys makes one X25519 key and, for every served name, an ECH
// config whose public (outer) name is that name, config id = index + 1.
func (s *Shared) makeECHKeys() error {
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("serve shared: ech key: %w", err)
	}
	s.echPub = key.PublicKey().Bytes()
	for i, name := range s.Names {
		s.echKeys = append(s.echKeys, tls.EncryptedClientHelloKey{
			Config:     marshalECHConfig(uint8(i+1), s.echPub, name),
			PrivateKey: key.Bytes(),
		})
	}
	return nil
}

// ECHConfigList is the ECHConfigList (as an HTTPS record's ech= carries
// it) whose public name is outer, one of the served names: a client with
// it sends outer in the clear and its real name encrypted.
func (s *Shared) ECHConfigList(outer string) ([]byte, error) {
	for i, name := range s.Names {
		if strings.EqualFold(name, outer) {
			cfg := s.echKeys[i].Config
			return append(binary.BigEndian.AppendUint16(nil, uint16(len(cfg))), cfg...), nil
		}
	}
	return nil, fmt.Errorf("ech config for %q: want one of the served names %v", outer, s.Names)
}

// marshalECHConfig encodes an ECHConfig (draft-ietf-tls-esni-22 §4):
// version 0xfe0d, DHKEM(X25519, HKDF-SHA256), HKDF-SHA256 and AES-128-GCM.
func marshalECHConfig(id uint8, pub []byte, publicName string) []byte {
	var c []byte
	c = append(c, id)
	c = binary.BigEndian.AppendUint16(c, 0x0020) // kem: DHKEM(X25519, HKDF-SHA256)
	c = binary.BigEndian.AppendUint16(c, uint16(len(pub)))
	c = append(c, pub...)
	c = binary.BigEndian.AppendUint16(c, 4)      // one cipher suite
	c = binary.BigEndian.AppendUint16(c, 0x0001) // kdf: HKDF-SHA256
	c = binary.BigEndian.AppendUint16(c, 0x0001) // aead: AES-128-GCM
	c = append(c, 0)                             // maximum_name_length
	c = append(c, uint8(len(publicName)))
	c = append(c, publicName...)
	c = binary.BigEndian.AppendUint16(c, 0) // no extensions
	out := binary.BigEndian.AppendUint16(nil, 0xfe0d)
	out = binary.BigEndian.AppendUint16(out, uint16(len(c)))
	return append(out, c...)
}
