package nfnetlink

import (
	"fmt"
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Conn is a lazily dialed NETLINK_NETFILTER connection in the netns
// NetNS, replaced after any error; mu serialises its use. Once closed it
// dials nothing: NetNS belongs to the caller, which closes it, and the
// number may since name another file. The zero Conn is ready once NetNS is
// set.
type Conn struct {
	NetNS  int   // the netns's fd, dialed into; the caller owns it
	Closed error // what Do returns once Close was called

	mu   sync.Mutex
	shut bool
	conn *netlink.Conn
}

// Do runs fn on the connection; after an error the connection is replaced.
func (n *Conn) Do(fn func(c *netlink.Conn) error) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.shut {
		return n.Closed
	}
	if n.conn == nil {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: n.NetNS})
		if err != nil {
			return fmt.Errorf("open netfilter netlink socket: %w", err)
		}
		n.conn = c
	}
	if err := fn(n.conn); err != nil {
		n.conn.Close()
		n.conn = nil
		return err
	}
	return nil
}

// Close closes the connection for good: Do returns Closed after it.
func (n *Conn) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.shut = true
	if n.conn != nil {
		n.conn.Close()
		n.conn = nil
	}
}
