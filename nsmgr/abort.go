package nsmgr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TCPConn is one TCP connection as the socket at its Local end sees it.
type TCPConn struct {
	Local, Remote netip.AddrPort
}

func (c TCPConn) String() string { return c.Local.String() + " -> " + c.Remote.String() }

// sockDiagByFamily and sockDestroy are SOCK_DIAG_BY_FAMILY and
// SOCK_DESTROY (linux/sock_diag.h): the sock_diag requests that describe
// and abort the socket an inet_diag_req_v2 names.
const (
	sockDiagByFamily = 20
	sockDestroy      = 21
)

// tcpListen is TCP_LISTEN (include/net/tcp_states.h).
const tcpListen = 10

// inetDiagNoCookie is INET_DIAG_NOCOOKIE: match the socket by tuple alone.
const inetDiagNoCookie = ^uint32(0)

// AbortTCP aborts the TCP sockets of conns (IPv4 or IPv6) in the network namespace at
// netnsPath, as `ss -K` does, over sock_diag (SOCK_DESTROY: the kernel
// needs CONFIG_INET_DIAG_DESTROY and the caller CAP_NET_ADMIN in that
// netns's owner). An aborted socket fails at once: a blocked read, a
// write, a poll all see ECONNABORTED ("Software caused connection
// abort"), and the kernel sends the peer a reset. A connection no socket
// of the netns holds (it ended meanwhile, or the guest opened it from a
// netns of its own inside this one) is skipped, and a listening socket of
// its port is never touched. It returns how many sockets it aborted; an
// error names the first connection that failed.
func AbortTCP(netnsPath string, conns []TCPConn) (int, error) {
	if len(conns) == 0 {
		return 0, nil
	}
	f, err := os.Open(netnsPath)
	if err != nil {
		return 0, fmt.Errorf("abort TCP sockets: open netns %s: %w", netnsPath, err)
	}
	defer f.Close()
	c, err := netlink.Dial(unix.NETLINK_INET_DIAG, &netlink.Config{NetNS: int(f.Fd())})
	if err != nil {
		return 0, fmt.Errorf("abort TCP sockets: sock_diag socket in netns %s: %w", netnsPath, err)
	}
	defer c.Close()
	n := 0
	for _, conn := range conns {
		if l, r := conn.Local.Addr(), conn.Remote.Addr(); !(l.Is4() && r.Is4() || l.Is6() && !l.Is4In6() && r.Is6() && !r.Is4In6()) {
			continue // one family at both ends: an IPv4 or an IPv6 socket
		}
		// The kernel's lookup by tuple falls back to the socket listening on
		// the local port when no connection matches (the connection ended,
		// its conntrack entry outlives it): a destroy by tuple alone would
		// hit the guest's listener. So the socket is looked up first, taken
		// only when it is that connection's own, and destroyed by its
		// cookie, which no other socket has.
		cookie, found, err := connCookie(c, conn)
		if err == nil && !found {
			continue
		}
		if err == nil {
			req := inetDiagReq(conn)
			copy(req[48:56], cookie)
			_, err = c.Execute(netlink.Message{
				Header: netlink.Header{Type: sockDestroy, Flags: netlink.Request | netlink.Acknowledge},
				Data:   req,
			})
		}
		switch {
		case err == nil:
			n++
		case errors.Is(err, syscall.ENOENT):
		case errors.Is(err, syscall.EOPNOTSUPP):
			return n, fmt.Errorf("abort TCP socket %s in netns %s: the kernel cannot destroy sockets (CONFIG_INET_DIAG_DESTROY): %w", conn, netnsPath, err)
		default:
			return n, fmt.Errorf("abort TCP socket %s in netns %s: %w", conn, netnsPath, err)
		}
	}
	return n, nil
}

// connCookie looks up the socket of conn (SOCK_DIAG_BY_FAMILY, exact) and
// returns its cookie, or found false when the socket the kernel finds is
// not a connection of exactly that tuple (none, or the listener of the
// local port).
func connCookie(c *netlink.Conn, conn TCPConn) (cookie []byte, found bool, err error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Request},
		Data:   inetDiagReq(conn),
	})
	if errors.Is(err, syscall.ENOENT) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	want := inetDiagReq(conn)
	for _, m := range msgs {
		// struct inet_diag_msg: family, state, timer, retrans, then
		// inet_diag_sockid as in the request (ports, addresses, interface,
		// cookie).
		// The addresses are 16 bytes each; an IPv4 one fills the first 4.
		d := m.Data
		if len(d) < 52 || d[0] != want[0] || d[1] == tcpListen {
			continue
		}
		n := 4
		if want[0] == unix.AF_INET6 {
			n = 16
		}
		if string(d[4:8]) == string(want[8:12]) && string(d[8:8+n]) == string(want[12:12+n]) && string(d[24:24+n]) == string(want[28:28+n]) {
			return append([]byte(nil), d[44:52]...), true, nil
		}
	}
	return nil, false, nil
}

// inetDiagReq encodes struct inet_diag_req_v2 (linux/inet_diag.h) naming
// the TCP socket of conn, IPv4 or IPv6 (a dual-stack session's): family,
// protocol, ext, pad, states, then inet_diag_sockid (ports and addresses
// in network order, the interface and the cookie in host order).
func inetDiagReq(conn TCPConn) []byte {
	b := make([]byte, 56)
	b[0], b[1] = unix.AF_INET, unix.IPPROTO_TCP
	if conn.Local.Addr().Is6() {
		b[0] = unix.AF_INET6
	}
	binary.NativeEndian.PutUint32(b[4:], ^uint32(0)) // every state
	binary.BigEndian.PutUint16(b[8:], conn.Local.Port())
	binary.BigEndian.PutUint16(b[10:], conn.Remote.Port())
	copy(b[12:], conn.Local.Addr().AsSlice())
	copy(b[28:], conn.Remote.Addr().AsSlice())
	binary.NativeEndian.PutUint32(b[48:], inetDiagNoCookie)
	binary.NativeEndian.PutUint32(b[52:], inetDiagNoCookie)
	return b
}

// AbortTCP is the package's AbortTCP, for the daemon's Network.
func (m *Manager) AbortTCP(netnsPath string, conns []TCPConn) (int, error) {
	return AbortTCP(netnsPath, conns)
}
