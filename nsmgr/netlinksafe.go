package nsmgr

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// dumpAttempts bounds the retries of a netlink dump interrupted by a
// concurrent change (the kernel flags such a dump NLM_F_DUMP_INTR and the
// library returns netlink.ErrDumpInterrupted with partial results).
const dumpAttempts = 10

// retryDump runs a netlink dump until it completes uninterrupted.
func retryDump[T any](what string, dump func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for i := 0; i < dumpAttempts; i++ {
		v, err = dump()
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		var zero T
		return zero, fmt.Errorf("list %s: %w", what, err)
	}
	return v, nil
}

// HandleIn is handleIn for the packages that probe the kernel beside the
// daemon (the doctor): the one safe way to a rtnetlink socket in another
// netns, where netlink.NewHandleAt is refused.
func HandleIn(ns netns.NsHandle) (*netlink.Handle, error) { return handleIn(ns) }

// handleIn returns a rtnetlink handle whose socket lives in ns. The socket
// is created inside Do; netlink.NewHandleAt would do the same switch, but
// unlocks its thread even when switching back failed.
func handleIn(ns netns.NsHandle) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := Do(ns, func() error {
		var err error
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open netlink handle: %w", err)
	}
	return h, nil
}

// isNotFound reports whether err says a link does not exist.
func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// deleteLinkByName deletes a link by name; "already gone" is success.
// It reports whether it deleted something.
func deleteLinkByName(h *netlink.Handle, name string) (bool, error) {
	link, err := h.LinkByName(name)
	if isNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("find link %s: %w", name, err)
	}
	if err := h.LinkDel(link); err != nil {
		if isNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("delete link %s: %w", name, err)
	}
	return true, nil
}
