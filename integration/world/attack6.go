package world

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// IPv6 crafting for the v6 attack tests: whole packets with extension
// headers, sent as Ethernet frames from a namespace's interface (past the
// sender's own stack, as a guest with NET_RAW can), and raw listeners that
// see what a namespace's stack delivers.

// Ext6 is one IPv6 extension header: Proto is its own protocol number
// (0 hop-by-hop, 43 routing, 44 fragment, 60 destination options) and Hdr
// its bytes, the first (next header) filled in by Packet6.
type Ext6 struct {
	Proto uint8
	Hdr   []byte
}

// Packet6 returns a whole IPv6 packet: the header (hop limit hop), the
// extension headers in order, then an upper-layer protocol's bytes.
func Packet6(src, dst netip.Addr, hop uint8, exts []Ext6, proto uint8, l4 []byte) []byte {
	var body []byte
	for i, e := range exts {
		h := bytes.Clone(e.Hdr)
		h[0] = proto
		if i+1 < len(exts) {
			h[0] = exts[i+1].Proto
		}
		body = append(body, h...)
	}
	body = append(body, l4...)
	first := proto
	if len(exts) > 0 {
		first = exts[0].Proto
	}
	h := make([]byte, 40, 40+len(body))
	h[0] = 6 << 4
	binary.BigEndian.PutUint16(h[4:], uint16(len(body)))
	h[6], h[7] = first, hop
	s, d := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return append(h, body...)
}

// sum6 fills in the checksum at off of an upper-layer message m from src
// to dst (the final destination: a routing header's last segment).
func sum6(src, dst netip.Addr, proto uint8, m []byte, off int) []byte {
	s, d := src.As16(), dst.As16()
	var l [4]byte
	binary.BigEndian.PutUint32(l[:], uint32(len(m)))
	pseudo := append(append(append(append([]byte{}, s[:]...), d[:]...), l[:]...), 0, 0, 0, proto)
	binary.BigEndian.PutUint16(m[off:], 0)
	binary.BigEndian.PutUint16(m[off:], Checksum(append(pseudo, m...)))
	return m
}

// TCPSyn6 is a TCP SYN from src to dst carrying payload (a SYN may carry
// data; the payload is the marker a listener looks for), checksummed.
func TCPSyn6(src, dst netip.AddrPort, payload []byte) []byte {
	m := make([]byte, 20, 20+len(payload))
	binary.BigEndian.PutUint16(m[0:], src.Port())
	binary.BigEndian.PutUint16(m[2:], dst.Port())
	binary.BigEndian.PutUint32(m[4:], 0x6a7c0001)
	m[12] = 5 << 4
	m[13] = 0x02 // SYN
	binary.BigEndian.PutUint16(m[14:], 64240)
	m = append(m, payload...)
	return sum6(src.Addr(), dst.Addr(), unix.IPPROTO_TCP, m, 16)
}

// UDP6 is a UDP datagram from src to dst, checksummed.
func UDP6(src, dst netip.AddrPort, payload []byte) []byte {
	m := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(m[0:], src.Port())
	binary.BigEndian.PutUint16(m[2:], dst.Port())
	binary.BigEndian.PutUint16(m[4:], uint16(8+len(payload)))
	m = append(m, payload...)
	return sum6(src.Addr(), dst.Addr(), unix.IPPROTO_UDP, m, 6)
}

// ICMP6 is an ICMPv6 message of type typ and code from src to dst whose
// body follows the 4-byte type/code/checksum, checksummed.
func ICMP6(src, dst netip.Addr, typ, code uint8, body []byte) []byte {
	m := append([]byte{typ, code, 0, 0}, body...)
	return sum6(src, dst, unix.IPPROTO_ICMPV6, m, 2)
}

// Options6 is a hop-by-hop (proto 0) or destination options (60) header
// of one PadN option: 8 bytes.
func Options6(proto uint8) Ext6 {
	return Ext6{Proto: proto, Hdr: []byte{0, 0, 1, 4, 0, 0, 0, 0}}
}

