package world

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"
)

// HelloPlan says how a TLS client's first write, its ClientHello record,
// goes on the wire. Every piece is its own TCP segment (Go's sockets set
// TCP_NODELAY, and the pieces are apart in time). The zero plan sends the
// hello in one write.
type HelloPlan struct {
	// SplitAt > 0: the first SplitAt bytes, a pause of Gap, then the rest.
	SplitAt int
	// SplitIn, when set, splits instead in the middle of the first
	// occurrence of this text in the hello (a server name, say).
	SplitIn string
	Gap     time.Duration
	// Trickle > 0: one byte per segment (Chunk bytes when set), this
	// pause between segments.
	Trickle time.Duration
	Chunk   int
	// Stop > 0: only the first Stop bytes are sent, then nothing more: a
	// hello never completed.
	Stop int
	// Rewrite changes the hello before it is sent (AddGreaseECH). The
	// client's transcript is of the hello it made, so a handshake over a
	// rewritten hello fails at its end; the server has read the hello.
	Rewrite func([]byte) ([]byte, error)
}

// planConn sends its first Write as its plan says; later writes pass.
type planConn struct {
	net.Conn
	plan HelloPlan
	once sync.Once
}

func (c *planConn) Write(b []byte) (int, error) {
	first := false
	c.once.Do(func() { first = true })
	if !first {
		return c.Conn.Write(b)
	}
	p := c.plan
	out := b
	if p.Rewrite != nil {
		var err error
		if out, err = p.Rewrite(append([]byte(nil), b...)); err != nil {
			return 0, err
		}
	}
	if p.Stop > 0 && p.Stop < len(out) {
		out = out[:p.Stop]
	}
	split := p.SplitAt
	if p.SplitIn != "" {
		i := bytes.Index(out, []byte(p.SplitIn))
		if i < 0 {
			return 0, fmt.Errorf("split hello: %q is not in it", p.SplitIn)
		}
		split = i + len(p.SplitIn)/2
	}
	var pieces [][]byte
	switch {
	case p.Trickle > 0:
		chunk := max(p.Chunk, 1)
		for i := 0; i < len(out); i += chunk {
			pieces = append(pieces, out[i:min(i+chunk, len(out))])
		}
	case split > 0 && split < len(out):
		pieces = [][]byte{out[:split], out[split:]}
	default:
		pieces = [][]byte{out}
	}
	pause := p.Trickle
	if pause == 0 {
		pause = p.Gap
	}
	for i, piece := range pieces {
		if i > 0 && pause > 0 {
			time.Sleep(pause)
		}
		if _, err := c.Conn.Write(piece); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

// TLSFetch connects from inside nsPath to dst, makes a TLS handshake with
// conf (its ClientHello sent as plan says), asks GET / with Host host over
// it and returns the answer's body. timeout bounds the whole exchange.
func TLSFetch(nsPath string, dst netip.AddrPort, conf *tls.Config, plan HelloPlan, host string, timeout time.Duration) (string, error) {
	c, err := dialAborting(nsPath, dst, timeout)
	if err != nil {
		return "", fmt.Errorf("tcp %s: %w", dst, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	tc := tls.Client(&planConn{Conn: c, plan: plan}, conf)
	if err := tc.Handshake(); err != nil {
		return "", fmt.Errorf("tls %s: handshake: %w", dst, err)
	}
	return httpExchange(tc, host)
}

// HTTPFetch asks GET / with Host host over plain HTTP/1.1 from inside
// nsPath to dst and returns the answer's body.
func HTTPFetch(nsPath string, dst netip.AddrPort, host string, timeout time.Duration) (string, error) {
	c, err := dialAborting(nsPath, dst, timeout)
	if err != nil {
		return "", fmt.Errorf("tcp %s: %w", dst, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	return httpExchange(c, host)
}

// dialAborting is DialTCP for a connection whose close aborts it (a
// reset, SO_LINGER 0): a refused or silenced connection's unacknowledged
// bytes would keep an orphaned socket retransmitting for minutes, and
// with it the session's netns (and its veth) alive after the session is
// removed.
func dialAborting(nsPath string, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	c, err := DialTCP(nsPath, dst, timeout)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	return c, nil
}

func httpExchange(c net.Conn, host string) (string, error) {
	req := "GET / HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: world\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		return "", fmt.Errorf("http %s: write: %w", c.RemoteAddr(), err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", fmt.Errorf("http %s: read: %w", c.RemoteAddr(), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return string(body), fmt.Errorf("http %s: read body: %w", c.RemoteAddr(), err)
	}
	return string(body), nil
}

// SSHLikeExchange connects from inside nsPath to an SSH-like server at dst,
// sends an SSH client's banner first (what the guest's first bytes are)
// and returns what came back: the server's banner and "ok " + the line.
func SSHLikeExchange(nsPath string, dst netip.AddrPort, timeout time.Duration) (string, error) {
	c, err := dialAborting(nsPath, dst, timeout)
	if err != nil {
		return "", fmt.Errorf("tcp %s: %w", dst, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	line := "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n"
	if _, err := io.WriteString(c, line); err != nil {
		return "", fmt.Errorf("ssh-like %s: write: %w", dst, err)
	}
	r := bufio.NewReader(c)
	var got strings.Builder
	for range 2 {
		l, err := r.ReadString('\n')
		got.WriteString(l)
		if err != nil {
			return got.String(), fmt.Errorf("ssh-like %s: read: %w", dst, err)
		}
	}
	return got.String(), nil
}

// QUICInitial sends from inside nsPath one datagram shaped as a QUIC v1
// client Initial (long header, padded to 1200 bytes, as RFC 9000 §14.1
// wants; its payload is random, not a sealed ClientHello) to dst and waits
// for anything back: nil when something came, else the socket's error
// (EHOSTUNREACH for an ICMP admin-prohibited, a timeout for silence).
func QUICInitial(nsPath string, dst netip.AddrPort, timeout time.Duration) error {
	c, err := dialIn(nsPath, "udp4", dst, timeout)
	if err != nil {
		return fmt.Errorf("udp %s: %w", dst, err)
	}
	defer c.Close()
	pkt := make([]byte, 1200)
	rand.Read(pkt)
	pkt[0] = 0xc3                                       // long header, Initial, 4-byte packet number
	binary.BigEndian.PutUint32(pkt[1:5], 1)             // version 1
	pkt[5] = 8                                          // destination connection id length
	pkt[14] = 8                                         // source connection id length
	pkt[23] = 0                                         // token length 0
	binary.BigEndian.PutUint16(pkt[24:26], 0x4000|1174) // length (2-byte varint)
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(pkt); err != nil {
		return fmt.Errorf("udp %s: write: %w", dst, err)
	}
	buf := make([]byte, 1500)
	if _, err := c.Read(buf); err != nil {
		return fmt.Errorf("udp %s: read: %w", dst, err)
	}
	return nil
}

// IsRefusal reports whether err is what a refused connection ends in: a
// reset, a refused connect, or an ICMP error (unreachable,
// admin-prohibited), rather than a timeout or a completed exchange.
func IsRefusal(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.EACCES) // ICMPv6 administratively prohibited
}

// AddGreaseECH returns the ClientHello record hello with a GREASE
// encrypted_client_hello extension appended (draft-ietf-tls-esni-22
// §6.2: an outer ECH of random bytes, as browsers send when they hold no
// ECH config), its lengths fixed up. The server_name stays as it was.
func AddGreaseECH(hello []byte) ([]byte, error) {
	const recHdr, hsHdr = 5, 4
	if len(hello) < recHdr+hsHdr+2+32+1 || hello[0] != 0x16 || hello[recHdr] != 0x01 {
		return nil, fmt.Errorf("grease ech: %d bytes are no ClientHello record", len(hello))
	}
	body := hello[recHdr+hsHdr:]
	off := 2 + 32 // legacy_version, random
	skip := func(lenBytes int) error {
		if off+lenBytes > len(body) {
			return errors.New("grease ech: hello truncated")
		}
		n := 0
		for i := 0; i < lenBytes; i++ {
			n = n<<8 | int(body[off+i])
		}
		off += lenBytes + n
		if off > len(body) {
			return errors.New("grease ech: hello truncated")
		}
		return nil
	}
	for _, l := range []int{1, 2, 1} { // session id, cipher suites, compression
		if err := skip(l); err != nil {
			return nil, err
		}
	}
	if off+2 > len(body) {
		return nil, errors.New("grease ech: hello has no extensions")
	}
	extLenAt := off
	var ext []byte
	ext = binary.BigEndian.AppendUint16(ext, 0xfe0d) // encrypted_client_hello
	payload := make([]byte, 32+176)                  // enc (an X25519 share) and a sealed inner hello's size
	rand.Read(payload)
	var data []byte
	data = append(data, 0)                             // outer
	data = binary.BigEndian.AppendUint16(data, 0x0001) // HKDF-SHA256
	data = binary.BigEndian.AppendUint16(data, 0x0001) // AES-128-GCM
	data = append(data, payload[0])                    // a random config id
	data = binary.BigEndian.AppendUint16(data, 32)
	data = append(data, payload[:32]...)
	data = binary.BigEndian.AppendUint16(data, uint16(len(payload)-32))
	data = append(data, payload[32:]...)
	ext = binary.BigEndian.AppendUint16(ext, uint16(len(data)))
	ext = append(ext, data...)

	out := append(append([]byte(nil), hello...), ext...)
	grow := len(ext)
	b := out[recHdr+hsHdr:]
	binary.BigEndian.PutUint16(b[extLenAt:], binary.BigEndian.Uint16(b[extLenAt:])+uint16(grow))
	hsLen := int(out[recHdr+1])<<16 | int(out[recHdr+2])<<8 | int(out[recHdr+3])
	hsLen += grow
	out[recHdr+1], out[recHdr+2], out[recHdr+3] = byte(hsLen>>16), byte(hsLen>>8), byte(hsLen)
	binary.BigEndian.PutUint16(out[3:5], binary.BigEndian.Uint16(out[3:5])+uint16(grow))
	return out, nil
}

// NoSNIConfig is a TLS client config that sends no server_name (Go's
// client leaves it out when ServerName is empty) and verifies the
// certificate it gets against roots for want itself.
func NoSNIConfig(roots *x509.CertPool, want string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // no ServerName to verify by; VerifyConnection does it
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: want})
			return err
		},
	}
}
