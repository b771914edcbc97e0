package dnsproxy

import (
	"net"
	"net/netip"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The proxy's hot writes (a query to its upstream, a reply to its client)
// go out as raw system calls on the non-blocking socket: sendto(2) and
// write(2) of a UDP datagram never block (a full buffer is EAGAIN, and
// then the write waits for the socket like any other), but they carry the
// datagram through the receiver's whole network stack, often for longer
// than the Go runtime's 20 µs system call grace. As ordinary system calls
// the runtime's monitor kept taking the goroutine's processor away in the
// middle and handing it to another thread (a thread wake-up per slow
// write), and kept itself polling every 20 µs; as raw calls the goroutine
// keeps its processor, as for any other work.

// rawSocket is a socket's descriptor access, or nil when the connection is
// not a system socket (a test's fake): then the net package writes.
func rawSocket(c any) syscall.RawConn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// rawWrite writes b on the connected socket rc.
func rawWrite(rc syscall.RawConn, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	var errno syscall.Errno
	err := rc.Write(func(fd uintptr) bool {
		for {
			_, _, errno = unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
			if errno != unix.EINTR {
				return errno != unix.EAGAIN
			}
		}
	})
	if err != nil {
		return err
	}
	if errno != 0 {
		return os.NewSyscallError("write", errno)
	}
	return nil
}

// rawSendTo sends b to addr from the UDP socket rc, of family v6 (AF_INET6)
// or not (AF_INET). It reports false, having sent nothing, for an address
// it does not handle (a zone, another family): the caller sends the usual
// way then.
func rawSendTo(rc syscall.RawConn, v6 bool, b []byte, addr netip.AddrPort) (bool, error) {
	var (
		sa4 unix.RawSockaddrInet4
		sa6 unix.RawSockaddrInet6
		sa  unsafe.Pointer
		n   uintptr
	)
	ip, port := addr.Addr(), addr.Port()
	switch {
	case ip.Zone() != "" || len(b) == 0:
		return false, nil
	case !v6 && ip.Is4():
		sa4.Family = unix.AF_INET
		sa4.Port = port<<8 | port>>8 // network byte order
		sa4.Addr = ip.As4()
		sa, n = unsafe.Pointer(&sa4), unsafe.Sizeof(sa4)
	case v6:
		sa6.Family = unix.AF_INET6
		sa6.Port = port<<8 | port>>8
		sa6.Addr = ip.As16() // an IPv4 client as its mapped address
		sa, n = unsafe.Pointer(&sa6), unsafe.Sizeof(sa6)
	default:
		return false, nil
	}
	var errno syscall.Errno
	err := rc.Write(func(fd uintptr) bool {
		for {
			_, _, errno = unix.RawSyscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0, uintptr(sa), n)
			if errno != unix.EINTR {
				return errno != unix.EAGAIN
			}
		}
	})
	if err != nil {
		return true, err
	}
	if errno != 0 {
		return true, os.NewSyscallError("sendto", errno)
	}
	return true, nil
}

// replySocket is a UDP listener the replies go out of: raw, with its
// family, when it is a system socket.
type replySocket struct {
	pc net.PacketConn
	rc syscall.RawConn // nil: pc.WriteTo
	v6 bool
}

// newReplySocket reads the socket's family from the kernel
// (getsockname): an IPv6 socket takes IPv6 (or IPv4-mapped) destinations.
func newReplySocket(pc net.PacketConn) *replySocket {
	rs := &replySocket{pc: pc}
	rc := rawSocket(pc)
	if rc == nil {
		return rs
	}
	var family int
	if err := rc.Control(func(fd uintptr) {
		switch sa, err := unix.Getsockname(int(fd)); sa.(type) {
		case *unix.SockaddrInet4:
			family = unix.AF_INET
		case *unix.SockaddrInet6:
			family = unix.AF_INET6
		default:
			_ = err // not an IP socket: the net package writes
		}
	}); err != nil || family == 0 {
		return rs
	}
	rs.rc, rs.v6 = rc, family == unix.AF_INET6
	return rs
}

// writeTo sends b to addr (as pc.WriteTo would; a raw send that failed is
// tried once more that way).
func (rs *replySocket) writeTo(b []byte, addr net.Addr) {
	if ua, ok := addr.(*net.UDPAddr); ok && rs.rc != nil {
		if sent, err := rawSendTo(rs.rc, rs.v6, b, ua.AddrPort()); sent && err == nil {
			return
		}
	}
	rs.pc.WriteTo(b, addr)
}
