package main

// Socket activation (systemd's LISTEN_FDS protocol, scripts/enforcerd.socket):
// systemd binds the API socket and the anycast DNS sockets and keeps them
// across restarts of the service, so a query or a CLI call that arrives
// while the daemon restarts waits in the socket's queue and is answered by
// the next daemon instead of being refused.

import (
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"
)

// inheritedSockets are the sockets passed by the service manager, sorted
// by kind. Each is nil when not passed.
type inheritedSockets struct {
	api    net.Listener   // a unix stream socket
	dnsUDP net.PacketConn // a UDP socket
	dnsTCP net.Listener   // a TCP listening socket
	// dnsAddrs are where the DNS sockets are bound, checked against the
	// pool's anycast address once it is known.
	dnsUDPAddr, dnsTCPAddr netip.AddrPort
}

// takeInheritedSockets reads LISTEN_PID/LISTEN_FDS (and unsets them, so no
// sandbox inherits them) and sorts the sockets by type. Any other file, or
// two sockets of one kind, is refused: the daemon would serve on something
// the operator did not mean.
func takeInheritedSockets() (inheritedSockets, error) {
	var s inheritedSockets
	for _, f := range activation.Files(true) {
		if err := s.add(f); err != nil {
			s.close()
			return inheritedSockets{}, fmt.Errorf("socket activation: %s (fd %d): %w", f.Name(), f.Fd(), err)
		}
	}
	return s, nil
}

func (s *inheritedSockets) add(f *os.File) error {
	defer f.Close() // net.File* dup the descriptor
	fd := int(f.Fd())
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("not a socket: %w", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return fmt.Errorf("getsockname: %w", err)
	}
	switch a := sa.(type) {
	case *unix.SockaddrUnix:
		if typ != unix.SOCK_STREAM || s.api != nil {
			return fmt.Errorf("unexpected unix socket %s: want one stream socket for the API", a.Name)
		}
		s.api, err = net.FileListener(f)
		return err
	case *unix.SockaddrInet4:
		at := netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
		switch {
		case typ == unix.SOCK_DGRAM && s.dnsUDP == nil:
			s.dnsUDPAddr = at
			s.dnsUDP, err = net.FilePacketConn(f)
			return err
		case typ == unix.SOCK_STREAM && s.dnsTCP == nil:
			s.dnsTCPAddr = at
			s.dnsTCP, err = net.FileListener(f)
			return err
		}
		return fmt.Errorf("unexpected socket on %s: want one UDP and one TCP socket for DNS", at)
	}
	return fmt.Errorf("unexpected socket family: want the API's unix socket and DNS's IPv4 UDP and TCP sockets")
}

// checkDNS verifies that the DNS sockets were bound where the sessions'
// resolver is: the pool's anycast address, port 53. Both or neither must
// be given.
func (s *inheritedSockets) checkDNS(anycast netip.Addr) error {
	want := netip.AddrPortFrom(anycast, 53)
	if (s.dnsUDP == nil) != (s.dnsTCP == nil) {
		return fmt.Errorf("socket activation: pass both DNS sockets (UDP and TCP on %s) or neither", want)
	}
	for _, got := range []netip.AddrPort{s.dnsUDPAddr, s.dnsTCPAddr} {
		if s.dnsUDP != nil && got != want {
			return fmt.Errorf("socket activation: a DNS socket is bound to %s, but the pool's anycast address is %s; make enforcerd.socket listen on %s", got, want, want)
		}
	}
	return nil
}

func (s *inheritedSockets) close() {
	if s.api != nil {
		s.api.Close()
	}
	if s.dnsUDP != nil {
		s.dnsUDP.Close()
	}
	if s.dnsTCP != nil {
		s.dnsTCP.Close()
	}
}
