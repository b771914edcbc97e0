package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestAccessPolicy(t *testing.T) {
	withGroup := AccessPolicy{OwnerUID: 0, Group: "enforcerd", GID: 990}
	rootOnly := AccessPolicy{OwnerUID: 0}
	ownedBy := AccessPolicy{OwnerUID: 1000}
	cases := []struct {
		name string
		pol  AccessPolicy
		peer PeerCred
		want bool
	}{
		{"root", rootOnly, PeerCred{UID: 0, GID: 0}, true},
		{"root with group policy", withGroup, PeerCred{UID: 0, GID: 5}, true},
		{"stranger, root only", rootOnly, PeerCred{UID: 1000, GID: 990}, false},
		{"primary group", withGroup, PeerCred{UID: 1000, GID: 990}, true},
		{"supplementary group", withGroup, PeerCred{UID: 1000, GID: 100, Groups: []uint32{4, 990}}, true},
		{"other groups", withGroup, PeerCred{UID: 1000, GID: 100, Groups: []uint32{4, 991}}, false},
		{"no groups", withGroup, PeerCred{UID: 1000, GID: 100}, false},
		{"the daemon's own uid", ownedBy, PeerCred{UID: 1000, GID: 1000}, true},
		{"another uid of a non-root daemon", ownedBy, PeerCred{UID: 1001, GID: 1000}, false},
	}
	for _, tc := range cases {
		if got := tc.pol.allows(tc.peer); got != tc.want {
			t.Errorf("%s: allows = %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := withGroup.denial(PeerCred{UID: 1000}); got != "caller uid 1000 is not root and not in group enforcerd" {
		t.Errorf("denial %q", got)
	}
	if got := rootOnly.denial(PeerCred{UID: 1000}); got != "caller uid 1000 is not root (the socket has no --socket-group)" {
		t.Errorf("denial %q", got)
	}
}

// TestAuthorize: the middleware refuses with 403 and the one-line error;
// a member of the socket group by a supplementary group (as SO_PEERGROUPS
// gave them at connect) is let in, a caller in other groups is not.
func TestAuthorize(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })
	pol := AccessPolicy{OwnerUID: 0, Group: "enforcerd", GID: 990}
	h := pol.authorize(ok, slog.New(slog.DiscardHandler))
	call := func(cr *credResult) (int, string) {
		req := httptest.NewRequest("GET", "/v1/sessions", nil)
		if cr != nil {
			req = req.WithContext(context.WithValue(req.Context(), credKey{}, *cr))
		}
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		return rr.Code, rr.Body.String()
	}
	if code, _ := call(&credResult{cred: PeerCred{PID: 7, UID: 0}}); code != 204 {
		t.Fatalf("root: %d", code)
	}
	if code, _ := call(&credResult{cred: PeerCred{PID: 42, UID: 1000, GID: 100, Groups: []uint32{4, 990}}}); code != 204 {
		t.Fatalf("member by a supplementary group: %d", code)
	}
	code, body := call(&credResult{cred: PeerCred{PID: 43, UID: 1000, GID: 100, Groups: []uint32{1}}})
	if code != 403 || body != errorLine("caller uid 1000 is not root and not in group enforcerd") {
		t.Fatalf("stranger: %d %s", code, body)
	}
	code, body = call(nil)
	if code != 403 || body != errorLine("cannot read the caller's credentials") {
		t.Fatalf("no credentials: %d %s", code, body)
	}
}

// TestPeerCredOverSocket reads SO_PEERCRED and SO_PEERGROUPS of a real connection.
func TestPeerCredOverSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := net.Dial("unix", path)
		if err == nil {
			time.Sleep(100 * time.Millisecond)
			c.Close()
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cr := connContext(context.Background(), c).Value(credKey{}).(credResult)
	if cr.err != nil {
		t.Fatal(cr.err)
	}
	if cr.cred.UID != uint32(os.Geteuid()) || cr.cred.GID != uint32(os.Getegid()) || cr.cred.PID != int32(os.Getpid()) {
		t.Fatalf("cred %+v", cr.cred)
	}
	// SO_PEERGROUPS: the groups this process holds, as the kernel has them.
	want, _ := os.Getgroups()
	var wantU []uint32
	for _, g := range want {
		wantU = append(wantU, uint32(g))
	}
	got := slices.Clone(cr.cred.Groups)
	slices.Sort(got)
	slices.Sort(wantU)
	if !slices.Equal(got, wantU) {
		t.Fatalf("peer groups %v, want this process's %v", got, wantU)
	}
}

func TestListenAPI(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "enforcerd") // parent made by Listen
	sock := filepath.Join(dir, "enforcerd.sock")
	cfg := ListenConfig{Socket: sock}

	// A stale socket (nobody answers) is replaced.
	os.MkdirAll(dir, 0o755)
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()

	ln, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(sock)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v %v", fi.Mode(), err)
	}
	if names, _ := filepath.Glob(filepath.Join(dir, "*")); !reflect.DeepEqual(names, []string{sock}) {
		t.Fatalf("dir holds %v", names)
	}
	// A live socket is not taken over.
	acceptor := ln
	go func() {
		for {
			c, err := acceptor.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if _, err := Listen(cfg); err == nil || err.Error() != "listen "+sock+": another daemon is serving on it" || !errors.Is(err, ErrOtherDaemon) || CodeOf(err) != CodeOtherDaemon {
		t.Fatalf("second listen: %v, want ErrOtherDaemon", err)
	}
	ln.Close()
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left after close: %v", err)
	}

	// Not a socket: refused, left alone.
	os.WriteFile(sock, []byte("x"), 0o644)
	if _, err := Listen(cfg); err == nil || err.Error() != "listen "+sock+": the path exists and is not a socket" {
		t.Fatalf("file in the way: %v", err)
	}
	os.Remove(sock)

	// With a group: 0660 and the group set (our own gid: allowed unprivileged).
	gid := os.Getegid()
	cfg.Group = strconv.Itoa(gid)
	ln, err = Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	fi, _ = os.Lstat(sock)
	if fi.Mode().Perm() != 0o660 || fi.Sys().(*syscall.Stat_t).Gid != uint32(gid) || ln.Policy.GID != uint32(gid) {
		t.Fatalf("group socket: %v gid %d policy %+v", fi.Mode(), fi.Sys().(*syscall.Stat_t).Gid, ln.Policy)
	}
	ln.Close()

	cfg.Group = "no-such-group-enforcerd"
	if _, err := Listen(cfg); err == nil || !strings.HasPrefix(err.Error(), `socket group "no-such-group-enforcerd": `) {
		t.Fatalf("unknown group: %v", err)
	}
}

func errorLine(msg string) string {
	b, _ := json.Marshal(ErrorBody{Error: msg, Code: CodeForbidden})
	return string(b) + "\n"
}
