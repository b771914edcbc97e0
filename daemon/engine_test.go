package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/daemon/metrics"
)

// TestValidateRequestRootfs: without --images-dir every rootfs is refused
// (a 400 naming the value and the option); the refusal is a bad request.
func TestValidateRequestRootfs(t *testing.T) {
	img := t.TempDir()
	if err := os.Mkdir(filepath.Join(img, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	e := &Engine{}
	for _, tc := range []struct{ rootfs, want string }{
		{img, `rootfs "` + img + `": no image directory is configured; the operator must start serve with --images-dir DIR to allow sandboxes`},
		{"/", `rootfs "/": no image directory is configured; the operator must start serve with --images-dir DIR to allow sandboxes`},
		{"rel", `rootfs "rel": want an absolute directory`},
		{"/nonexistent", `rootfs "/nonexistent": no image directory is configured; the operator must start serve with --images-dir DIR to allow sandboxes`},
	} {
		req := api.CreateRequest{Name: "s1", Rootfs: tc.rootfs}
		err := e.validateRequest(&req)
		if err == nil || err.Error() != tc.want || !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("rootfs %q: %v, want a bad request %q", tc.rootfs, err, tc.want)
		}
	}
	req := api.CreateRequest{Name: "s1", NetworkOnly: true, CPUs: 1e6}
	if err := e.validateRequest(&req); err == nil || !errors.Is(err, api.ErrBadRequest) {
		t.Errorf("cpus 1e6: %v, want a bad request", err)
	}
}

// TestValidateRequestSandboxResources: a sandbox limit the container layer
// would refuse is a bad request with its text, before anything is made.
func TestValidateRequestSandboxResources(t *testing.T) {
	images, img := testImage(t) // a root-owned image as any user
	e := &Engine{cfg: Config{ImagesDirs: []string{images}}}
	for _, tc := range []struct {
		req  api.CreateRequest
		want string
	}{
		{api.CreateRequest{MemoryBytes: 1 << 20}, "memory 1048576 bytes: want at least 4 MiB (4194304 bytes); leave it out for the default 512 MiB"},
		{api.CreateRequest{Pids: 2}, "pids 2: want at least 4; leave it out for the default 1024"},
		{api.CreateRequest{CPUs: 1e6}, fmt.Sprintf("cpus 1e+06: want 0.01 to %d (the CPUs of this machine); leave it out for the default 1", runtime.NumCPU())},
	} {
		req := tc.req
		req.Name, req.Rootfs = "s1", img
		err := e.validateRequest(&req)
		if err == nil || err.Error() != tc.want || !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("%+v: %v, want a bad request %q", tc.req, err, tc.want)
		}
	}
	req := api.CreateRequest{Name: "s1", Rootfs: img, MemoryBytes: 4 << 20, Pids: 4, CPUs: 0.5}
	if err := e.validateRequest(&req); err != nil {
		t.Errorf("the smallest limits: %v", err)
	}
}

// TestValidateRequestNetworkOnlySandboxFields: the daemon refuses what the
// CLI refuses, for API callers: a 400 naming the field and the flag.
func TestValidateRequestNetworkOnlySandboxFields(t *testing.T) {
	e := &Engine{}
	for _, tc := range []struct {
		req         api.CreateRequest
		field, flag string
	}{
		{api.CreateRequest{MemoryBytes: 1 << 30}, "memory_bytes", "--memory"},
		{api.CreateRequest{Pids: 10}, "pids", "--pids"},
		{api.CreateRequest{CPUs: 0.5}, "cpus", "--cpus"},
		{api.CreateRequest{NetRaw: true}, "net_raw", "--net-raw"},
		{api.CreateRequest{Writable: true}, "writable", "--writable"},
	} {
		req := tc.req
		req.Name, req.NetworkOnly = "s1", true
		err := e.validateRequest(&req)
		want := tc.field + " (" + tc.flag + ") has no effect with network_only (--network-only): there is no sandbox; leave it out"
		if err == nil || err.Error() != want || !errors.Is(err, api.ErrBadRequest) {
			t.Errorf("%+v: %v, want a bad request %q", tc.req, err, want)
		}
	}
	req := api.CreateRequest{Name: "s1", NetworkOnly: true}
	if err := e.validateRequest(&req); err != nil {
		t.Errorf("plain --network-only: %v", err)
	}
}

