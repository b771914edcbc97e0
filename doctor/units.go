package doctor

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// The unit check reads the installed enforcerd.socket as systemd would
// (the unit file of the first directory that has it, then its drop-ins)
// and compares what it binds with the configuration serve runs with: a
// socket unit and a config that disagree make serve refuse to start (see
// cmd/enforcerd/activation.go), so doctor says so first, naming both
// values.

// SocketUnitName is the socket unit scripts/install.sh installs.
const SocketUnitName = "enforcerd.socket"

// DefaultUnitDirs are systemd's system unit directories, highest
// precedence first: the administrator's (/etc), the runtime's, then the
// vendor directories (scripts/install.sh installs into /usr/local/lib).
var DefaultUnitDirs = []string{
	"/etc/systemd/system",
	"/run/systemd/system",
	"/usr/local/lib/systemd/system",
	"/usr/lib/systemd/system",
	"/lib/systemd/system",
}

// systemdSocketMode is SocketMode='s default.
const systemdSocketMode fs.FileMode = 0o666

// SocketModeFor is the mode of the API socket for a socket group: 0600
// (root only) without one, 0660 with one (api.Listen makes the same).
func SocketModeFor(group string) fs.FileMode {
	if group == "" {
		return 0o600
	}
	return 0o660
}

// DNSAddrOf is the address the sessions of pool resolve through, where
// the DNS sockets must be bound: the pool's anycast address, port 53.
func DNSAddrOf(pool netip.Prefix) (netip.AddrPort, error) {
	ipam, err := nsmgr.NewIPAM(pool)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(ipam.DNSAddr(), 53), nil
}

// SocketUnit is what a socket unit asks systemd to bind, after its
// drop-ins.
type SocketUnit struct {
	Files     []string    // the unit file, then its drop-ins, in the order applied
	Streams   []string    // ListenStream=: a path or ADDR:PORT
	Datagrams []string    // ListenDatagram=
	Group     string      // SocketGroup=; "" = root
	Mode      fs.FileMode // SocketMode= (systemd's default 0666 when unset)
	Masked    bool        // the unit file is /dev/null or empty
}

// parseSocketUnit applies the [Socket] assignments of one unit file or
// drop-in to u: a list setting accumulates and an empty assignment
// resets it, as systemd does.
func parseSocketUnit(text string, u *SocketUnit) error {
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	n := 0
	var cont string
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if cont != "" {
			line = cont + " " + line
			cont = ""
		}
		if strings.HasSuffix(line, "\\") {
			cont = strings.TrimSuffix(line, "\\")
			continue
		}
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			section = strings.Trim(line, "[]")
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return fmt.Errorf("line %d %q: no '='", n, line)
		}
		if section != "Socket" {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "ListenStream":
			u.Streams = appendOrReset(u.Streams, v)
		case "ListenDatagram":
			u.Datagrams = appendOrReset(u.Datagrams, v)
		case "SocketGroup":
			u.Group = v
		case "SocketMode":
			if v == "" {
				u.Mode = systemdSocketMode
				continue
			}
			m, err := strconv.ParseUint(v, 8, 32)
			if err != nil || m > 0o7777 {
				return fmt.Errorf("line %d: SocketMode=%s: want an octal mode such as 0660", n, v)
			}
			u.Mode = fs.FileMode(m)
		}
	}
	return sc.Err()
}

func appendOrReset(list []string, v string) []string {
	if v == "" {
		return nil
	}
	return append(list, v)
}

// ReadSocketUnit reads the unit name from dirs (highest precedence first)
// as systemd loads it: the first file of that name, then the .conf
// drop-ins of name.d/ in every directory, by file name (a name in a
// higher directory hides the same name below). found is false when no
// directory has the unit.
func ReadSocketUnit(dirs []string, name string) (u SocketUnit, found bool, err error) {
	u.Mode = systemdSocketMode
	for _, d := range dirs {
		p := filepath.Join(d, name)
		b, rerr := os.ReadFile(p)
		if errors.Is(rerr, fs.ErrNotExist) {
			continue
		}
		if rerr != nil {
			return u, true, fmt.Errorf("read %s: %w", p, rerr)
		}
		found = true
		u.Files = append(u.Files, p)
		if target, _ := filepath.EvalSymlinks(p); target == os.DevNull || len(strings.TrimSpace(string(b))) == 0 {
			u.Masked = true
			return u, true, nil
		}
		if err := parseSocketUnit(string(b), &u); err != nil {
			return u, true, fmt.Errorf("%s: %w", p, err)
		}
		break
	}
	dropIns := map[string]string{} // file name -> path of the highest directory holding it
	for _, d := range dirs {
		matches, _ := filepath.Glob(filepath.Join(d, name+".d", "*.conf"))
		for _, m := range matches {
			if _, ok := dropIns[filepath.Base(m)]; !ok {
				dropIns[filepath.Base(m)] = m
			}
		}
	}
	names := make([]string, 0, len(dropIns))
	for n := range dropIns {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := dropIns[n]
		b, rerr := os.ReadFile(p)
		if rerr != nil {
			return u, found, fmt.Errorf("read %s: %w", p, rerr)
		}
		if !found {
			continue // drop-ins without a unit configure nothing
		}
		u.Files = append(u.Files, p)
		if err := parseSocketUnit(string(b), &u); err != nil {
			return u, true, fmt.Errorf("%s: %w", p, err)
		}
	}
	return u, found, nil
}

