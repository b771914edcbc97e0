package integration

// Attach into a netns the daemon made ahead of demand (--prepared-netns):
// a pool entry is no session's yet, has no veth of ours and is not in the
// daemon's session list, so the attach refusal did not know it. An API
// caller who attached a public session there had its interface, address
// and default route inside the netns the next session claimed: that
// session's guest got a second way out, past its own policy.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/world"
)

func TestE2EAttachRefusesPreparedNetns(t *testing.T) {
	e := newE2E(t, "--prepared-netns", "1")
	client := e.d.Client()
	ctx := context.Background()
	var pool []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && len(pool) == 0; time.Sleep(20 * time.Millisecond) {
		pool = e2ePrepared(t, e.d.Prefix)
	}
	if len(pool) != 1 {
		t.Fatalf("prepared netns %v, want one", pool)
	}
	target := filepath.Join(world.NetnsDir, pool[0])

	// The attack: a public session attached into the pool entry.
	_, err := client.Create(ctx, api.CreateRequest{Name: "pub", NetnsPath: target, IfName: "eth7", Egress: "public"})
	want := `invalid netns path "` + target + `": it is a netns the daemon prepared for its own sessions, not a container's`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("attach a public session into prepared netns %s: %v, want %q", target, err, want)
	}
	// The next session claims that netns: it must hold only its own
	// interface, and reach nothing its policy does not allow.
	e.createNetOnly("victim", "--allow", "api.e2e.test")
	_, h, release := sessionHandle(t, e.nsPath("victim"))
	names := linkNames(t, h)
	release()
	if slices.Contains(names, "eth7") {
		t.Errorf("session victim's netns holds eth7, another session's interface: %v", names)
	}
	e.resolveTo("victim", "api.e2e.test", "198.18.1.10")
	e2eExpect(t, e2eTCP(e.nsPath("victim"), "198.18.1.10:7", e2eReach), e2eTCP(e.nsPath("victim"), "198.18.1.11:7", e2eRejected))

	// The control: the same request into a runtime's netns is made and
	// reaches out.
	fresh := runtimeNetns(t, e.w, "pp")
	if _, err := client.Create(ctx, api.CreateRequest{Name: "pub2", NetnsPath: fresh, IfName: "eth7", Egress: "public"}); err != nil {
		t.Fatalf("attach the public session into a runtime's netns: %v", err)
	}
	e2eExpect(t, e2eHTTP(fresh, "198.18.1.10", e2eReach))
}

// TestE2EAttachRefusesAliasPath: the refusal knows a netns by what it is,
// not by the path it is named by: a session's netns named through
// /proc/PID/task/TID/ns/net of a thread that sits in it (a sandbox
// process's path would be the same kind) is refused naming the session.
// Control: the same alias of a runtime's netns is taken.
func TestE2EAttachRefusesAliasPath(t *testing.T) {
	e := newE2E(t)
	client := e.d.Client()
	ctx := context.Background()
	own := e.createNetOnly("own", "--allow", "api.e2e.test")
	attachVia := func(ns, name string) (string, error) {
		var alias string
		var cerr error
		err := world.DoPath(ns, func() error {
			alias = fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
			_, cerr = client.Create(ctx, api.CreateRequest{Name: name, NetnsPath: alias, IfName: "eth7", Egress: "public"})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return alias, cerr
	}
	alias, err := attachVia(e.nsPath("own"), "pub")
	want := `invalid netns path "` + alias + `": it is the netns of session ` + own.Netns + `, not a container's`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("attach a public session into session own's netns through %s: %v, want %q", alias, err, want)
	}
	if _, err := attachVia(runtimeNetns(t, e.w, "al"), "pub2"); err != nil {
		t.Errorf("attach through the same kind of alias of a runtime's netns: %v", err)
	}
}
