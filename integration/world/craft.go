package world

// Raw packet crafting for the attack tests: hand-built IPv4 datagrams (UDP,
// ICMP echo, ICMP destination unreachable quoting an inner IPv4/UDP header)
// sent through a SOCK_RAW/IPPROTO_RAW socket (IP_HDRINCL: the header goes
// out as written, spoofed source included) opened inside a namespace, ARP
// requests over AF_PACKET, and a raw ICMP listener that looks for a marker.
// Every socket is created on a thread inside the namespace it must live in.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/sys/unix"
)

// IP protocol numbers used here.
const (
	ProtoICMP = 1
	ProtoTCP  = 6
	ProtoUDP  = 17
)

// Checksum is the Internet checksum (RFC 1071) of b.
func Checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// IPv4Header returns a 20-byte IPv4 header (no options, DF clear, TTL 64)
// for a payload of payloadLen bytes, with its checksum.
func IPv4Header(src, dst netip.Addr, proto uint8, payloadLen int, id uint16) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+payloadLen))
	binary.BigEndian.PutUint16(h[4:], id)
	h[8] = 64
	h[9] = proto
	s, d := src.As4(), dst.As4()
	copy(h[12:16], s[:])
	copy(h[16:20], d[:])
	binary.BigEndian.PutUint16(h[10:], Checksum(h))
	return h
}

// UDPHeader returns an 8-byte UDP header for payload from src to dst, with
// the checksum over the pseudo-header (or without, when noSum is set: 0
// means "no checksum" in IPv4).
func UDPHeader(src, dst netip.AddrPort, payload []byte, noSum bool) []byte {
	u := make([]byte, 8)
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	if noSum {
		return u
	}
	s, d := src.Addr().As4(), dst.Addr().As4()
	ph := make([]byte, 0, 12+8+len(payload))
	ph = append(ph, s[:]...)
	ph = append(ph, d[:]...)
	ph = append(ph, 0, ProtoUDP, byte((8+len(payload))>>8), byte(8+len(payload)))
	ph = append(ph, u...)
	ph = append(ph, payload...)
	sum := Checksum(ph)
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], sum)
	return u
}

// UDPPacket returns a whole IPv4/UDP datagram from src to dst.
func UDPPacket(src, dst netip.AddrPort, payload []byte) []byte {
	u := append(UDPHeader(src, dst, payload, false), payload...)
	return append(IPv4Header(src.Addr(), dst.Addr(), ProtoUDP, len(u), 0x4d4b), u...)
}

// ICMPEchoPacket returns a whole IPv4/ICMP echo request from src to dst.
func ICMPEchoPacket(src, dst netip.Addr, id, seq uint16, payload []byte) []byte {
	m := make([]byte, 8, 8+len(payload))
	m[0] = 8 // echo request
	binary.BigEndian.PutUint16(m[4:], id)
	binary.BigEndian.PutUint16(m[6:], seq)
	m = append(m, payload...)
	binary.BigEndian.PutUint16(m[2:], Checksum(m))
	return append(IPv4Header(src, dst, ProtoICMP, len(m), 0x4d4c), m...)
}

// ICMPPortUnreachable returns a whole IPv4/ICMP destination unreachable,
// port unreachable (type 3 code 3) from src to dst, quoting a UDP datagram
// innerSrc -> innerDst: its IPv4 header, its UDP header, then marker as
// the quoted payload (an error may quote more than 8 bytes; the marker lets
// a listener recognise the packet).
func ICMPPortUnreachable(src, dst netip.Addr, innerSrc, innerDst netip.AddrPort, marker []byte) []byte {
	return ICMPUnreachable(3, src, dst, innerSrc, innerDst, marker)
}

// ICMPUnreachable is ICMPPortUnreachable with any destination unreachable
// code.
func ICMPUnreachable(code uint8, src, dst netip.Addr, innerSrc, innerDst netip.AddrPort, marker []byte) []byte {
	udp := UDPHeader(innerSrc, innerDst, marker, true)
	// The quoted header claims the datagram's full length, as a real
	// router's error would.
	inner := IPv4Header(innerSrc.Addr(), innerDst.Addr(), ProtoUDP, len(udp)+len(marker), 0x4d4d)
	inner = append(inner, udp...)
	inner = append(inner, marker...)
	m := make([]byte, 8, 8+len(inner))
	m[0], m[1] = 3, code
	m = append(m, inner...)
	binary.BigEndian.PutUint16(m[2:], Checksum(m))
	return append(IPv4Header(src, dst, ProtoICMP, len(m), 0x4d4e), m...)
}

// RawSocket is an IPPROTO_RAW socket (IP_HDRINCL) created inside a netns.
type RawSocket struct{ fd int }