// TestSummaryShowsWhatTheSessionHolds: inspect and create --json show the
// sandbox's limits with the defaults filled in, its capabilities and root,
// and the resolver of a session with a NIC; a --network-only session shows
// no sandbox fields at all.
func TestSummaryShowsWhatTheSessionHolds(t *testing.T) {
	e := &Engine{dnsAddr: netip.MustParseAddr("10.20.255.254")}
	render := func(rec SessionRecord) map[string]any {
		t.Helper()
		b, err := json.Marshal(e.summary(&liveSession{rec: rec}))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	check := func(what string, got map[string]any, want map[string]any, absent ...string) {
		t.Helper()
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %s = %v (%T), want %v", what, k, got[k], got[k], v)
			}
		}
		for _, k := range absent {
			if v, ok := got[k]; ok {
				t.Errorf("%s: %s = %v, want it absent", what, k, v)
			}
		}
	}
	guest := netip.MustParseAddr("10.20.0.2")
	check("defaults", render(SessionRecord{Name: "a", Slot: 0, Guest: guest, Sandbox: true}), map[string]any{
		"memory_bytes": float64(512 << 20), "pids": float64(1024), "cpus": float64(1),
		"net_raw": false, "writable": false, "dns": "10.20.255.254",
	})
	check("given", render(SessionRecord{Name: "b", Slot: 1, Guest: guest, Sandbox: true, Request: api.CreateRequest{
		MemoryBytes: 1 << 30, Pids: 50, CPUs: 1.5, NetRaw: true, Writable: true,
	}}), map[string]any{
		"memory_bytes": float64(1 << 30), "pids": float64(50), "cpus": 1.5,
		"net_raw": true, "writable": true, "dns": "10.20.255.254",
	})
	check("no NIC", render(SessionRecord{Name: "c", Slot: -1, Sandbox: true}), map[string]any{"pids": float64(1024)}, "dns")
	check("network-only", render(SessionRecord{Name: "d", Slot: 2, Guest: guest, Request: api.CreateRequest{NetworkOnly: true}}),
		map[string]any{"dns": "10.20.255.254"}, "memory_bytes", "pids", "cpus", "net_raw", "writable")
}

// TestBusyIsNotNameTaken: an operation on a session while another on it is
// in flight is refused with api.ErrBusy (code busy), which a client can
// retry, not api.ErrNameTaken; the create metric counts it as busy.
func TestBusyIsNotNameTaken(t *testing.T) {
	w := newWorld(t)
	w.d.metrics = metrics.New("test", "")
	if _, err := w.d.reserve("b1", false); err != nil {
		t.Fatal(err)
	}
	_, err := w.d.Create(context.Background(), api.CreateRequest{Name: "b1", NetworkOnly: true})
	if !errors.Is(err, api.ErrBusy) || errors.Is(err, api.ErrNameTaken) || api.CodeOf(err) != api.CodeBusy {
		t.Errorf("create during another operation on the name: %v (code %s), want api.ErrBusy only", err, api.CodeOf(err))
	}
	var scrape strings.Builder
	if err := w.d.metrics.WriteText(&scrape); err != nil {
		t.Fatal(err)
	}
	if line := `enforcerd_session_create_failures_total{reason="busy"} 1`; !strings.Contains(scrape.String(), line) {
		t.Errorf("the scrape has no %s:\n%s", line, scrape.String())
	}
	w.d.release("b1")
	if _, err := w.d.Create(context.Background(), api.CreateRequest{Name: "b1", NetworkOnly: true}); err != nil {
		t.Errorf("create once the name is released: %v", err)
	}
	if _, err := w.d.Create(context.Background(), api.CreateRequest{Name: "b1", NetworkOnly: true}); !errors.Is(err, api.ErrNameTaken) || errors.Is(err, api.ErrBusy) {
		t.Errorf("create of an existing name: %v, want api.ErrNameTaken only", err)
	}
}
