package world

import (
	"context"
	"errors"
	"net"
	"os"
	"time"
)

// How long a probe waits. A probe that must reach gets ReachTimeout; one
// that must be blocked waits BlockTimeout for nothing to come back (a
// silent drop ends in a timeout, never in a quicker error). The live
// tests, the end-to-end tests and the demo share these values.
const (
	ReachTimeout = 3 * time.Second
	BlockTimeout = 800 * time.Millisecond
)

// IsTimeout reports whether err is a timeout (a deadline passed, of a
// socket or of a context): what a silently dropped packet ends in.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
}
