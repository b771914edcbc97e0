package namecheck

import (
	"crypto/tls"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"
)

// clientHello is the first flight crypto/tls sends for serverName ("":
// none), read off a pipe: a real hello, with the default post-quantum key
// share (over one MSS).
func clientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	go func() {
		tc := tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""})
		_ = tc.Handshake()
	}()
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

// tcpPacket is an IPv4 TCP packet from guest:40000 to dst:port.
func tcpPacket(guest, dst netip.Addr, port uint16, seq uint32, flags byte, payload []byte) []byte {
	p := make([]byte, 40+len(payload))
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	p[8], p[9] = 64, 6
	g, d := guest.As4(), dst.As4()
	copy(p[12:], g[:])
	copy(p[16:], d[:])
	t := p[20:]
	binary.BigEndian.PutUint16(t[0:], 40000)
	binary.BigEndian.PutUint16(t[2:], port)
	binary.BigEndian.PutUint32(t[4:], seq)
	t[12] = 5 << 4
	t[13] = flags
	copy(t[20:], payload)
	return p
}
