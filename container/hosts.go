package container

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// SetHosts rewrites a running sandbox's /etc/hosts with the pinned entries (hostsFile's
// layout, the hostname the sandbox was created with), for a policy update that changes the
// pinned names. A sandbox with no layer etc dir is ErrNotFound.
//
// The file is rewritten in place (writeInPlace), not replaced by a rename: the sandbox sees
// the host file through a bind mount of that file, which holds the inode it was made with; a
// renamed-over file would be a new inode the sandbox never sees.
func (m *Manager) SetHosts(name string, pinned map[string][]netip.Addr) error {
	if !validName(name, maxNameLen, true) {
		return fmt.Errorf("sandbox name %q: %w", name, ErrNotFound)
	}
	if err := validatePinned(pinned); err != nil {
		return err
	}
	unlock := m.names.lock(name)
	defer unlock()
	l := m.layout(name)
	hn, err := os.ReadFile(filepath.Join(l.etc, "hostname"))
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sandbox %s: no %s: %w", name, filepath.Join(l.etc, "hostname"), ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: read its hostname: %w", name, err)
	}
	hostname := strings.TrimSpace(string(hn))
	if !validHostname(hostname) {
		return fmt.Errorf("sandbox %s: hostname file holds %q, not a hostname", name, hostname)
	}
	p := filepath.Join(l.etc, "hosts")
	if err := writeInPlace(p, []byte(hostsFile(hostname, pinned))); err != nil {
		return fmt.Errorf("sandbox %s: rewrite %s: %w", name, p, err)
	}
	return nil
}

// writeInPlace replaces the content of the existing file at path, keeping its inode. It never
// leaves the file empty or ending in the old content's lines: the new content is written over
// the old from offset 0, padded with a comment to at least the old length (so none of the old
// bytes survive past it), and then the file is cut to the new content's length. A reader racing
// the rewrite (a resolver reading /etc/hosts) sees the old file, the new one, the new one with
// its padding, or, during the one copy of at most a few pages, bytes of both; the next read
// sees the new file whole. Nothing the sandbox may reach depends on this file: the kernel's
// sets decide that, and they change before the file does.
func writeInPlace(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	buf := data
	if old := int(st.Size()); old > len(data) {
		pad := make([]byte, old-len(data))
		for i := range pad {
			pad[i] = ' '
		}
		pad[0], pad[len(pad)-1] = '#', '\n'
		buf = append(append([]byte{}, data...), pad...)
	}
	if _, err := f.WriteAt(buf, 0); err != nil {
		return err
	}
	if err := f.Truncate(int64(len(data))); err != nil {
		return err
	}
	return f.Close()
}
