package nft

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/internal/nfnetlink"
)

// nameQueueLen is how many packets the kernel holds for the name check
// before it drops new ones: the checker holds a flow's first segments
// (a ClientHello of two or three) until its name is known.
const nameQueueLen = 4096

// OpenNameQueue binds the firewall's NFQUEUE (name_queue's) in its netns.
// Until it is bound, and after it is closed, the kernel drops what the
// table queues: a pending flow never passes unchecked. A queue takes one
// listener per netns: a second bind fails (EBUSY).
func (f *Firewall) OpenNameQueue() (*nfnetlink.NFQUEUE, error) {
	if f.nsFd < 0 {
		return nil, fmt.Errorf("open name queue: %w", ErrClosed)
	}
	nsFd, err := unix.FcntlInt(uintptr(f.nsFd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open name queue: duplicate netns handle: %w", err)
	}
	defer unix.Close(nsFd) // the socket keeps its netns
	q, err := nfnetlink.OpenNFQUEUE(nsFd, f.cfg.NameQueue, nameQueueLen)
	if err != nil {
		return nil, fmt.Errorf("open name queue: %w", err)
	}
	return q, nil
}
