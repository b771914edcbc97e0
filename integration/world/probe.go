package world

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
)

// dialIn opens a connection from inside the namespace at nsPath. The socket
// is created (and connected) on a thread inside that namespace; it keeps that
// namespace for its whole life.
func dialIn(nsPath, network string, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := DoPath(nsPath, func() (err error) {
		c, err = net.DialTimeout(family(network, dst.Addr()), dst.String(), timeout)
		return err
	})
	return c, err
}

// DialTCP connects to dst from inside the namespace at nsPath.
func DialTCP(nsPath string, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	return dialIn(nsPath, "tcp4", dst, timeout)
}

// TCPEcho connects to a TCP echo server at dst from inside nsPath and checks
// the echo. nil means the destination was reached.
func TCPEcho(nsPath string, dst netip.AddrPort, timeout time.Duration) error {
	c, err := dialIn(nsPath, "tcp4", dst, timeout)
	if err != nil {
		return fmt.Errorf("tcp %s: %w", dst, err)
	}
	defer c.Close()
	return echo(c, "tcp", dst, timeout)
}

// UDPEcho sends a datagram to a UDP echo server at dst from inside nsPath and
// checks the echo.
func UDPEcho(nsPath string, dst netip.AddrPort, timeout time.Duration) error {
	c, err := dialIn(nsPath, "udp4", dst, timeout)
	if err != nil {
		return fmt.Errorf("udp %s: %w", dst, err)
	}
	defer c.Close()
	return echo(c, "udp", dst, timeout)
}

func echo(c net.Conn, proto string, dst netip.AddrPort, timeout time.Duration) error {
	msg := EchoMessage()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(msg); err != nil {
		return fmt.Errorf("%s %s: write: %w", proto, dst, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("%s %s: read echo: %w", proto, dst, err)
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("%s %s: echo mismatch", proto, dst)
	}
	return nil
}

// EchoMessage is a fresh 16-byte message for an echo that starts with a
// NUL byte, so a name check reads its first bytes as neither a TLS record
// (0x16) nor an HTTP request line and passes the flow at once (random
// bytes may start like either, 1 in a few hundred: the check then holds
// the flow waiting for the rest, and the echo times out).
func EchoMessage() []byte {
	msg := make([]byte, 16)
	rand.Read(msg[1:])
	return msg
}

// Ping sends one ICMP echo request to dst from inside nsPath over a raw
// socket and waits for the matching reply.
func Ping(nsPath string, dst netip.Addr, timeout time.Duration) error {
	var c *icmp.PacketConn
	err := DoPath(nsPath, func() (err error) {
		c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	})
	if err != nil {
		return fmt.Errorf("icmp socket: %w", err)
	}
	defer c.Close()
	id := os.Getpid() & 0xffff
	seq := int(time.Now().UnixNano() & 0x7fff)
	payload := make([]byte, 16)
	rand.Read(payload)
	req := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq, Data: payload}}
	b, err := req.Marshal(nil)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		return fmt.Errorf("ping %s: %w", dst, err)
	}
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for {
		c.SetReadDeadline(deadline)
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("ping %s: %w", dst, err)
		}
		ip, ok := from.(*net.IPAddr)
		if !ok || !ip.IP.Equal(dst.AsSlice()) {
			continue
		}
		m, err := icmp.ParseMessage(1, buf[:n])
		if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
			continue
		}
		if e, ok := m.Body.(*icmp.Echo); ok && e.Seq == seq && bytes.Equal(e.Data, payload) {
			return nil
		}
	}
}

// HTTPGet fetches url from inside nsPath and returns the body.
func HTTPGet(nsPath string, url string, timeout time.Duration) (string, error) {
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(addr)
			if err != nil {
				return nil, fmt.Errorf("world probes dial literal addresses only, got %q", addr)
			}
			return dialIn(nsPath, "tcp4", ap, timeout)
		},
	}
	client := &http.Client{Transport: tr, Timeout: timeout}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(body), nil
}

// Lookup sends one query for name/qtype to server from inside nsPath, over
// TCP when tcp is set.
func Lookup(nsPath string, server netip.AddrPort, name string, qtype uint16, tcp bool, timeout time.Duration) (*dns.Msg, error) {
	network := "udp4"
	if tcp {
		network = "tcp4"
	}
	c, err := dialIn(nsPath, network, server, timeout)
	if err != nil {
		return nil, fmt.Errorf("dns %s %s: %w", network, server, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	co := &dns.Conn{Conn: c}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	if err := co.WriteMsg(q); err != nil {
		return nil, fmt.Errorf("dns query %s to %s: %w", name, server, err)
	}
	resp, err := co.ReadMsg()
	if err != nil {
		return nil, fmt.Errorf("dns answer %s from %s: %w", name, server, err)
	}
	return resp, nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