// OpenRaw opens a raw IPv4 send socket inside the namespace at nsPath.
func OpenRaw(nsPath string) (*RawSocket, error) {
	fd := -1
	err := DoPath(nsPath, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_HDRINCL, 1); err != nil {
			unix.Close(fd)
			return fmt.Errorf("IP_HDRINCL: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &RawSocket{fd: fd}, nil
}

// Send sends one whole IPv4 packet (header included) to its destination.
func (r *RawSocket) Send(pkt []byte) error {
	if len(pkt) < 20 {
		return errors.New("raw send: packet shorter than an IPv4 header")
	}
	sa := &unix.SockaddrInet4{}
	copy(sa.Addr[:], pkt[16:20])
	if err := unix.Sendto(r.fd, pkt, 0, sa); err != nil {
		return fmt.Errorf("raw send to %v: %w", net.IP(pkt[16:20]), err)
	}
	return nil
}

// Close closes the socket.
func (r *RawSocket) Close() error { return unix.Close(r.fd) }

// SendRaw sends whole IPv4 packets from inside the namespace at nsPath.
func SendRaw(nsPath string, pkts ...[]byte) error {
	r, err := OpenRaw(nsPath)
	if err != nil {
		return err
	}
	defer r.Close()
	for _, p := range pkts {
		if err := r.Send(p); err != nil {
			return err
		}
	}
	return nil
}

// ICMPWatch is a raw ICMP socket inside a namespace: it sees every ICMP
// packet delivered to any local address of that namespace.
type ICMPWatch struct{ c *icmp.PacketConn }

// WatchICMP opens an ip4:icmp listener inside the namespace at nsPath.
// Packets are queued in the socket from now on; Wait reads them.
func WatchICMP(nsPath string) (*ICMPWatch, error) {
	var c *icmp.PacketConn
	err := DoPath(nsPath, func() (err error) {
		c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("icmp listener in %s: %w", nsPath, err)
	}
	return &ICMPWatch{c: c}, nil
}

// Wait reads ICMP packets until one contains marker (returning its
// source) or timeout passes (ok false).
func (w *ICMPWatch) Wait(marker []byte, timeout time.Duration) (from netip.Addr, ok bool) {
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 65535)
	for {
		w.c.SetReadDeadline(deadline)
		n, src, err := w.c.ReadFrom(buf)
		if err != nil {
			return netip.Addr{}, false
		}
		if bytes.Contains(buf[:n], marker) {
			a, _ := netip.AddrFromSlice(src.(*net.IPAddr).IP.To4())
			return a, true
		}
	}
}

// Close closes the listener.
func (w *ICMPWatch) Close() error { return w.c.Close() }

// ARPReply is the answer to an ARP request.
type ARPReply struct {
	IP  netip.Addr
	MAC net.HardwareAddr
}

// ARPProbe sends, inside the namespace at nsPath, an ARP who-has for each
// target on iface (sender address sender, the interface's own MAC) and
// collects the replies that arrive within timeout, keyed by the address
// they answer for.
func ARPProbe(nsPath, iface string, sender netip.Addr, targets []netip.Addr, timeout time.Duration) (map[netip.Addr]net.HardwareAddr, error) {
	got := map[netip.Addr]net.HardwareAddr{}
	err := DoPath(nsPath, func() error {
		ifi, err := net.InterfaceByName(iface)
		if err != nil {
			return fmt.Errorf("arp: %w", err)
		}
		proto := htons(unix.ETH_P_ARP)
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto))
		if err != nil {
			return fmt.Errorf("arp: packet socket: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
			return fmt.Errorf("arp: bind %s: %w", iface, err)
		}
		bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		to := &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index, Halen: 6}
		copy(to.Addr[:], bcast)
		for _, tgt := range targets {
			if err := unix.Sendto(fd, arpFrame(ifi.HardwareAddr, sender, tgt), 0, to); err != nil {
				return fmt.Errorf("arp: send who-has %s: %w", tgt, err)
			}
		}
		want := map[netip.Addr]bool{}
		for _, t := range targets {
			want[t] = true
		}
		deadline := time.Now().Add(timeout)
		buf := make([]byte, 1514)
		for {
			left := time.Until(deadline)
			if left <= 0 {
				return nil
			}
			tv := unix.NsecToTimeval(min(left, 100*time.Millisecond).Nanoseconds())
			if tv.Sec == 0 && tv.Usec == 0 {
				tv.Usec = 1
			}
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
				return fmt.Errorf("arp: SO_RCVTIMEO: %w", err)
			}
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return fmt.Errorf("arp: read: %w", err)
			}
			ip, mac, ok := parseARPReply(buf[:n], sender)
			if ok && want[ip] {
				got[ip] = mac
			}
		}
	})
	return got, err
}

// arpFrame is an Ethernet broadcast ARP request for target from (mac, ip).
func arpFrame(mac net.HardwareAddr, ip, target netip.Addr) []byte {
	f := make([]byte, 42)
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], mac)
	binary.BigEndian.PutUint16(f[12:], unix.ETH_P_ARP)
	a := f[14:]
	binary.BigEndian.PutUint16(a[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(a[2:], 0x0800) // IPv4
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 1) // request
	copy(a[8:14], mac)
	s, t := ip.As4(), target.As4()
	copy(a[14:18], s[:])
	// a[18:24], the target MAC, stays zero
	copy(a[24:28], t[:])
	return f
}

// parseARPReply reads an Ethernet ARP reply addressed to ip.
func parseARPReply(f []byte, ip netip.Addr) (netip.Addr, net.HardwareAddr, bool) {
	if len(f) < 42 || binary.BigEndian.Uint16(f[12:]) != unix.ETH_P_ARP {
		return netip.Addr{}, nil, false
	}
	a := f[14:]
	if binary.BigEndian.Uint16(a[6:]) != 2 || a[4] != 6 || a[5] != 4 {
		return netip.Addr{}, nil, false
	}
	if tpa, _ := netip.AddrFromSlice(a[24:28]); tpa != ip {
		return netip.Addr{}, nil, false
	}
	spa, _ := netip.AddrFromSlice(a[14:18])
	return spa, net.HardwareAddr(bytes.Clone(a[8:14])), true
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
