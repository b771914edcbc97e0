package nsmgr

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// DefaultEtcNetnsDir is where iproute2 looks for a named netns's own /etc
// files: `ip netns exec NAME` bind-mounts every file of
// /etc/netns/NAME/ over its /etc counterpart in the mount namespace it runs
// the command in.
const DefaultEtcNetnsDir = "/etc/netns"

// resolvConfName is the one file the Manager writes per session.
const resolvConfName = "resolv.conf"

// resolvConfDir is the per-netns directory of a session.
func (m *Manager) resolvConfDir(session string) string {
	return filepath.Join(m.cfg.EtcNetnsDir, NetnsName(m.cfg.Prefix, session))
}

// ResolvConfPath returns the resolv.conf `ip netns exec` shows a session's
// processes: <EtcNetnsDir>/<prefix>-<session>/resolv.conf.
func (m *Manager) ResolvConfPath(session string) string {
	return filepath.Join(m.resolvConfDir(session), resolvConfName)
}

// resolvConf is the file's content: the anycast address, nothing else (no
// search domains: a search list would send bare names to the proxy under
// names the policy never named).
func resolvConf(dns, dns6 netip.Addr) []byte {
	s := "nameserver " + dns.String() + "\n"
	if dns6.IsValid() {
		s += "nameserver " + dns6.String() + "\n"
	}
	return []byte(s)
}

// writeResolvConf writes a session's resolv.conf (mode 0644), creating
// EtcNetnsDir (0755) and the session's directory as needed. The file is
// written beside its final name and renamed, so a reader never sees half
// of it.
func (m *Manager) writeResolvConf(session string) error {
	dir := m.resolvConfDir(session)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	path := filepath.Join(dir, resolvConfName)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, resolvConf(m.DNSAddr(), m.DNS6Addr()), 0o644); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("rename %s to %s: %w", tmp, path, err)
	}
	return nil
}

// removeResolvConf removes a session's resolv.conf and then its directory
// if that is left empty (an operator's own files there stay, and so does
// the directory holding them). Idempotent: what is gone is success.
func (m *Manager) removeResolvConf(session string) error {
	dir := m.resolvConfDir(session)
	path := filepath.Join(dir, resolvConfName)
	for _, p := range []string{path + ".tmp", path} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", p, err)
		}
	}
	err := unix.Rmdir(dir)
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
		return nil
	}
	return fmt.Errorf("remove %s: %w", dir, err)
}

// resolvConfSessions lists the sessions that have a directory under
// EtcNetnsDir: only names that parse as this prefix's netns names
// (parseNetnsName), so "<prefix>2-x" or an operator's "other" are never
// claimed. A missing EtcNetnsDir lists nothing.
func (m *Manager) resolvConfSessions() ([]string, error) {
	ents, err := os.ReadDir(m.cfg.EtcNetnsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", m.cfg.EtcNetnsDir, err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if session, ok := parseNetnsName(m.cfg.Prefix, e.Name()); ok {
			out = append(out, session)
		}
	}
	sort.Strings(out)
	return out, nil
}
