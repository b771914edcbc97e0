package enforcerd

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// StartActivated starts the daemon as systemd starts a socket-activated
// service: files become descriptors 3, 4, ... of the process, with
// LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID (the daemon's own pid: a
// shell sets it and execs the daemon, keeping its pid). The caller keeps
// its own copies of the sockets, as systemd does, so they outlive the
// process and queue what arrives until the next start.
func (d *Daemon) StartActivated(files []*os.File, names []string) error {
	// nsenter execs sh, sh execs the daemon: all three are one pid.
	args := append([]string{"--net=" + d.World.HostPath, "sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, d.Bin}, d.ServeArgs()...)
	cmd := exec.Command("nsenter", args...)
	cmd.Env = append(Environ(), "LISTEN_FDS="+strconv.Itoa(len(files)), "LISTEN_FDNAMES="+strings.Join(names, ":"))
	cmd.ExtraFiles = files
	return d.run(cmd)
}
