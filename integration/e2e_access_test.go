package integration

// Who may use the API: a caller that is not root and not in the socket
// group is refused, by the socket's file mode first and by the daemon's
// SO_PEERCRED check when the mode lets it through.

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const (
	e2eNobody      = 65534
	e2eSocketGroup = 4242 // a group no test process is in unless given it
)

// asUser runs the client (a copy the user can execute) as uid and gid with
// the supplementary groups, against the daemon's socket.
func (e *e2eEnv) asUser(client string, uid, gid uint32, groups []uint32, args ...string) (string, string, int) {
	e.t.Helper()
	cmd := exec.Command(client, args...)
	cmd.Env = []string{"ENFORCERD_SOCKET=" + e.d.Socket, "PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("run %s as uid %d: %v", client, uid, err)
	}
	return out.String(), errOut.String(), code
}

func TestE2EAccessNotRootNotInGroup(t *testing.T) {
	// The daemon's directory must be searchable by everyone, so that only
	// the socket's own mode and the daemon's check decide.
	dir := e2eWorldSearchableDir(t, "e2e-access-")
	e := prepareE2E(t, dir)
	client := filepath.Join(dir, "enforcerd-client")
	e2eCopyFile(t, e.bin, client, 0o755)
	e.start()
	e.createNetOnly("mine")
	before := e.expectConsistent("before the refused callers")

	expectRefused := func(what, want string, args ...string) {
		t.Helper()
		out, errOut, code := e.asUser(client, e2eNobody, e2eNobody, []uint32{}, args...)
		if code != 1 || out != "" || !strings.Contains(errOut, want) {
			t.Errorf("%s: uid %d: enforcerd %s: exit %d stdout %q stderr %q, want exit 1 and %q",
				what, e2eNobody, strings.Join(args, " "), code, out, errOut, want)
		}
		e2eOneLine(t, what, errOut)
		e.expectObjects(t, "after a refused caller", e.expected(before))
	}
	stat := func() os.FileInfo {
		fi, err := os.Stat(e.d.Socket)
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}

	// Default: root only, mode 0600. connect() itself is refused.
	if mode := stat().Mode().Perm(); mode != 0o600 {
		t.Errorf("socket mode %o, want 600", mode)
	}
	expectRefused("socket 0600", "permission denied", "session", "ls")
	expectRefused("socket 0600", "permission denied", "session", "create", "x", "--network-only")
	// Root (the control) is served.
	if got := e2eNames(e.list()); len(got) != 1 {
		t.Errorf("root: ls %v", got)
	}

	// A socket left world-writable: the daemon's own check refuses.
	if err := os.Chmod(e.d.Socket, 0o666); err != nil {
		t.Fatal(err)
	}
	const noGroup = "caller uid 65534 is not root (the socket has no --socket-group)"
	expectRefused("socket 0666, no group", "enforcerd session ls: "+noGroup, "session", "ls")
	expectRefused("socket 0666, no group", "enforcerd session create: "+noGroup, "session", "create", "x", "--network-only")
	expectRefused("socket 0666, no group", "enforcerd session rm: "+noGroup, "session", "rm", "mine")
	out, errOut, code := e.asUser(client, e2eNobody, e2eNobody, []uint32{}, "session", "exec", "mine", "--", "true")
	if code != 125 || !strings.Contains(errOut, noGroup) {
		t.Errorf("uid %d: session exec: exit %d %q %q, want 125 and %q", e2eNobody, code, out, errOut, noGroup)
	}

	// With --socket-group: mode 0660 and the group; a member is served.
	if err := e.d.Stop(); err != nil {
		t.Fatal(err)
	}
	e.d.Args = append(e.d.Args, "--socket-group", "4242")
	e.start()
	fi := stat()
	if mode, gid := fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Gid; mode != 0o660 || gid != e2eSocketGroup {
		t.Errorf("socket with --socket-group 4242: mode %o gid %d, want 660 and 4242", mode, gid)
	}
	expectRefused("socket 0660 group 4242", "permission denied", "session", "ls")
	for _, member := range []struct {
		gid    uint32
		groups []uint32
	}{{e2eNobody, []uint32{e2eSocketGroup}}, {e2eSocketGroup, []uint32{}}} {
		out, errOut, code := e.asUser(client, e2eNobody, member.gid, member.groups, "session", "ls", "--json")
		if code != 0 || !strings.Contains(out, `"mine"`) {
			t.Errorf("uid %d gid %d groups %v (a member of 4242): ls: exit %d %q %q", e2eNobody, member.gid, member.groups, code, out, errOut)
		}
	}
	if err := os.Chmod(e.d.Socket, 0o666); err != nil {
		t.Fatal(err)
	}
	const notMember = "caller uid 65534 is not root and not in group 4242"
	expectRefused("socket 0666, group 4242", "enforcerd session ls: "+notMember, "session", "ls")
	expectRefused("socket 0666, group 4242", "enforcerd session create: "+notMember, "session", "create", "x", "--network-only")
	expectRefused("socket 0666, group 4242", "enforcerd session rm: "+notMember, "session", "rm", "mine")
	e.expectConsistent("after the refused callers")
}

func e2eCopyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
