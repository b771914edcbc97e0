package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// The policy update's calls, as the injector names them.
const (
	callFwUpdate  = "fw.UpdateSession"
	callFwCut     = "fw.CutFlows"
	callDNSUpdate = "dns.Update"
)

func (f *fakeFirewall) UpdateSession(u nft.SessionUpdate) error {
	if err := f.in.enter(callFwUpdate); err != nil {
		return err
	}
	f.lastUpdate = u
	r := u.New
	r.Static, r.Peers = slices.Clone(r.Static), slices.Clone(r.Peers)
	f.rules[r.Guest] = r
	f.in.leave(callFwUpdate)
	return nil
}

func (f *fakeFirewall) CutFlows(u nft.SessionUpdate) ([]nft.CutFlow, error) {
	if err := f.in.enter(callFwCut); err != nil {
		return nil, err
	}
	f.in.leave(callFwCut)
	return f.cut, nil
}

// AbortTCP records what the daemon asked to abort, and where.
func (f *fakeNetwork) AbortTCP(netnsPath string, conns []nsmgr.TCPConn) (int, error) {
	for _, c := range conns {
		f.aborted = append(f.aborted, netnsPath+" "+c.String())
	}
	return len(conns), nil
}

// Update is dnsproxy's: apply runs first; only if it succeeds is the new
// policy registered.
func (f *fakeResolver) Update(p dnsproxy.SessionPolicy, apply func(stale, keep []netpolicy.Attestation, forgotten bool) error) error {
	if err := f.in.enter(callDNSUpdate); err != nil {
		return err
	}
	if err := apply(nil, nil, f.forgotten); err != nil {
		return err
	}
	f.reg[p.Guest] = p
	f.in.leave(callDNSUpdate)
	return nil
}

func (w *world) mustCreate(req api.CreateRequest) {
	w.t.Helper()
	if _, err := w.d.Create(context.Background(), req); err != nil {
		w.t.Fatalf("create %s: %v", req.Name, err)
	}
}

func widen() api.PolicyUpdate {
	return api.PolicyUpdate{Allow: []string{"b.example.com:443", "93.184.0.0/24"}, Revoke: []string{"a.example.com"}}
}

// TestUpdateFaultAtEachStepChangesNothing: an update failing at any step
// (the DNS proxy, the kernel batch) leaves the
// world exactly as before it, the generation included; an update that
// passes changes the rules and the DNS policy together and counts a
// generation.
func TestUpdateFaultAtEachStepChangesNothing(t *testing.T) {
	w := newWorld(t)
	w.mustCreate(api.CreateRequest{Name: "u1", NetworkOnly: true, Allow: []string{"a.example.com", "93.184.216.7"}})
	before := w.render()
	for _, call := range []string{callDNSUpdate, callFwUpdate} {
		w.in.arm(map[string]int{call: 1}, crashPoint{})
		_, err := w.d.UpdatePolicy(context.Background(), "u1", widen(), false)
		w.in.disarm()
		if !errors.Is(err, errInjected) {
			t.Fatalf("fault in %s: update = %v, want the injected error", call, err)
		}
		w.compare("a fault in "+call, before)
	}
	if in, _ := w.d.Inspect("u1"); in.Policy.Generation != 1 {
		t.Fatalf("generation %d after failed updates, want 1", in.Policy.Generation)
	}

	// Invalid updates change nothing either, each with create's one line.
	for _, c := range []struct {
		u    api.PolicyUpdate
		want string
	}{
		{api.PolicyUpdate{Allow: []string{"exa mple.com"}}, `allow entry`},
		{api.PolicyUpdate{Revoke: []string{"c.example.com"}}, `revoke "c.example.com": not an entry of session u1's policy`},
		{api.PolicyUpdate{Egress: "none"}, "egress none"},
		{api.PolicyUpdate{Egress: "wide"}, `egress mode "wide"`},
		{api.PolicyUpdate{Allow: []string{"169.254.169.254"}}, "169.254.169.254"},
	} {
		_, err := w.d.UpdatePolicy(context.Background(), "u1", c.u, false)
		if !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("update %+v = %v, want a one-line 400 containing %q", c.u, err, c.want)
		}
	}
	w.compare("invalid updates", before)

	caller := api.Caller{UID: 1000, GID: 100, PID: 4242}
	info, err := w.d.UpdatePolicy(api.WithCaller(context.Background(), caller), "u1", widen(), false)
	if err != nil {
		t.Fatal(err)
	}
	if in, _ := w.d.Inspect("u1"); in.Policy.Updated == nil || in.Policy.Updated.By == nil || *in.Policy.Updated.By != caller {
		t.Errorf("inspect after the update: updated %+v, want by %+v", in.Policy.Updated, caller)
	}
	if want := []string{"93.184.0.0/24", "93.184.216.7", "b.example.com:443"}; !slices.Equal(info.Policy.Allow, want) || info.Policy.Generation != 2 || info.Policy.Updated == nil {
		t.Fatalf("after the update: allow %v generation %d updated %v, want %v, 2, set", info.Policy.Allow, info.Policy.Generation, info.Policy.Updated, want)
	}
	after := w.render()
	if slices.Equal(after, before) {
		t.Fatal("a successful update changed nothing")
	}
	for _, l := range after {
		if strings.HasPrefix(l, "dns ") && (strings.Contains(l, "a.example.com") || !strings.Contains(l, "b.example.com")) {
			t.Errorf("dns registration %q: want the new policy", l)
		}
	}
	// Stale generation: 409, nothing changed.
	if _, err := w.d.UpdatePolicy(context.Background(), "u1", api.PolicyUpdate{Generation: 1, Allow: []string{"c.example.com"}}, false); !errors.Is(err, api.ErrStaleGeneration) || api.StatusOf(err) != 409 {
		t.Fatalf("stale generation: %v", err)
	}
	w.compare("a stale update", after)
	// A restart re-adopts the updated policy.
	w.restart(nil)
	w.compare("a restart after the update", after)
}

