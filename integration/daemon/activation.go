package daemon

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StartActivated starts the daemon as systemd starts a socket-activated
// service: files become descriptors 3, 4, ... of the process, with
// LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID (the daemon's own pid: a
// shell sets it and execs the daemon, keeping its pid). The caller keeps
// its own copies of the sockets, as systemd does, so they outlive the
// process and queue what arrives until the next start.
func (d *Daemon) StartActivated(files []*os.File, names []string) error {
	logf, err := os.OpenFile(d.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// nsenter execs sh, sh execs the daemon: all three are one pid.
	args := append([]string{"--net=" + d.World.HostPath, "sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`, d.Bin}, d.ServeArgs()...)
	d.cmd = exec.Command("nsenter", args...)
	d.cmd.Env = append(os.Environ(), "LISTEN_FDS="+strconv.Itoa(len(files)), "LISTEN_FDNAMES="+strings.Join(names, ":"))
	d.cmd.ExtraFiles = files
	d.cmd.Stdout = logf
	d.cmd.Stderr = logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start enforcerd: %w", err)
	}
	d.done = make(chan error, 1)
	go func() { d.done <- d.cmd.Wait(); logf.Close() }()
	return d.waitAnswering(20 * time.Second)
}
