// Package enforcerd runs the real enforcerd binary inside a test world's
// simulated host, the way an operator runs it on a real host, and drives it
// through its command-line client and the API client the CLI is built on
// (api.Client). The end-to-end tests, the demo and the bench share it;
// product code never imports it.
package enforcerd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

// Daemon is one enforcerd serve process in a world's simulated host.
type Daemon struct {
	Bin      string // the enforcerd binary
	Prefix   string // --name-prefix, unique per run
	Dir      string // holds the socket, the state dir and the log
	Socket   string
	StateDir string
	LogPath  string
	World    *world.World
	Args     []string // extra serve flags
	// ImagesDirs are passed as --images-dir: the daemon refuses every
	// --rootfs outside them. New sets the test rootfs's parent (see
	// DefaultImagesDirs); a caller with its own images adds to it.
	ImagesDirs []string
	// Upstream is --upstream ("": the world's DNS server).
	Upstream string

	cmd  *exec.Cmd
	done chan error

	clientMu sync.Mutex
	client   *api.Client // made by Client for Socket
}

// New describes a daemon for w; Start runs it. dir must exist.
func New(bin string, w *world.World, dir string, extra ...string) *Daemon {
	return &Daemon{
		Bin:        bin,
		Prefix:     "e" + w.ID[:5],
		Dir:        dir,
		Socket:     filepath.Join(dir, "enforcerd.sock"),
		StateDir:   filepath.Join(dir, "state"),
		LogPath:    filepath.Join(dir, "enforcerd.log"),
		World:      w,
		Args:       extra,
		ImagesDirs: DefaultImagesDirs(),
	}
}

// DefaultImagesDirs is the directory holding the test rootfs: the parent of
// ENFORCERD_ROOTFS when it is set (make live, make bench), else the
// module's .cache (where make rootfs builds .cache/rootfs; the demo and a
// plain go test use it). Nil when neither can be found: the daemon then
// refuses every --rootfs, as it does by default.
func DefaultImagesDirs() []string {
	if r := os.Getenv("ENFORCERD_ROOTFS"); r != "" {
		if abs, err := filepath.Abs(r); err == nil {
			return []string{filepath.Dir(abs)}
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return nil
	}
	for ; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return []string{filepath.Join(dir, ".cache")}
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}

// ServeArgs are the flags the daemon is started with.
func (d *Daemon) ServeArgs() []string {
	upstream := d.Upstream
	if upstream == "" {
		upstream = d.World.DNS.Addr().String()
	}
	args := []string{"serve",
		"--socket", d.Socket,
		"--state-dir", d.StateDir,
		"--name-prefix", d.Prefix,
		"--upstream", upstream,
		"--public-override", d.World.PublicOverride.String(),
		"--dns-min-ttl", "5s",
	}
	for _, dir := range d.ImagesDirs {
		args = append(args, "--images-dir", dir)
	}
	return append(args, d.Args...)
}

// Start runs `enforcerd serve` in the simulated host (entering only its
// network namespace, so the netns bind mounts it makes are visible to the
// rest of the machine) and waits until its API answers.
func (d *Daemon) Start() error {
	args := append([]string{"--net=" + d.World.HostPath, d.Bin}, d.ServeArgs()...)
	return d.run(exec.Command("nsenter", args...))
}

// Environ is the test process's environment without the markers of a
// systemd service (INVOCATION_ID, JOURNAL_STREAM): a test run by a service
// (a CI runner's unit) would hand them down, and the daemon it starts,
// which is no service, would take json for its default log format.
func Environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "INVOCATION_ID=") && !strings.HasPrefix(kv, "JOURNAL_STREAM=") {
			env = append(env, kv)
		}
	}
	return env
}

