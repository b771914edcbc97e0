package bugreport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"
)

// Packages are the Debian packages whose versions the report records:
// those the Makefile's PKGS installs (TestPackagesCoverMakefile holds the
// list to it) and the runtimes and tools the daemon and its tests use
// beside them.
var Packages = []string{
	"gcc", "libc6-dev", "pkg-config", "libseccomp-dev", "libseccomp2", "busybox-static",
	"iproute2", "util-linux", "nftables", "podman", "tar",
	"runc", "crun", "containernetworking-plugins", "systemd", "systemd-container",
	"debootstrap", "skopeo", "iptables", "golang-go", "containerd", "qemu-system-x86", "cpio",
	"curl", "openssl",
}

// Kernel is the kernel's uname (sysname, release, version, machine) and
// /proc/version.
func Kernel() ([]byte, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return nil, fmt.Errorf("uname: %w", err)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "uname: %s %s %s %s\n", unix.ByteSliceToString(u.Sysname[:]), unix.ByteSliceToString(u.Release[:]),
		unix.ByteSliceToString(u.Version[:]), unix.ByteSliceToString(u.Machine[:]))
	if pv, err := os.ReadFile("/proc/version"); err == nil {
		b.WriteString("/proc/version: " + string(pv))
	}
	return b.Bytes(), nil
}

// PackageVersions asks dpkg-query for the installed version of each
// package ("NAME VERSION STATUS", or "NAME not installed"). Without
// dpkg-query it returns an error saying so.
func PackageVersions(ctx context.Context, names []string) ([]byte, error) {
	bin, err := exec.LookPath("dpkg-query")
	if err != nil {
		return nil, errors.New("dpkg-query not found: not a Debian-based host, package versions not recorded")
	}
	var b bytes.Buffer
	for _, n := range names {
		out, err := exec.CommandContext(ctx, bin, "-W", "-f", "${Package} ${Version} ${db:Status-Abbrev}\n", n).Output()
		line := strings.TrimSpace(string(out))
		if err != nil || line == "" || strings.HasSuffix(line, " un") {
			fmt.Fprintf(&b, "%s not installed\n", n)
			continue
		}
		b.WriteString(line + "\n")
	}
	return b.Bytes(), nil
}

// JournalErrors returns the last n lines the journal holds at priority
// warning or worse (the daemon's WARN and ERROR) for the systemd unit. An error says why there are none to
// read (no journalctl, no such unit's entries).
func JournalErrors(ctx context.Context, unit string, n int) ([]byte, error) {
	bin, err := exec.LookPath("journalctl")
	if err != nil {
		return nil, errors.New("journalctl not found: the journal is not available on this host")
	}
	cmd := exec.CommandContext(ctx, bin, "--unit", unit, "--priority", "warning", "--lines", fmt.Sprint(n),
		"--no-pager", "--quiet", "--output", "short-iso")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("journalctl --unit %s: %v: %s", unit, err, strings.TrimSpace(stderr.String()))
	}
	if len(bytes.TrimSpace(out)) == 0 {
		return nil, fmt.Errorf("the journal holds no warning or error lines of unit %s (it never ran under systemd here, or logged no error)", unit)
	}
	return out, nil
}

// LogFileErrors returns the last n lines of a daemon log file (text or
// JSON, as serve --log-format writes) at level ERROR or WARN.
func LogFileErrors(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("daemon log: %w", err)
	}
	defer f.Close()
	var keep []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if isErrorLine(line) {
			keep = append(keep, line)
			if len(keep) > n {
				keep = keep[1:]
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("daemon log %s: %w", path, err)
	}
	if len(keep) == 0 {
		return nil, fmt.Errorf("daemon log %s holds no ERROR or WARN line", path)
	}
	return []byte(strings.Join(keep, "\n") + "\n"), nil
}

func isErrorLine(line string) bool {
	for _, l := range []string{"level=ERROR", "level=WARN", `"level":"ERROR"`, `"level":"WARN"`} {
		if strings.Contains(line, l) {
			return true
		}
	}
	return false
}
