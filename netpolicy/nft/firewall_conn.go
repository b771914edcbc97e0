package nft

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// sockBufBytes is the forced receive and send buffer of every nftables
// socket. Flush reads one ack per message; with the default buffer a batch of
// a few hundred messages overflows it (ENOBUFS although the batch
// committed), and large dumps need room too.
const sockBufBytes = 8 << 20

// connSlot is a lasting nftables connection used by one kind of caller.
// mu serialises whole operations (queue messages, Flush, or a dump): the
// google/nftables Conn buffers messages per connection, so two goroutines
// interleaving would mix their batches. After any error the connection is
// discarded and the next operation dials a fresh one, because a failed
// batch's error can replay on the next Flush of the same socket.
type connSlot struct {
	mu   sync.Mutex
	nsFd int
	shut bool // closed: nsFd is no longer ours (see nfnetlink.Conn)
	conn *nftables.Conn
}

// ErrClosed is returned by a Firewall's methods after its Close.
var ErrClosed = errors.New("firewall is closed")

func (s *connSlot) dialLocked() (*nftables.Conn, error) {
	if s.shut {
		return nil, ErrClosed
	}
	if s.conn != nil {
		return s.conn, nil
	}
	c, err := nftables.New(
		nftables.AsLasting(),
		nftables.WithNetNSFd(s.nsFd),
		nftables.WithSockOptions(forceBuffers),
	)
	if err != nil {
		return nil, fmt.Errorf("open nftables netlink socket: %w", err)
	}
	s.conn = c
	return c, nil
}

// do runs fn on the slot's connection with the slot locked and discards the
// connection if fn fails.
func (s *connSlot) do(fn func(c *nftables.Conn) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.dialLocked()
	if err != nil {
		return err
	}
	if err := fn(c); err != nil {
		s.discardLocked()
		return err
	}
	return nil
}

func (s *connSlot) discardLocked() {
	if s.conn != nil {
		_ = s.conn.CloseLasting()
		s.conn = nil
	}
}

func (s *connSlot) close() {
	s.mu.Lock()
	s.shut = true
	s.discardLocked()
	s.mu.Unlock()
}

// forceBuffers raises the socket buffers past net.core.{r,w}mem_max (needs
// CAP_NET_ADMIN, which every caller of this package has).
func forceBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("netlink raw conn: %w", err)
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sockBufBytes); e != nil {
			serr = fmt.Errorf("set SO_RCVBUFFORCE: %w", e)
			return
		}
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, sockBufBytes); e != nil {
			serr = fmt.Errorf("set SO_SNDBUFFORCE: %w", e)
		}
	})
	if err != nil {
		return fmt.Errorf("netlink socket control: %w", err)
	}
	return serr
}

// isNotFound reports whether a netlink error means "no such table, chain,
// set or element".
func isNotFound(err error) bool {
	return errors.Is(err, syscall.ENOENT)
}
