package main

import (
	"fmt"
	"os"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
)

// sdNotify sends state (e.g. "READY=1", "STOPPING=1", "STATUS=...") to the
// systemd notification socket named by $NOTIFY_SOCKET (Type=notify), with
// go-systemd's SdNotify. It is a no-op when the variable is unset, as
// outside systemd. A NOTIFY_SOCKET that is neither a path nor an abstract
// socket (a leading '@', which Go maps to the abstract namespace's leading
// NUL) is refused, naming it: SdNotify would dial it relative to the
// working directory.
func sdNotify(state string) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	if addr[0] != '/' && addr[0] != '@' {
		return fmt.Errorf("sd_notify: NOTIFY_SOCKET %q is neither a path nor an abstract socket", addr)
	}
	if _, err := sddaemon.SdNotify(false, state); err != nil {
		return fmt.Errorf("sd_notify %s: %w", addr, err)
	}
	return nil
}