// run starts cmd (the daemon, however it is wrapped) with its output in the
// log, in a process group of its own, and waits until its API answers. A
// cmd without an environment of its own gets Environ().
func (d *Daemon) run(cmd *exec.Cmd) error {
	if cmd.Env == nil {
		cmd.Env = Environ()
	}
	logf, err := os.OpenFile(d.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	d.cmd = cmd
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

// waitAnswering waits until the started daemon's API answers, or it exits.
func (d *Daemon) waitAnswering(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case err := <-d.done:
			d.done <- err
			return fmt.Errorf("enforcerd exited during start: %v\n%s", err, d.Log())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := d.Client().Ready(ctx)
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.Kill()
	return fmt.Errorf("enforcerd did not answer within %s\n%s", limit, d.Log())
}

// Client is the API client of the daemon's socket, the one the CLI is
// built on.
func (d *Daemon) Client() *api.Client {
	d.clientMu.Lock()
	defer d.clientMu.Unlock()
	if d.client == nil {
		d.client = api.NewClient(d.Socket)
	}
	return d.client
}

// PID is the daemon's process id (nsenter execs it, so the pid is the
// daemon's own).
func (d *Daemon) PID() int {
	if d.cmd == nil || d.cmd.Process == nil {
		return 0
	}
	return d.cmd.Process.Pid
}

// Stop sends SIGTERM and waits for the daemon to exit.
func (d *Daemon) Stop() error { return d.signal(syscall.SIGTERM, 15*time.Second) }

// Kill sends SIGKILL (by pid, to the process we started) and waits.
func (d *Daemon) Kill() error { return d.signal(syscall.SIGKILL, 10*time.Second) }

// Signal sends sig to the daemon and waits up to 15s for it to exit.
func (d *Daemon) Signal(sig syscall.Signal) error { return d.signal(sig, 15*time.Second) }

func (d *Daemon) signal(sig syscall.Signal, wait time.Duration) error {
	if d.cmd == nil || d.cmd.Process == nil || d.done == nil {
		return nil
	}
	select {
	case err := <-d.done:
		d.done <- err
		return nil
	default:
	}
	if err := d.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case err := <-d.done:
		d.done <- err
		return nil
	case <-time.After(wait):
		d.cmd.Process.Kill()
		return fmt.Errorf("enforcerd did not exit within %s of %s", wait, sig)
	}
}

// Exited reports whether the process has ended, and its error.
func (d *Daemon) Exited() (bool, error) {
	select {
	case err := <-d.done:
		d.done <- err
		return true, err
	default:
		return false, nil
	}
}

// CLI runs the enforcerd client against the daemon's socket and returns
// stdout, stderr and the exit status (an error only when it did not run).
func (d *Daemon) CLI(args ...string) (string, string, error) {
	out, errOut, code, err := d.CLIStatus(context.Background(), args...)
	if err != nil {
		return out, errOut, err
	}
	if code != 0 {
		return out, errOut, fmt.Errorf("enforcerd %s: exit %d: %s", strings.Join(args, " "), code, strings.TrimSpace(errOut))
	}
	return out, errOut, nil
}

// Command returns the client command line args against the daemon's socket,
// not started, for callers that wire its streams (stdin, incremental
// stdout) or its credentials themselves.
func (d *Daemon) Command(ctx context.Context, args ...string) *exec.Cmd {
	return d.ClientCommand(ctx, d.Bin, args...)
}

// ClientCommand is Command with another client binary: bin/enforcerctl,
// the thin client, which runs the same client commands as d.Bin.
func (d *Daemon) ClientCommand(ctx context.Context, bin string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "ENFORCERD_SOCKET="+d.Socket)
	return cmd
}

// CLIStatus runs the client and returns its exit status.
func (d *Daemon) CLIStatus(ctx context.Context, args ...string) (string, string, int, error) {
	return d.ClientStatus(ctx, d.Bin, args...)
}

// ClientStatus is CLIStatus with another client binary (see ClientCommand).
func (d *Daemon) ClientStatus(ctx context.Context, bin string, args ...string) (string, string, int, error) {
	cmd := d.ClientCommand(ctx, bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errOut.String(), ee.ExitCode(), nil
	}
	if err != nil {
		return out.String(), errOut.String(), -1, err
	}
	return out.String(), errOut.String(), 0, nil
}

// Log returns what the daemon logged so far.
func (d *Daemon) Log() string {
	b, _ := os.ReadFile(d.LogPath)
	return string(b)
}

// Reap runs `enforcerd reap` for the daemon's prefix inside the simulated
// host (the daemon must be stopped), with the daemon's --pool when it was
// given one.
func (d *Daemon) Reap() (string, error) {
	args := []string{"--net=" + d.World.HostPath, d.Bin, "reap",
		"--name-prefix", d.Prefix, "--state-dir", d.StateDir}
	for i := 0; i+1 < len(d.Args); i++ {
		if d.Args[i] == "--pool" {
			args = append(args, "--pool", d.Args[i+1])
		}
	}
	cmd := exec.Command("nsenter", args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
