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
	"os/user"
	"strconv"
	"syscall"

	"github.com/coreos/go-systemd/v22/activation"
	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/doctor"
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

// checkConfig refuses sockets that do not match the configuration, before
// any kernel change: a socket unit and a config that disagree would leave
// a setting silently ignored (a socket-group the unit's root-only socket
// never grants) or fail later (the sessions' resolver bound elsewhere).
// The error names both values.
func (s *inheritedSockets) checkConfig(cfg ServeConfig) error {
	if s.api != nil {
		if err := checkAPISocket(s.api.Addr().String(), cfg.Socket, cfg.SocketGroup); err != nil {
			return err
		}
	}
	want, err := doctor.DNSAddrOf(cfg.Pool)
	if err != nil {
		return err
	}
	if (s.dnsUDP == nil) != (s.dnsTCP == nil) {
		return fmt.Errorf("socket activation: pass both DNS sockets (UDP and TCP on %s) or neither", want)
	}
	for _, got := range []netip.AddrPort{s.dnsUDPAddr, s.dnsTCPAddr} {
		if s.dnsUDP != nil && got != want {
			return fmt.Errorf("socket activation: a DNS socket is bound to %s, but the pool %s resolves through %s; make enforcerd.socket listen on %s", got, cfg.Pool, want, want)
		}
	}
	return nil
}

// checkAPISocket compares the passed API socket (bound at path) with the
// configured socket and the group and mode serve would give it: 0600
// without a socket-group, 0660 and the group with one.
func checkAPISocket(path, wantPath, group string) error {
	if path != wantPath {
		return fmt.Errorf("socket activation: the API socket passed is %s, but the socket is configured at %s; make them the same", path, wantPath)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("socket activation: the API socket passed: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("socket activation: stat %s: no owner", path)
	}
	mode, wantMode := fi.Mode().Perm(), doctor.SocketModeFor(group)
	have := fmt.Sprintf("group %s, mode %04o", groupName(st.Gid), mode)
	if group == "" {
		if mode != wantMode {
			return fmt.Errorf("socket activation: the API socket %s has %s, but the config has no socket-group (root only: mode %04o); remove SocketGroup= and set SocketMode=%04o in enforcerd.socket, or set socket-group", path, have, wantMode, wantMode)
		}
		return nil
	}
	gid, err := api.LookupGroupID(group)
	if err != nil {
		return err
	}
	if st.Gid != gid || mode != wantMode {
		return fmt.Errorf("socket activation: the API socket %s has %s, but the config's socket-group is %q (want group %s, mode %04o); set SocketGroup=%s and SocketMode=%04o in enforcerd.socket", path, have, group, groupName(gid), wantMode, group, wantMode)
	}
	return nil
}

// groupName shows a gid as "name (gid N)", or "gid N" when it has no name.
func groupName(gid uint32) string {
	g, err := user.LookupGroupId(strconv.FormatUint(uint64(gid), 10))
	if err != nil {
		return fmt.Sprintf("gid %d", gid)
	}
	return fmt.Sprintf("%s (gid %d)", g.Name, gid)
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