// SocketWant is what the configuration wants the socket unit to bind.
type SocketWant struct {
	Socket string         // the API socket's path
	Group  string         // the socket group as configured; "" = root only
	DNS    netip.AddrPort // the pool's anycast address, port 53
	Pool   netip.Prefix   // for the message
}

// Mismatches lists, one phrase each naming both values, where u binds
// otherwise than want.
func (u SocketUnit) Mismatches(want SocketWant) []string {
	var out []string
	var unixStreams, inetStreams []string
	for _, s := range u.Streams {
		if strings.HasPrefix(s, "/") || strings.HasPrefix(s, "@") {
			unixStreams = append(unixStreams, s)
		} else {
			inetStreams = append(inetStreams, s)
		}
	}
	for _, s := range unixStreams {
		if s != want.Socket {
			out = append(out, fmt.Sprintf("ListenStream=%s, but the config's socket is %s", s, want.Socket))
		}
	}
	if len(unixStreams) > 0 {
		if !sameGroup(u.Group, want.Group) {
			out = append(out, fmt.Sprintf("SocketGroup=%s, but the config's socket-group is %s", groupShown(u.Group), groupShown(want.Group)))
		}
		if m := SocketModeFor(want.Group); u.Mode != m {
			out = append(out, fmt.Sprintf("SocketMode=%04o, but the config wants %04o (%s)", u.Mode, m, modeReason(want.Group)))
		}
	}
	for _, l := range []struct {
		key   string
		binds []string
	}{{"ListenStream", inetStreams}, {"ListenDatagram", u.Datagrams}} {
		for _, s := range l.binds {
			if got, err := netip.ParseAddrPort(s); err != nil || got != want.DNS {
				out = append(out, fmt.Sprintf("%s=%s, but the pool %s resolves through %s", l.key, s, want.Pool, want.DNS))
			}
		}
	}
	return out
}

// sameGroup compares two groups given as names or gids.
func sameGroup(a, b string) bool {
	if a == b {
		return true
	}
	if a == "" || b == "" {
		return (a == "" || a == "root" || a == "0") && (b == "" || b == "root" || b == "0")
	}
	ga, erra := api.LookupGroupID(a)
	gb, errb := api.LookupGroupID(b)
	return erra == nil && errb == nil && ga == gb
}

func groupShown(g string) string {
	if g == "" {
		return "unset (root only)"
	}
	return strconv.Quote(g)
}

func modeReason(group string) string {
	if group == "" {
		return "root only: no socket-group"
	}
	return fmt.Sprintf("socket-group %q", group)
}

// checkUnits compares the installed enforcerd.socket with the config.
func checkUnits(e *doctorEnv) (string, string) {
	dirs := e.opts.UnitDirs
	if len(dirs) == 0 {
		dirs = DefaultUnitDirs
	}
	u, found, err := ReadSocketUnit(dirs, SocketUnitName)
	switch {
	case err != nil:
		return StatusFail, err.Error()
	case !found:
		return StatusOK, fmt.Sprintf("no %s in %s: serve binds its own sockets", SocketUnitName, strings.Join(dirs, ", "))
	case u.Masked:
		return StatusOK, fmt.Sprintf("%s is masked (%s): serve binds its own sockets", SocketUnitName, u.Files[0])
	}
	dns, err := DNSAddrOf(e.cfg.Pool)
	if err != nil {
		return StatusFail, err.Error()
	}
	want := SocketWant{Socket: e.opts.Socket, Group: e.opts.SocketGroup, DNS: dns, Pool: e.cfg.Pool}
	files := strings.Join(u.Files, " + ")
	if bad := u.Mismatches(want); len(bad) > 0 {
		detail := fmt.Sprintf("%s (%s) does not match the config, serve would refuse its sockets: %s", SocketUnitName, files, strings.Join(bad, "; "))
		if e.opts.ConfigFile == "" {
			detail += " (compared with doctor's options and no --config: pass the service's --config)"
		}
		return StatusFail, detail
	}
	return StatusOK, fmt.Sprintf("%s (%s) matches the config: API socket %s mode %04o, DNS on %s", SocketUnitName, files, want.Socket, u.Mode, dns)
}
