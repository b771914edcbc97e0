package world

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/sys/unix"
)

// NeighborSolicitation6 returns a whole IPv6 packet (hop limit 255): an
// ICMPv6 neighbour solicitation from src to dst for target, checksummed.
func NeighborSolicitation6(src, dst, target netip.Addr) []byte {
	m := make([]byte, 24) // type, code, checksum, reserved, target
	m[0] = 135
	t := target.As16()
	copy(m[8:], t[:])
	s, d := src.As16(), dst.As16()
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, 0, 0, byte(len(m)), 0, 0, 0, unix.IPPROTO_ICMPV6)
	binary.BigEndian.PutUint16(m[2:], Checksum(append(pseudo, m...)))
	h := make([]byte, 40)
	h[0] = 6 << 4
	binary.BigEndian.PutUint16(h[4:], uint16(len(m)))
	h[6], h[7] = unix.IPPROTO_ICMPV6, 255
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return append(h, m...)
}

// SendRaw6 sends whole IPv6 packets (header included) from inside the
// namespace at nsPath, through a raw socket with IPV6_HDRINCL.
func SendRaw6(nsPath string, pkts ...[]byte) error {
	return DoPath(nsPath, func() error {
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw6 socket: %w", err)
		}
		defer unix.Close(fd)
		for _, p := range pkts {
			sa := &unix.SockaddrInet6{}
			copy(sa.Addr[:], p[24:40])
			if err := unix.Sendto(fd, p, 0, sa); err != nil {
				return fmt.Errorf("raw6 send: %w", err)
			}
		}
		return nil
	})
}

// WatchNS6 reports whether a neighbour solicitation for target reaches
// the namespace at nsPath within timeout, whatever its source. ready is
// called once the listener is open.
func WatchNS6(nsPath string, target netip.Addr, timeout time.Duration, ready func()) (bool, error) {
	var c *icmp.PacketConn
	err := DoPath(nsPath, func() (err error) {
		c, err = icmp.ListenPacket("ip6:ipv6-icmp", "::")
		return err
	})
	if err != nil {
		return false, fmt.Errorf("icmpv6 listener in %s: %w", nsPath, err)
	}
	defer c.Close()
	ready()
	t := target.As16()
	buf := make([]byte, 1500)
	deadline := time.Now().Add(timeout)
	for {
		c.SetReadDeadline(deadline)
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return false, nil // the deadline: nothing came
		}
		if n >= 24 && buf[0] == 135 && [16]byte(buf[8:24]) == t {
			return true, nil
		}
	}
}
