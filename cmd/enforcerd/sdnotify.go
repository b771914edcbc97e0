package main

import (
	"fmt"
	"net"
	"os"
)

// sdNotify sends state (e.g. "READY=1", "STOPPING=1", "STATUS=...") to the
// systemd notification socket named by $NOTIFY_SOCKET (Type=notify). It is
// a no-op when the variable is unset, as outside systemd.
func sdNotify(state string) error {
	return sdNotifyTo(os.Getenv("NOTIFY_SOCKET"), state)
}

// sdNotifyTo sends one datagram to addr, a path or an abstract socket
// written with a leading '@' (Go's net package maps '@' to the abstract
// namespace's leading NUL).
func sdNotifyTo(addr, state string) error {
	if addr == "" {
		return nil
	}
	if addr[0] != '/' && addr[0] != '@' {
		return fmt.Errorf("sd_notify: NOTIFY_SOCKET %q is neither a path nor an abstract socket", addr)
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sd_notify %s: %w", addr, err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("sd_notify %s: %w", addr, err)
	}
	return nil
}
