package api

// The API's unix socket and who may use it. Filesystem permissions are the
// first gate (mode 0600 root only, or 0660 with the --socket-group); every
// connection's SO_PEERCRED is checked again so that a socket left with
// looser permissions, or a group change, never opens the API.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PeerCred is the credentials of the process at the other end of a
// connection: pid, effective uid and gid from SO_PEERCRED, and its
// supplementary groups from SO_PEERGROUPS. The kernel took both when the
// caller connected: no later lookup by pid, which a reused pid could answer.
type PeerCred struct {
	PID    int32
	UID    uint32
	GID    uint32
	Groups []uint32
}

// AccessPolicy says who may use the API: root, the daemon's own uid (the
// socket's owner), and, when Group is set, members of that group (primary
// or supplementary).
type AccessPolicy struct {
	OwnerUID uint32
	Group    string // as configured (name or gid); "" = no group
	GID      uint32 // Group resolved
}

// allows is the pure decision.
func (p AccessPolicy) allows(c PeerCred) bool {
	if c.UID == 0 || c.UID == p.OwnerUID {
		return true
	}
	if p.Group == "" {
		return false
	}
	if c.GID == p.GID {
		return true
	}
	for _, g := range c.Groups {
		if g == p.GID {
			return true
		}
	}
	return false
}

// denial is the one-line refusal of a caller that is not allowed.
func (p AccessPolicy) denial(c PeerCred) string {
	if p.Group == "" {
		return fmt.Sprintf("caller uid %d is not root (the socket has no --socket-group)", c.UID)
	}
	return fmt.Sprintf("caller uid %d is not root and not in group %s", c.UID, p.Group)
}

// credKey carries a connection's credentials in its context.
type credKey struct{}

type credResult struct {
	cred PeerCred
	err  error
}

// CallerFrom returns the caller of a request served by Serve, from its
// connection's SO_PEERCRED (false when the context carries none, as in a
// request that did not come through the socket).
func CallerFrom(ctx context.Context) (Caller, bool) {
	cr, ok := ctx.Value(credKey{}).(credResult)
	if !ok || cr.err != nil {
		return Caller{}, false
	}
	return Caller{UID: cr.cred.UID, GID: cr.cred.GID, PID: cr.cred.PID}, true
}

// WithCaller returns ctx carrying c as its caller, for tests and for
// callers of an Engine that did not come through the socket.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, credKey{}, credResult{cred: PeerCred{PID: c.PID, UID: c.UID, GID: c.GID}})
}

// connContext reads SO_PEERCRED once per connection (http.Server.ConnContext).
func connContext(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return context.WithValue(ctx, credKey{}, credResult{err: errors.New("not a unix socket connection")})
	}
	cred, err := PeerCredOf(uc)
	if err == nil {
		// (without them a caller is judged by its uid and primary gid only)
		cred.Groups, _ = peerGroupsOf(uc)
	}
	return context.WithValue(ctx, credKey{}, credResult{cred: cred, err: err})
}