// Routing6 is a routing header of type typ with segments left left:
// type 4 (segment routing, RFC 8754) lists segs last segment first as
// the RFC does; the other types list them in order after 4 reserved bytes.
func Routing6(typ, left uint8, segs ...netip.Addr) Ext6 {
	h := []byte{0, uint8(2 * len(segs)), typ, left, 0, 0, 0, 0}
	if typ == 4 {
		h[4] = uint8(len(segs) - 1) // last entry
	}
	for _, s := range segs {
		b := s.As16()
		h = append(h, b[:]...)
	}
	return Ext6{Proto: unix.IPPROTO_ROUTING, Hdr: h}
}

// Fragment6 is a fragment header: offset in 8-byte units, more fragments.
func Fragment6(offset uint16, more bool, id uint32) Ext6 {
	h := make([]byte, 8)
	fo := offset << 3
	if more {
		fo |= 1
	}
	binary.BigEndian.PutUint16(h[2:], fo)
	binary.BigEndian.PutUint32(h[4:], id)
	return Ext6{Proto: unix.IPPROTO_FRAGMENT, Hdr: h}
}

// MulticastMAC6 is the Ethernet address of an IPv6 multicast group.
func MulticastMAC6(group netip.Addr) net.HardwareAddr {
	b := group.As16()
	return net.HardwareAddr{0x33, 0x33, b[12], b[13], b[14], b[15]}
}

// SendFrames6 sends whole IPv6 packets as Ethernet frames to dstMAC from
// interface iface of the namespace at nsPath (a packet socket: the
// sender's own routing, neighbour discovery and fragmentation are not
// involved).
func SendFrames6(nsPath, iface string, dstMAC net.HardwareAddr, pkts ...[]byte) error {
	return DoPath(nsPath, func() error {
		ifi, err := net.InterfaceByName(iface)
		if err != nil {
			return fmt.Errorf("frames6: %w", err)
		}
		proto := htons(unix.ETH_P_IPV6)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(proto))
		if err != nil {
			return fmt.Errorf("frames6: packet socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index, Halen: 6}
		copy(to.Addr[:], dstMAC)
		for _, p := range pkts {
			if err := unix.Sendto(fd, p, 0, to); err != nil {
				return fmt.Errorf("frames6: send on %s: %w", iface, err)
			}
		}
		return nil
	})
}

// Sniff6 is a raw IPv6 socket of one upper-layer protocol inside a
// namespace: it sees every such packet the namespace's stack delivers
// locally (after reassembly and extension headers), from its opening on.
type Sniff6 struct{ fd int }

// OpenSniff6 opens a Sniff6 for proto (unix.IPPROTO_TCP, _UDP, _ICMPV6)
// inside the namespace at nsPath.
func OpenSniff6(nsPath string, proto int) (*Sniff6, error) {
	fd := -1
	err := DoPath(nsPath, func() (err error) {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("raw6 listener (proto %d) in %s: %w", proto, nsPath, err)
	}
	return &Sniff6{fd: fd}, nil
}

// Saw reports whether a delivered packet containing marker arrives within
// timeout (packets queued since the opening count).
func (s *Sniff6) Saw(marker []byte, timeout time.Duration) bool {
	_, ok := s.Find(marker, timeout)
	return ok
}

// Find returns the first delivered packet containing marker (from its
// upper-layer header on: an ICMPv6 message from its type) that arrives
// within timeout.
func (s *Sniff6) Find(marker []byte, timeout time.Duration) ([]byte, bool) {
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 65535)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, false
		}
		tv := unix.NsecToTimeval(max(min(left, 100*time.Millisecond), time.Millisecond).Nanoseconds())
		unix.SetsockoptTimeval(s.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, _, err := unix.Recvfrom(s.fd, buf, 0)
		if err != nil {
			continue // EAGAIN at each slice of the deadline
		}
		if bytes.Contains(buf[:n], marker) {
			return bytes.Clone(buf[:n]), true
		}
	}
}

// Close closes the socket.
func (s *Sniff6) Close() error { return unix.Close(s.fd) }
