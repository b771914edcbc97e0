package main

// The container's resolver, for runtimes that build the container's
// resolv.conf from the host's. Podman (4.3 and later; containers/common's
// resolvconf package) writes the CNI result's nameservers first and then
// appends the host's /etc/resolv.conf nameservers and search domains,
// unless the user gave --dns or containers.conf's dns_servers. The
// sandbox can reach only the daemon's DNS anycast address, so every query
// that falls back to the host's resolver times out, and the host's search
// domains leak in (PITFALLS 8). No field of the CNI result turns that off.
//
// What both podman and iproute2 read instead of the host's file is the
// netns's own: for a netns named NAME under /run/netns ("ip netns"
// naming; podman mounts its netns there), /etc/netns/NAME/resolv.conf
// (iproute2's `ip netns exec` bind-mounts it over /etc/resolv.conf; podman
// reads it in place of the host's). ADD writes that file naming only the
// session's DNS address, with no search domain; DEL and GC remove it. The
// file's first line names the session it belongs to: the plugin removes
// only files that say they are its own, and never writes over a file that
// is not (an operator's own file for that netns wins).

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// etcNetns is where iproute2 keeps per-netns configuration.
const etcNetns = "/etc/netns"

// netnsRunDirs are the directories whose netns files carry an "ip netns"
// name (the file's base name).
var netnsRunDirs = []string{"/run/netns", "/var/run/netns"}

// resolvConfMarker starts the first line of every file the plugin writes;
// the session's name follows it.
const resolvConfMarker = "# enforcerd-cni session "

// netnsName is the "ip netns" name of the netns at path, or "" when the
// path is not in a directory of named netns.
func netnsName(path string) string {
	dir, base := filepath.Split(filepath.Clean(path))
	for _, d := range netnsRunDirs {
		if filepath.Clean(dir) == d && base != "" && base != "." && base != ".." {
			return base
		}
	}
	return ""
}

// resolvConfText is the netns's resolv.conf for a session: its one
// nameserver and no search domain.
func resolvConfText(session, dns string) string {
	return resolvConfMarker + session + ": the only resolver this netns can reach\n" +
		"nameserver " + dns + "\n"
}

// ownerOf reads the session named on the marker line of the file at path;
// "" when the file is not the plugin's.
func ownerOf(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return "", sc.Err()
	}
	rest, ok := strings.CutPrefix(sc.Text(), resolvConfMarker)
	if !ok {
		return "", nil
	}
	session, _, _ := strings.Cut(rest, ":")
	return session, nil
}

// writeNetnsResolvConf writes root/NAME/resolv.conf for the netns at
// netnsPath, naming dns as its only nameserver. A netns without an "ip
// netns" name has no such file (nothing is written); a file that is not
// the plugin's is left alone. The write is atomic (a temporary file
// renamed over), so a runtime never reads half of it.
func writeNetnsResolvConf(root, netnsPath, session, dns string) error {
	name := netnsName(netnsPath)
	if name == "" || dns == "" {
		return nil
	}
	dir := filepath.Join(root, name)
	path := filepath.Join(dir, "resolv.conf")
	owner, err := ownerOf(path)
	switch {
	case err == nil && owner == "":
		return nil // (an operator's own file)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("resolv.conf of netns %s: %w", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("resolv.conf of netns %s: %w", name, err)
	}
	tmp, err := os.CreateTemp(dir, ".resolv.conf.enforcerd-")
	if err != nil {
		return fmt.Errorf("resolv.conf of netns %s: %w", name, err)
	}
	_, err = tmp.WriteString(resolvConfText(session, dns))
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("resolv.conf of netns %s: %w", name, err)
	}
	return nil
}

// removeNetnsResolvConf removes root/NAME/resolv.conf of the netns at
// netnsPath when the file is session's, and then its directory when that
// is empty. Gone already is success; so is a file of another owner (left
// alone).
func removeNetnsResolvConf(root, netnsPath, session string) error {
	name := netnsName(netnsPath)
	if name == "" {
		return nil
	}
	dir := filepath.Join(root, name)
	path := filepath.Join(dir, "resolv.conf")
	owner, err := ownerOf(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("resolv.conf of netns %s: %w", name, err)
	case owner != session:
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove resolv.conf of netns %s: %w", name, err)
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) && !isNotEmpty(err) {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// isNotEmpty is rmdir's answer for a directory that holds other files
// (the operator's hosts or nsswitch.conf for that netns).
func isNotEmpty(err error) bool {
	return errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST)
}