// TestUpdateLocked: a session created locked refuses every update with
// 409 and one line, and says it is locked.
func TestUpdateLocked(t *testing.T) {
	w := newWorld(t)
	w.mustCreate(api.CreateRequest{Name: "lk", NetworkOnly: true, Allow: []string{"a.example.com"}, Locked: true})
	before := w.render()
	_, err := w.d.UpdatePolicy(context.Background(), "lk", widen(), false)
	if !errors.Is(err, api.ErrLocked) || api.StatusOf(err) != 409 || err.Error() != `session "lk" was created with --locked: its policy never changes` {
		t.Fatalf("update of a locked session: %v", err)
	}
	w.compare("a refused update", before)
	if in, _ := w.d.Inspect("lk"); !in.Policy.Locked {
		t.Error("inspect does not say locked")
	}
}

// TestUpdateCrashThenRestart: a crash at any point of an update leaves,
// after the restart, the old policy (the crash came before the
// write-ahead record) or the new one in full: never the rules of one and
// the DNS policy of the other.
func TestUpdateCrashThenRestart(t *testing.T) {
	for _, cp := range []crashPoint{
		{method: callDNSUpdate, n: 1}, {method: callFwUpdate, n: 1}, {method: callFwUpdate, n: 1, after: true},
		{method: callFwCut, n: 1}, {method: callFwCut, n: 1, after: true},
	} {
		t.Run(cp.String(), func(t *testing.T) {
			w := newWorld(t)
			w.mustCreate(api.CreateRequest{Name: "c1", NetworkOnly: true, Allow: []string{"a.example.com", "93.184.216.7"}})
			ref := newWorld(t)
			ref.mustCreate(api.CreateRequest{Name: "c1", NetworkOnly: true, Allow: []string{"a.example.com", "93.184.216.7"}})
			if _, err := ref.d.UpdatePolicy(context.Background(), "c1", widen(), false); err != nil {
				t.Fatal(err)
			}
			w.in.arm(nil, cp)
			if at := crashes(func() { _, _ = w.d.UpdatePolicy(context.Background(), "c1", widen(), false) }); at == "" {
				t.Fatalf("no crash at %s", cp)
			}
			w.restart(nil)
			got, want := withoutTimes(w.render()), withoutTimes(ref.render())
			if !slices.Equal(got, want) {
				t.Fatalf("after a crash %s and a restart:\n%s\nwant the new policy in full:\n%s", cp, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if in, _ := w.d.Inspect("c1"); in.Policy.Generation != 2 {
				t.Errorf("generation %d, want 2", in.Policy.Generation)
			}
		})
	}
}

// withoutTimes drops what differs between two worlds by time alone.
func withoutTimes(lines []string) []string { return lines }

// TestUpdatePinnedHosts: an update that changes the pinned names rewrites
// the sandbox's /etc/hosts, after the kernel's batch; an update a crash
// interrupted after that batch rewrites it at the restart.
func TestUpdatePinnedHosts(t *testing.T) {
	req := api.CreateRequest{Name: "p1", Allow: []string{"example.com", "93.184.216.7"}, Pin: true}
	hosts := func(w *world) string {
		t.Helper()
		for _, l := range w.boxes.render() {
			if strings.HasPrefix(l, "box p1 ") {
				_, h, _ := strings.Cut(l, " hosts ")
				return h
			}
		}
		t.Fatal("no sandbox p1")
		return ""
	}
	revoke := api.PolicyUpdate{Revoke: []string{"example.com"}}
	for _, cp := range []crashPoint{{}, {method: callFwUpdate, n: 1, after: true}} {
		w := newWorld(t)
		req.Rootfs = w.image
		w.mustCreate(req)
		if h := hosts(w); !strings.Contains(h, "example.com") {
			t.Fatalf("created: hosts %q, want example.com pinned", h)
		}
		if _, err := w.d.UpdatePolicy(context.Background(), "p1", api.PolicyUpdate{Allow: []string{"93.184.216.8"}}, false); err != nil {
			t.Fatal(err)
		}
		if h := hosts(w); !strings.Contains(h, "example.com") {
			t.Fatalf("an update that kept the pins: hosts %q", h)
		}
		if cp.method == "" {
			if _, err := w.d.UpdatePolicy(context.Background(), "p1", revoke, false); err != nil {
				t.Fatal(err)
			}
		} else {
			w.in.arm(nil, cp)
			if at := crashes(func() { _, _ = w.d.UpdatePolicy(context.Background(), "p1", revoke, false) }); at == "" {
				t.Fatalf("no crash at %s", cp)
			}
			if h := hosts(w); !strings.Contains(h, "example.com") {
				t.Fatalf("crashed %s: hosts %q already rewritten", cp, h)
			}
			w.restart(nil)
		}
		if h := hosts(w); h != "" {
			t.Errorf("crash %q: after revoking the pinned name the sandbox's hosts hold %q", cp, h)
		}
	}
}

// TestUpdateForgottenNamesAreStale: when the DNS proxy says it forgot
// names, the update counts every attested element the kernel holds for
// the session stale (the batch keeps those a kept name holds), so a
// revoked name the proxy forgot loses its addresses too.
func TestUpdateForgottenNamesAreStale(t *testing.T) {
	w := newWorld(t)
	w.mustCreate(api.CreateRequest{Name: "f1", NetworkOnly: true, Allow: []string{"a.example.com", "b.example.com"}})
	in, _ := w.d.Inspect("f1")
	guest := netip.MustParseAddr(in.GuestIP)
	w.fw.attested = map[netip.Addr][]nft.AttestedAddr{guest: {
		{IP: netip.MustParseAddr("93.184.216.34")},
		{IP: netip.MustParseAddr("93.184.216.35"), Port: 443, Proto: netpolicy.ProtoTCP},
	}}
	revoke := api.PolicyUpdate{Revoke: []string{"a.example.com"}}
	if _, err := w.d.UpdatePolicy(context.Background(), "f1", revoke, false); err != nil {
		t.Fatal(err)
	}
	if n := len(w.fw.lastUpdate.Stale); n != 0 {
		t.Fatalf("the proxy forgot nothing, yet the update counted %d kernel elements stale", n)
	}
	w.dns.forgotten = true
	if _, err := w.d.UpdatePolicy(context.Background(), "f1", api.PolicyUpdate{Revoke: []string{"b.example.com"}}, false); err != nil {
		t.Fatal(err)
	}
	want := []netpolicy.Attestation{
		{Addrs: []netip.Addr{netip.MustParseAddr("93.184.216.34")}},
		{Addrs: []netip.Addr{netip.MustParseAddr("93.184.216.35")}, Ports: []netpolicy.PortSpec{{Port: 443, Proto: netpolicy.ProtoTCP}}},
	}
	if got := w.fw.lastUpdate.Stale; !reflect.DeepEqual(got, want) {
		t.Errorf("stale after a forgetful proxy: %+v, want every attested element %+v", got, want)
	}
}

// TestRevokeAbortsTheGuestsTCPSockets: the flows CutFlows cut are aborted
// on the guest's side too, in the session's own netns, TCP only (a UDP
// socket has nothing to wait for); with KeepEstablished nothing is cut or
// aborted.
func TestRevokeAbortsTheGuestsTCPSockets(t *testing.T) {
	w := newWorld(t)
	info := w.create(api.CreateRequest{Name: "a1", NetworkOnly: true, Allow: []string{"93.184.216.7", "93.184.216.8"}})
	guest := netip.MustParseAddr(info.GuestIP)
	w.fw.cut = []nft.CutFlow{
		{Proto: unix.IPPROTO_TCP, Src: netip.AddrPortFrom(guest, 40000), Dst: netip.MustParseAddrPort("93.184.216.7:443")},
		{Proto: unix.IPPROTO_UDP, Src: netip.AddrPortFrom(guest, 40001), Dst: netip.MustParseAddrPort("93.184.216.7:443")},
	}
	if _, err := w.d.UpdatePolicy(context.Background(), "a1", api.PolicyUpdate{Revoke: []string{"93.184.216.8"}, KeepEstablished: true}, false); err != nil {
		t.Fatal(err)
	}
	if len(w.nets.aborted) != 0 {
		t.Fatalf("keep-established aborted %v", w.nets.aborted)
	}
	if _, err := w.d.UpdatePolicy(context.Background(), "a1", api.PolicyUpdate{Revoke: []string{"93.184.216.7"}}, false); err != nil {
		t.Fatal(err)
	}
	want := []string{w.nets.netns["a1"].NetnsPath + " " + guest.String() + ":40000 -> 93.184.216.7:443"}
	if !slices.Equal(w.nets.aborted, want) {
		t.Errorf("aborted %q, want %q", w.nets.aborted, want)
	}
}

// TestOnDenyDefaultAndOldRecords: a create without on_deny records reject
// (the default) and a replacing update likewise; a record written before
// the default existed (no on_deny) still builds a silent drop, and so
// does egress none.
func TestOnDenyDefaultAndOldRecords(t *testing.T) {
	w := newWorld(t)
	info := w.create(api.CreateRequest{Name: "d1", NetworkOnly: true, Allow: []string{"93.184.216.7"}})
	if info.Policy.OnDeny != "reject" {
		t.Errorf("created without on_deny: %q, want reject", info.Policy.OnDeny)
	}
	if r := w.fw.rules[netip.MustParseAddr(info.GuestIP)]; r.OnDeny != netpolicy.DenyReject {
		t.Errorf("created without on_deny: the rules say %v, want reject", r.OnDeny)
	}
	info, err := w.d.UpdatePolicy(context.Background(), "d1", api.PolicyUpdate{OnDeny: "reset"}, false)
	if err != nil || info.Policy.OnDeny != "reset" {
		t.Fatalf("update on_deny reset: %q, %v", info.Policy.OnDeny, err)
	}
	info, err = w.d.UpdatePolicy(context.Background(), "d1", api.PolicyUpdate{Allow: []string{"93.184.216.7"}}, true)
	if err != nil || info.Policy.OnDeny != "reject" {
		t.Fatalf("replace without on_deny: %q, %v, want reject", info.Policy.OnDeny, err)
	}
	p, err := w.d.buildPolicy(api.CreateRequest{Name: "old", Allow: []string{"93.184.216.7"}})
	if err != nil || p.OnDeny != netpolicy.DenyDrop {
		t.Errorf("a record without on_deny: %v, %v, want drop", p.OnDeny, err)
	}
	none := w.create(api.CreateRequest{Name: "n1", NetworkOnly: true})
	if none.Policy.OnDeny != "drop" {
		t.Errorf("egress none: on_deny %q, want drop", none.Policy.OnDeny)
	}
	if _, err := w.d.Create(context.Background(), api.CreateRequest{Name: "n2", NetworkOnly: true, OnDeny: "reset"}); err == nil {
		t.Error("egress none with on_deny reset: created, want refused")
	}
	if _, err := w.d.Create(context.Background(), api.CreateRequest{Name: "n3", NetworkOnly: true, Allow: []string{"93.184.216.7"}, OnDeny: "loud"}); err == nil || !strings.Contains(err.Error(), `"loud"`) {
		t.Errorf("on_deny loud: %v, want refused naming it", err)
	}
}

func (w *world) create(req api.CreateRequest) api.SessionInfo {
	w.t.Helper()
	info, err := w.d.Create(context.Background(), req)
	if err != nil {
		w.t.Fatalf("create %s: %v", req.Name, err)
	}
	return info
}

// TestOnDenyOldRecordStaysDropAcrossRestart: a record written before
// reject became the default (its request has no on_deny) is adopted at
// the next start as a silent drop: the rules the daemon gives the
// firewall and inspect both say drop.
func TestOnDenyOldRecordStaysDropAcrossRestart(t *testing.T) {
	w := newWorld(t)
	info := w.create(api.CreateRequest{Name: "old1", NetworkOnly: true, Allow: []string{"93.184.216.7"}})
	path := filepath.Join(w.stateDir, "sessions", "old1.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	req := rec["request"].(map[string]any)
	if req["on_deny"] != "reject" {
		t.Fatalf("a new record's request: on_deny %v, want reject written out", req["on_deny"])
	}
	delete(req, "on_deny")
	if raw, err = json.Marshal(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	w.restart(nil)
	got, err := w.d.Inspect("old1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Policy.OnDeny != "drop" {
		t.Errorf("adopted record without on_deny: inspect says %q, want drop", got.Policy.OnDeny)
	}
	if r := w.fw.rules[netip.MustParseAddr(info.GuestIP)]; r.OnDeny != netpolicy.DenyDrop {
		t.Errorf("adopted record without on_deny: the rules say %v, want drop", r.OnDeny)
	}
}