func PeerCredOf(uc *net.UnixConn) (PeerCred, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return PeerCred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var (
		uc2  *unix.Ucred
		serr error
	)
	if err := raw.Control(func(fd uintptr) {
		uc2, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return PeerCred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if serr != nil {
		return PeerCred{}, fmt.Errorf("peer credentials: getsockopt SO_PEERCRED: %w", serr)
	}
	return PeerCred{PID: uc2.Pid, UID: uc2.Uid, GID: uc2.Gid}, nil
}

// peerGroupsOf reads SO_PEERGROUPS: the supplementary groups the peer
// held when it connected (Linux 4.13 and later). The kernel says ERANGE with
// the length it needs when the buffer is short.
func peerGroupsOf(uc *net.UnixConn) ([]uint32, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer groups: %w", err)
	}
	var (
		groups []uint32
		serr   error
	)
	if err := raw.Control(func(fd uintptr) {
		buf := make([]uint32, 64)
		for {
			size := uint32(len(buf) * 4)
			_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_PEERGROUPS,
				uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
			switch {
			case errno == unix.ERANGE && int(size/4) > len(buf):
				buf = make([]uint32, size/4)
				continue
			case errno != 0:
				serr = fmt.Errorf("peer groups: getsockopt SO_PEERGROUPS: %w", errno)
			default:
				groups = buf[:size/4]
			}
			return
		}
	}); err != nil {
		return nil, fmt.Errorf("peer groups: %w", err)
	}
	return groups, serr
}

// authorize wraps the API handler with the access check; a refused caller
// gets 403 {"error": "caller uid N is not root and not in group G"}.
func (p AccessPolicy) authorize(next http.Handler, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cr, ok := r.Context().Value(credKey{}).(credResult)
		if !ok || cr.err != nil {
			msg := "cannot read the caller's credentials"
			if ok {
				msg += ": " + cr.err.Error()
			}
			writeError(w, http.StatusForbidden, CodeForbidden, msg)
			return
		}
		c := cr.cred
		if !p.allows(c) {
			log.Warn("api caller refused", "uid", c.UID, "gid", c.GID, "pid", c.PID, "method", r.Method, "path", r.URL.Path)
			writeError(w, http.StatusForbidden, CodeForbidden, p.denial(c))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// LookupGroupID resolves a group name or a numeric gid (the socket group:
// serve, its socket activation check and doctor resolve it the same way).
func LookupGroupID(group string) (uint32, error) {
	if n, err := strconv.ParseUint(group, 10, 32); err == nil {
		return uint32(n), nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("socket group %q: %w", group, err)
	}
	n, err := strconv.ParseUint(g.Gid, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("socket group %q: gid %q: %w", group, g.Gid, err)
	}
	return uint32(n), nil
}

// Listener is the bound API socket and the policy of its callers.
type Listener struct {
	net.Listener
	Policy AccessPolicy
	path   string
	info   os.FileInfo // the socket file we created, to remove only ours
}

// Close stops listening and removes the socket file if it is still ours
// (an inherited socket's file belongs to the service manager).
func (l *Listener) Close() error {
	err := l.Listener.Close()
	if l.info == nil {
		return err
	}
	if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.info) {
		_ = os.Remove(l.path)
	}
	return err
}

// ListenConfig is where the API socket goes and who may use it.
type ListenConfig struct {
	Socket string // absolute path of the socket
	Group  string // group name or gid allowed besides root; "" = root only (mode 0600)
}

// Listen binds the API socket at cfg.Socket: it creates the parent
// directory (0755), refuses if another daemon answers on the path, binds a
// temporary name, sets mode 0600 (or 0660 and the group) and renames it
// into place, so the socket is never reachable with looser permissions. A
// stale socket nobody answers on is replaced.
func Listen(cfg ListenConfig) (*Listener, error) {
	path := cfg.Socket
	pol, err := accessPolicyFor(cfg)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create socket directory %s: %w", dir, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen %s: the path exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, Classify(fmt.Errorf("listen %s: another daemon is serving on it", path), ErrOtherDaemon)
		}
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".enforcerd-%d.sock", os.Getpid()))
	_ = os.Remove(tmp)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*Listener, error) {
		ln.Close()
		_ = os.Remove(tmp)
		return nil, err
	}
	mode := os.FileMode(0o600)
	if cfg.Group != "" {
		mode = 0o660
		if err := os.Chown(tmp, -1, int(pol.GID)); err != nil {
			return fail(fmt.Errorf("chown socket %s to group %s: %w", path, cfg.Group, err))
		}
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(fmt.Errorf("chmod socket %s: %w", path, err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("move socket into place at %s: %w", path, err))
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(fmt.Errorf("stat socket %s: %w", path, err))
	}
	return &Listener{Listener: ln, Policy: pol, path: path, info: fi}, nil
}

// Inherited reports whether the service manager bound the socket.
func (l *Listener) Inherited() bool { return l.info == nil }

// ListenerFrom serves the API on a socket the service manager bound and
// passed (socket activation): ln must be a unix listener at cfg.Socket.
// Its file mode is the manager's (SocketMode=); the SO_PEERCRED check
// applies as on a socket Listen made. Close leaves the socket file.
func ListenerFrom(ln net.Listener, cfg ListenConfig) (*Listener, error) {
	if got := ln.Addr().String(); got != cfg.Socket {
		return nil, fmt.Errorf("socket activation: the API socket passed is %s, but the socket is configured at %s; make them the same", got, cfg.Socket)
	}
	pol, err := accessPolicyFor(cfg)
	if err != nil {
		return nil, err
	}
	return &Listener{Listener: ln, Policy: pol, path: cfg.Socket}, nil
}

func accessPolicyFor(cfg ListenConfig) (AccessPolicy, error) {
	pol := AccessPolicy{OwnerUID: uint32(os.Geteuid()), Group: cfg.Group}
	if cfg.Group != "" {
		gid, err := LookupGroupID(cfg.Group)
		if err != nil {
			return AccessPolicy{}, err
		}
		pol.GID = gid
	}
	return pol, nil
}

// shutdownGrace bounds how long Serve waits for requests on shutdown.
const shutdownGrace = 5 * time.Second

// ListenAndServe binds the socket (Listen), calls ready (sd_notify
// READY=1) once it accepts connections, and serves h, checking every
// caller's SO_PEERCRED, until ctx ends. Request contexts derive from ctx,
// so streams (events --follow, exec) end with it. On return the socket
// file is gone. It returns nil after a shutdown by ctx.
func ListenAndServe(ctx context.Context, cfg ListenConfig, h http.Handler, ready func()) error {
	ln, err := Listen(cfg)
	if err != nil {
		return err
	}
	log := slog.New(slog.DiscardHandler)
	if lh, ok := h.(interface{ logger() *slog.Logger }); ok {
		log = lh.logger()
	}
	if ready != nil {
		ready()
	}
	return Serve(ctx, ln, h, log)
}

// Serve serves h on a bound listener until ctx ends, checking every
// caller's SO_PEERCRED against the listener's policy.
func Serve(ctx context.Context, ln *Listener, h http.Handler, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           ln.Policy.authorize(h, log),
		ConnContext:       connContext,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		ln.Close()
		return fmt.Errorf("serve api on %s: %w", ln.path, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	<-errc // http.ErrServerClosed
	return nil
}
