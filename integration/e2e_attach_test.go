package integration

// Attach mode through the daemon's API, attacked as the threat model states
// it: "the daemon's own netns, init's and every session's are refused
// before anything is made". Every session's: the netns the daemon made for
// one, and the netns a runtime made that a session was attached to (a CNI
// pod, a bring-your-own runtime), also after a restart.

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/enforcerd/enforcerd/api"
)

// A public session attached into the netns a --locked allowlist session
// was attached to would give that netns a second route out, past the
// locked policy: refused, naming the session, with nothing made; the same
// public session attached into a fresh netns is made and reaches out
// (the control).
func TestE2EAttachRefusesEverySessionsNetns(t *testing.T) {
	e := newE2E(t)
	client := e.d.Client()
	ctx := context.Background()
	pod := runtimeNetns(t, e.w, "lk")
	locked, err := client.Create(ctx, api.CreateRequest{Name: "locked", NetnsPath: pod, Allow: []string{"api.e2e.test"}, Locked: true})
	if err != nil {
		t.Fatalf("attach the locked session: %v", err)
	}
	own := e.createNetOnly("own")
	// As found: the locked session's netns has no default route (its
	// runtime, or root in the pod, removed it), so a second interface's
	// route would be the only way out.
	_, h, release := sessionHandle(t, pod)
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			if err := h.RouteDel(&r); err != nil {
				t.Fatalf("remove the pod's default route: %v", err)
			}
		}
	}
	release()
	// The attack before any restart, and again after one (the daemon then
	// knows the attached session from its veth and its record only).
	for _, when := range []string{"running", "after a restart"} {
		if when == "after a restart" {
			if err := e.d.Stop(); err != nil {
				t.Fatal(err)
			}
			e.start()
		}
		for _, c := range []struct{ path, want string }{
			{pod, `invalid netns path "` + pod + `": it is the netns of session locked, not a container's`},
			{e.nsPath("own"), `invalid netns path "` + e.nsPath("own") + `": it is the netns of session ` + own.Netns + `, not a container's`},
			{e.w.HostPath, `invalid netns path "` + e.w.HostPath + `": it is the daemon's own netns, not a container's`},
		} {
			_, err := client.Create(ctx, api.CreateRequest{Name: "pub", NetnsPath: c.path, IfName: "eth7", Egress: "public"})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: attach a public session into %s: %v, want %q", when, c.path, err, c.want)
			}
		}
		// Nothing was made: no session, no eth7 in the locked session's netns.
		if _, err := client.Inspect(ctx, "pub"); err == nil {
			t.Errorf("%s: a refused attach left session pub", when)
		}
		_, h, release := sessionHandle(t, pod)
		names := linkNames(t, h)
		release()
		if slices.Contains(names, "eth7") {
			t.Errorf("%s: a refused attach left eth7 in the locked session's netns: %v", when, names)
		}
		// The locked session still has no way out but its policy.
		e2eExpect(t, e2eHTTP(pod, "198.18.1.10", e2eUnreachable))
	}
	if got := e.inspect("locked"); got.NetnsPath != locked.NetnsPath || !got.Policy.Locked {
		t.Errorf("the locked session changed: %+v", got)
	}

	// The control: the same request into a netns no session holds.
	fresh := runtimeNetns(t, e.w, "fr")
	pub, err := client.Create(ctx, api.CreateRequest{Name: "pub", NetnsPath: fresh, IfName: "eth7", Egress: "public"})
	if err != nil {
		t.Fatalf("attach the public session into a fresh netns: %v", err)
	}
	if pub.Egress != "public" {
		t.Errorf("pub: egress %q, want public", pub.Egress)
	}
	e2eExpect(t, e2eHTTP(fresh, "198.18.1.10", e2eReach))
	// Once attached, that netns is a session's too.
	if _, err := client.Create(ctx, api.CreateRequest{Name: "pub2", NetnsPath: fresh, IfName: "eth8", Egress: "public"}); err == nil || !strings.Contains(err.Error(), "it is the netns of session pub,") {
		t.Errorf("attach a second session into pub's netns: %v, want refused naming pub", err)
	}
}
