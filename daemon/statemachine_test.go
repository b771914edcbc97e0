package daemon

// The engine tested as a state machine, without root: sequences of steps
// (create, delete, delete by label, restart, a fault injected at a step, a
// crash at a point) run against the recording fakes of fakes_test.go, in
// order and in seeded shuffles. After every step the whole world (netns,
// rules, DNS registrations, sandboxes, state records) is rendered as text
// and compared with what a small model of the sessions says it must be
// (tailscale's TestRouterStates is the model for this test).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

var (
	smPool    = netip.MustParsePrefix("10.20.0.0/24")
	smDNSAddr = netip.MustParseAddr("10.20.0.254")
	smPinned  = map[string][]netip.Addr{"example.com": {netip.MustParseAddr("93.184.216.34")}}
)

const smPrefix = "sm"

// world is the daemon over the fakes, and what survives its restarts: the
// fakes of the kernel and the container runtime, and the state directory.
type world struct {
	t        *testing.T
	stateDir string
	images   string // the image directory granted to sandboxes
	image    string // the rootfs of every sandbox session
	in       *injector
	nets     *fakeNetwork
	fw       *fakeFirewall
	boxes    *fakeSandboxes
	dns      *fakeResolver // the running daemon's (a restart gets a new one)
	d        *Engine

	eventsSkew atomic.Int64 // how far the persisted events' clock is ahead (restartPersisted)
}

func newWorld(t *testing.T) *world {
	t.Helper()
	in := newInjector()
	w := &world{
		t: t, stateDir: t.TempDir(), in: in,
		nets:  &fakeNetwork{in: in, prefix: smPrefix, pool: smPool, netns: map[string]nsmgr.Session{}},
		fw:    &fakeFirewall{in: in, rules: map[netip.Addr]nft.SessionRules{}},
		boxes: &fakeSandboxes{in: in, boxes: map[string]container.Spec{}},
	}
	w.images, w.image = testImage(t)
	w.restart(nil)
	return w
}

// testImage returns an image directory and an image in it that
// container.ResolveImage grants: as root, a temp directory with a bin
// subdirectory; otherwise /usr under /, the only directories a non-root
// test can count on being root's (the fakes never look inside).
func testImage(t *testing.T) (dir, image string) {
	if os.Geteuid() != 0 {
		return "/", "/usr"
	}
	dir = t.TempDir()
	image = filepath.Join(dir, "img")
	if err := os.MkdirAll(filepath.Join(image, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, image
}

// restart is a new daemon process over the same kernel and state
// directory: a new DNS proxy, a new daemon, Reconcile. overrides are the
// public overrides of its guard.
func (w *world) restart(overrides []netip.Prefix) {
	w.t.Helper()
	w.in.disarm()
	guard, err := netpolicy.NewGuard(smPool, overrides)
	if err != nil {
		w.t.Fatal(err)
	}
	store, err := NewStateStore(w.stateDir)
	if err != nil {
		w.t.Fatal(err)
	}
	w.dns = &fakeResolver{in: w.in, reg: map[netip.Addr]dnsproxy.SessionPolicy{}}
	cfg := Config{StateDir: w.stateDir, NamePrefix: smPrefix, Pool: smPool, ImagesDirs: []string{w.images}, PublicOverrides: overrides}
	w.d = New(cfg, Parts{
		Network: w.nets, Firewall: w.fw, Resolver: w.dns, Sandboxes: w.boxes,
		Guard: guard, Pin: fakePin, DNSAddr: smDNSAddr, Store: store,
	})
	if err := w.d.Reconcile(); err != nil {
		w.t.Fatalf("reconcile: %v", err)
	}
}

func fakePin(_ context.Context, host string) ([]netip.Addr, error) {
	if as, ok := smPinned[host]; ok {
		return as, nil
	}
	return nil, fmt.Errorf("no such host")
}

// render is the whole world, one sorted line per object.
func (w *world) render() []string {
	w.t.Helper()
	var lines []string
	lines = append(lines, w.nets.render()...)
	lines = append(lines, w.fw.render()...)
	lines = append(lines, w.dns.render()...)
	lines = append(lines, w.boxes.render()...)
	lines = append(lines, w.records()...)
	sort.Strings(lines)
	return lines
}

// records renders the state directory without touching it (LoadAll would
// remove temp files and quarantine bad records).
func (w *world) records() []string {
	dir := filepath.Join(w.stateDir, "sessions")
	entries, err := os.ReadDir(dir)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), spareRecordPrefix) && e.Type().IsRegular() {
			continue // a removed record's file kept for the next Save (StateStore.spare): no record
		}
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !e.Type().IsRegular() {
			out = append(out, "file "+e.Name())
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			w.t.Fatal(err)
		}
		var rec SessionRecord
		if err := json.Unmarshal(data, &rec); err != nil || rec.Name != name {
			out = append(out, "file "+e.Name())
			continue
		}
		var peers []string
		for _, p := range rec.Peers {
			peers = append(peers, p.Name)
		}
		out = append(out, recordLine(rec.Name, rec.Slot, rec.Guest, rec.Sandbox, rec.Request.Labels, peers))
	}
	return out
}

func recordLine(name string, slot int, guest netip.Addr, sandbox bool, labels map[string]string, peers []string) string {
	line := "record " + name + " no nic"
	if slot >= 0 {
		line = fmt.Sprintf("record %s slot %d guest %s", name, slot, guest)
	}
	if sandbox {
		line += " sandbox"
	}
	if len(labels) > 0 {
		var kv []string
		for k, v := range labels {
			kv = append(kv, k+"="+v)
		}
		sort.Strings(kv)
		line += " labels " + strings.Join(kv, ",")
	}
	if len(peers) > 0 {
		line += " peers " + strings.Join(peers, ",")
	}
	return line
}

// crashes runs f and returns where it crashed ("" when it did not).
func crashes(f func()) (at string) {
	defer func() {
		if r := recover(); r != nil {
			c, ok := r.(crashed)
			if !ok {
				panic(r)
			}
			at = c.at
		}
	}()
	f()
	return ""
}

// spec is a session as the test asks for it.
type spec struct {
	name    string
	egress  string
	allow   []string
	lab     bool
	peers   []string
	pin     bool
	sandbox bool
	labels  map[string]string
}

func (s spec) mode() netpolicy.Mode {
	switch {
	case s.egress != "":
		return netpolicy.Mode(s.egress)
	case len(s.allow) > 0 || len(s.peers) > 0 || s.lab:
		return netpolicy.ModeAllowlist
	}
	return netpolicy.ModeNone
}

func (s spec) nic() bool { return s.mode() != netpolicy.ModeNone }

func (s spec) request(image string) api.CreateRequest {
	req := api.CreateRequest{
		Name: s.name, Egress: s.egress, Allow: s.allow, Lab: s.lab, LabPeers: s.peers,
		Pin: s.pin, NetworkOnly: !s.sandbox, Labels: s.labels,
	}
	if s.sandbox {
		req.Rootfs = image
	}
	return req
}

// createCalls are the mutating calls a create of s makes, in order (the
// record is saved after them).
func (s spec) createCalls() []string {
	calls := []string{callNetsCreate}
	if s.nic() {
		calls = append(calls, callFwAdd, callDNSRegister)
	}
	if s.sandbox {
		calls = append(calls, callBoxesCreate)
	}
	return calls
}

// deleteCalls are the mutating calls a delete of s makes, in order (the
// record is removed after them).
func (s spec) deleteCalls() []string {
	var calls []string
	if s.sandbox {
		calls = append(calls, callBoxesDestroy)
	}
	if s.nic() {
		calls = append(calls, callDNSUnregister, callFwRemove)
	}
	return append(calls, callNetsDelete)
}

// crashPoints are the points between every two steps of calls: before
// each, and after the last.
func crashPoints(calls []string) []crashPoint {
	var out []crashPoint
	for _, c := range calls {
		out = append(out, crashPoint{method: c, n: 1})
	}
	return append(out, crashPoint{method: calls[len(calls)-1], n: 1, after: true})
}

// stepErrPrefix is how Create's error names the step that failed.
func stepErrPrefix(call, name string) string {
	switch call {
	case callNetsCreate:
		return "create network of " + name + ": "
	case callFwAdd:
		return "add rules of " + name + ": "
	case callDNSRegister:
		return "register " + name + " with the dns proxy: "
	case callBoxesCreate:
		return "start sandbox of " + name + ": "
	case callStateSave:
		return "save record of " + name + ": "
	}
	panic("no create step " + call)
}

// The model: which sessions live, on which slot, and which lab targets
// their rules still point at.
type model struct {
	sessions map[string]*modelSession
}

type modelSession struct {
	spec     spec
	slot     int      // -1: no NIC
	peers    []string // the lab targets its rules point at
	recPeers []string // the lab targets its record names
}

func newModel() *model { return &model{sessions: map[string]*modelSession{}} }

// createErr is the error a create of s must fail with before it changes
// anything (nil: it goes ahead).
func (m *model) createErr(s spec) error {
	if _, ok := m.sessions[s.name]; ok {
		return api.ErrNameTaken
	}
	for _, p := range s.peers {
		if t, ok := m.sessions[p]; !ok || !t.spec.lab {
			return api.ErrBadRequest
		}
	}
	return nil
}

func (m *model) create(s spec) {
	ms := &modelSession{spec: s, slot: -1, peers: slices.Clone(s.peers), recPeers: slices.Clone(s.peers)}
	if s.nic() {
		used := map[int]bool{}
		for _, o := range m.sessions {
			used[o.slot] = true
		}
		for ms.slot = 0; used[ms.slot]; ms.slot++ {
		}
	}
	m.sessions[s.name] = ms
}

func (m *model) remove(name string) {
	delete(m.sessions, name)
	for _, o := range m.sessions {
		o.peers = slices.DeleteFunc(o.peers, func(p string) bool { return p == name })
	}
}

func (m *model) labelled(key, value string) []string {
	var out []string
	for name, s := range m.sessions {
		if v, ok := s.spec.labels[key]; ok && v == value {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// render is the world the model says the fakes hold.
func (m *model) render() []string {
	var lines []string
	for name, s := range m.sessions {
		sp := s.spec
		gw, guest := slotAddrs(smPool, s.slot)
		var pinned map[string][]netip.Addr
		if sp.pin {
			pinned = smPinned
		}
		if s.slot < 0 {
			lines = append(lines, "netns "+name+" no nic")
			guest = netip.Addr{}
		} else {
			iface := fmt.Sprintf("%s%dh", smPrefix, s.slot)
			lines = append(lines, fmt.Sprintf("netns %s slot %d iface %s gateway %s guest %s", name, s.slot, iface, gw, guest))
			rules := fmt.Sprintf("rules %s %s iface %s egress %s", guest, name, iface, sp.mode())
			var static []string
			for _, a := range sp.allow {
				if p, err := netip.ParsePrefix(a); err == nil {
					static = append(static, p.String())
				}
			}
			for _, as := range pinned {
				for _, a := range as {
					static = append(static, netip.PrefixFrom(a, 32).String())
				}
			}
			if len(static) > 0 {
				sort.Strings(static)
				rules += " static " + strings.Join(static, ",")
			}
			var peers []netip.Addr
			for _, p := range s.peers {
				_, g := slotAddrs(smPool, m.sessions[p].slot)
				peers = append(peers, g)
			}
			if len(peers) > 0 {
				rules += " peers " + addrsString(peers)
			}
			lines = append(lines, rules)
			dns := fmt.Sprintf("dns %s %s %s", guest, name, sp.mode())
			if len(sp.allow) > 0 {
				allow := slices.Clone(sp.allow)
				sort.Strings(allow)
				dns += " allow " + strings.Join(allow, ",")
			}
			if pinned != nil {
				dns += " pinned " + pinnedString(pinned)
			}
			lines = append(lines, dns)
		}
		if sp.sandbox {
			dns := "none"
			if s.slot >= 0 {
				dns = smDNSAddr.String()
			}
			box := fmt.Sprintf("box %s netns /run/netns/%s-%s dns %s", name, smPrefix, name, dns)
			if pinned != nil {
				box += " hosts " + pinnedString(pinned)
			}
			lines = append(lines, box)
		}
		lines = append(lines, recordLine(name, s.slot, guest, sp.sandbox, sp.labels, s.recPeers))
	}
	sort.Strings(lines)
	return lines
}

// step is one transition of a sequence.
type step struct {
	op         string // one of the op constants
	spec       spec   // create, fault, crash-create
	name       string // delete, crash-delete
	key, value string // label
	call       string // fault: the create's call that fails
	crash      crashPoint
}

const (
	opCreate      = "create"
	opDelete      = "delete"
	opLabel       = "delete-by-label"
	opRestart     = "restart"
	opFault       = "fault"
	opCrashCreate = "crash-create"
	opCrashDelete = "crash-delete"
)

func (st step) String() string {
	switch st.op {
	case opCreate:
		return "create " + st.spec.name
	case opDelete:
		return "delete " + st.name
	case opLabel:
		return "delete label " + st.key + "=" + st.value
	case opFault:
		return "create " + st.spec.name + " failing at " + st.call
	case opCrashCreate:
		return "create " + st.spec.name + " crashing " + st.crash.String()
	case opCrashDelete:
		return "delete " + st.name + " crashing " + st.crash.String()
	}
	return st.op
}

// apply runs one step against the daemon and the model and checks the
// result, then the whole world.
func (w *world) apply(m *model, st step) {
	t := w.t
	t.Helper()
	ctx := context.Background()
	switch st.op {
	case opCreate:
		want := m.createErr(st.spec)
		_, err := w.d.Create(ctx, st.spec.request(w.image))
		if !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Fatalf("%s: %v, want %v", st, err, want)
		}
		if want == nil {
			m.create(st.spec)
		}
	case opDelete:
		var want error
		if _, ok := m.sessions[st.name]; !ok {
			want = api.ErrNotFound
		}
		err := w.d.Delete(ctx, st.name)
		if !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Fatalf("%s: %v, want %v", st, err, want)
		}
		if want == nil {
			m.remove(st.name)
		}
	case opLabel:
		want := m.labelled(st.key, st.value)
		got, err := w.d.DeleteByLabel(ctx, st.key, st.value)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("%s: deleted %v, %v; want %v", st, got, err, want)
		}
		for _, n := range want {
			m.remove(n)
		}
	case opRestart:
		w.restart(nil)
	case opFault:
		w.applyFault(m, st)
	case opCrashCreate:
		w.applyCrashCreate(m, st)
	case opCrashDelete:
		w.applyCrashDelete(m, st)
	default:
		t.Fatalf("unknown step %q", st.op)
	}
	w.compare(st.String(), m.render())
}

// applyFault: a create whose step fails leaves the world as it was, and
// its error names the step.
func (w *world) applyFault(m *model, st step) {
	t := w.t
	t.Helper()
	want := m.createErr(st.spec)
	if want == nil && st.call == callStateSave {
		// A directory where the record goes: the rename of the written
		// temp file onto it fails, as a full or read-only disk would.
		obstacle := filepath.Join(w.stateDir, "sessions", st.spec.name+".json")
		if err := os.MkdirAll(filepath.Join(obstacle, "x"), 0o700); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(obstacle)
	}
	w.in.arm(map[string]int{st.call: 1}, crashPoint{})
	_, err := w.d.Create(context.Background(), st.spec.request(w.image))
	w.in.disarm()
	switch {
	case want != nil:
		if !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", st, err, want)
		}
	case err == nil:
		t.Fatalf("%s: succeeded", st)
	case !strings.HasPrefix(err.Error(), stepErrPrefix(st.call, st.spec.name)) || strings.Contains(err.Error(), "undo"):
		t.Fatalf("%s: %q, want it to begin %q with no failed undo", st, err, stepErrPrefix(st.call, st.spec.name))
	case st.call != callStateSave && !errors.Is(err, errInjected):
		t.Fatalf("%s: %v does not wrap the injected fault", st, err)
	}
}

// applyCrashCreate: the process dies in the middle of a create; after a
// restart the create is gone without a trace (the record is written last).
func (w *world) applyCrashCreate(m *model, st step) {
	t := w.t
	t.Helper()
	want := m.createErr(st.spec)
	var err error
	w.in.arm(nil, st.crash)
	at := crashes(func() { _, err = w.d.Create(context.Background(), st.spec.request(w.image)) })
	w.in.disarm()
	switch {
	case want != nil && (at != "" || !errors.Is(err, want)):
		t.Fatalf("%s: crashed %q, %v; want %v", st, at, err, want)
	case want == nil && at != st.crash.String():
		t.Fatalf("%s: crashed at %q (%v), want %q", st, at, err, st.crash)
	}
	if want == nil && st.crash.after && st.crash.method == st.spec.createCalls()[len(st.spec.createCalls())-1] {
		// Crashed in the middle of the record's atomic write: only the
		// temp file exists, and the restart removes it.
		tmp := filepath.Join(w.stateDir, "sessions", "."+st.spec.name+".json.tmp-1")
		if err := os.WriteFile(tmp, []byte(`{"version":1,"na`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	w.restart(nil)
}

// applyCrashDelete: the process dies in the middle of a delete. After a
// restart the session is fully adopted when nothing of the kernel's was
// removed yet (the DNS registration lives in the process, and the restart
// makes it again), and otherwise reaped: nothing of it is left.
func (w *world) applyCrashDelete(m *model, st step) {
	t := w.t
	t.Helper()
	s, ok := m.sessions[st.name]
	var err error
	w.in.arm(nil, st.crash)
	at := crashes(func() { err = w.d.Delete(context.Background(), st.name) })
	w.in.disarm()
	if !ok {
		if at != "" || !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("%s: crashed %q, %v; want not found", st, at, err)
		}
		w.restart(nil)
		return
	}
	if at != st.crash.String() {
		t.Fatalf("%s: crashed at %q (%v), want %q", st, at, err, st.crash)
	}
	calls := s.spec.deleteCalls()
	done := slices.Index(calls, st.crash.method)
	if st.crash.after {
		done++
	}
	reaped := slices.ContainsFunc(calls[:done], func(c string) bool { return c != callDNSUnregister })
	w.restart(nil)
	_, err = w.d.Inspect(st.name)
	if reaped {
		if !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("%s: the restart kept the session (%v), want it reaped", st, err)
		}
		m.remove(st.name)
	} else if err != nil {
		t.Fatalf("%s: the restart did not adopt the intact session: %v", st, err)
	}
}

func (w *world) compare(after string, want []string) {
	w.t.Helper()
	got := w.render()
	if slices.Equal(got, want) {
		return
	}
	var diff []string
	for _, l := range want {
		if !slices.Contains(got, l) {
			diff = append(diff, "- "+l)
		}
	}
	for _, l := range got {
		if !slices.Contains(want, l) {
			diff = append(diff, "+ "+l)
		}
	}
	w.t.Fatalf("after %s, the world differs from the model (- want, + got):\n%s\nwhole world:\n%s",
		after, strings.Join(diff, "\n"), strings.Join(got, "\n"))
}

func slotAddrs(pool netip.Prefix, slot int) (gw, guest netip.Addr) {
	if slot < 0 {
		return netip.Addr{}, netip.Addr{}
	}
	base := pool.Addr()
	for range slot * 4 {
		base = base.Next()
	}
	return base.Next(), base.Next().Next()
}

// The sessions of the sequences: one of each kind.
var (
	smNone    = spec{name: "n"}
	smAllow   = spec{name: "a", allow: []string{"example.com", "8.8.8.0/24"}, labels: map[string]string{"team": "red"}}
	smPublic  = spec{name: "p", egress: "public", labels: map[string]string{"team": "red"}}
	smBox     = spec{name: "s", sandbox: true, allow: []string{"example.com"}, labels: map[string]string{"team": "blue"}}
	smBoxNone = spec{name: "z", sandbox: true, labels: map[string]string{"team": ""}}
	smPin     = spec{name: "k", sandbox: true, allow: []string{"example.com"}, pin: true}
	smLab     = spec{name: "l", lab: true}
	smPeer    = spec{name: "q", peers: []string{"l"}, allow: []string{"example.com"}}

	smAll = []spec{smNone, smAllow, smPublic, smBox, smBoxNone, smPin, smLab, smPeer}
)

func create(s spec) step     { return step{op: opCreate, spec: s} }
func del(name string) step   { return step{op: opDelete, name: name} }
func label(k, v string) step { return step{op: opLabel, key: k, value: v} }

var restart = step{op: opRestart}

func smSequences() map[string][]step {
	seqs := map[string][]step{}
	var all, delAll []step
	for _, s := range smAll {
		all = append(all, create(s))
		delAll = append(delAll, del(s.name))
	}
	seqs["create and delete every kind"] = append(slices.Clone(all), delAll...)
	seqs["restart adopts everything intact"] = append(append(slices.Clone(all), restart, del("a"), restart, del("l"), restart), delAll...)
	seqs["delete by label"] = []step{
		create(smAllow), create(smPublic), create(smBox), create(smNone), create(smBoxNone),
		label("team", "red"), create(smAllow), label("team", "blue"), label("team", ""), label("team", "red"), label("team", "red"),
		del("n"),
	}
	seqs["lab target deleted and its name reused"] = []step{
		create(smLab), create(smPeer), restart, del("l"), create(smLab), restart, del("q"), create(smPeer), restart, del("l"), del("q"),
	}

	var faults []step
	for _, s := range smAll {
		for _, c := range append(s.createCalls(), callStateSave) {
			faults = append(faults, step{op: opFault, spec: s, call: c})
		}
	}
	seqs["a fault at every step of create"] = append(append([]step{create(smLab), create(smPublic)}, faults...), del("l"), del("p"))

	var crashCreate []step
	for _, s := range smAll {
		for _, p := range crashPoints(s.createCalls()) {
			crashCreate = append(crashCreate, step{op: opCrashCreate, spec: s, crash: p})
		}
	}
	seqs["a crash at every point of create"] = append(append([]step{create(smLab), create(smBox)}, crashCreate...), del("l"), del("s"))

	var crashDelete []step
	for _, s := range smAll {
		for _, p := range crashPoints(s.deleteCalls()) {
			crashDelete = append(crashDelete, create(s), step{op: opCrashDelete, name: s.name, crash: p}, del(s.name))
		}
	}
	seqs["a crash at every point of delete"] = append(append([]step{create(smLab), create(smAllow)}, crashDelete...), del("l"), del("a"))
	return seqs
}

// TestEngineStates applies every sequence in order and in seeded shuffles
// (the model says what each step must do wherever it lands: a create of a
// live name fails, a peer before its lab target is refused, a delete of a
// gone session is not found), comparing the whole world after each step.
func TestEngineStates(t *testing.T) {
	for name, seq := range smSequences() {
		t.Run(name, func(t *testing.T) {
			for _, seed := range []uint64{0, 1, 2, 3} {
				order := "in order"
				steps := slices.Clone(seq)
				if seed > 0 {
					order = fmt.Sprintf("shuffled with seed %d", seed)
					r := rand.New(rand.NewPCG(seed, 0))
					r.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
				}
				t.Run(order, func(t *testing.T) {
					w := newWorld(t)
					m := newModel()
					for _, st := range steps {
						w.apply(m, st)
					}
				})
			}
		})
	}
}

// TestEngineCreateUndoFailureIsJoined: when a step fails and an undo fails
// too, the error is the step's joined with the undo's (one line once the
// API folds it, both findable with errors.Is), and what the undo left is
// reaped by the next start.
func TestEngineCreateUndoFailureIsJoined(t *testing.T) {
	w := newWorld(t)
	w.in.arm(map[string]int{callBoxesCreate: 1, callFwRemove: 1}, crashPoint{})
	_, err := w.d.Create(context.Background(), smBox.request(w.image))
	w.in.disarm()
	want := "start sandbox of s: injected fault in boxes.Create\nundo rules: injected fault in fw.RemoveSession"
	if err == nil || err.Error() != want {
		t.Fatalf("create = %q, want %q", err, want)
	}
	if !errors.Is(err, errInjected) {
		t.Fatalf("create = %v: the injected fault is not found", err)
	}
	if got, want := api.OneLine(err.Error()), "start sandbox of s: injected fault in boxes.Create undo rules: injected fault in fw.RemoveSession"; got != want {
		t.Fatalf("folded = %q, want %q", got, want)
	}
	// The other undos ran: only the rules the failed undo left remain.
	w.compare("the failed undo", []string{"rules 10.20.0.2 s iface sm0h egress allowlist"})
	w.restart(nil)
	w.compare("restart", nil)
}

// TestEngineRestartReapsWhatNoLongerValidates: a restart adopts the
// sessions whose records still hold and reaps, with all their objects, a
// session whose policy no longer validates (an allow entry in a range the
// operator no longer treats as public; an egress mode that does not
// parse) and one whose record does not load (quarantined as .bad).
func TestEngineRestartReapsWhatNoLongerValidates(t *testing.T) {
	w := newWorld(t)
	w.restart([]netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")})
	override := spec{name: "o", allow: []string{"198.51.100.0/24"}}
	bogus := spec{name: "b", sandbox: true, allow: []string{"example.com"}}
	corrupt := spec{name: "c", sandbox: true}
	m := newModel()
	for _, s := range []spec{smAllow, override, bogus, corrupt} {
		w.apply(m, create(s))
	}
	sessions := filepath.Join(w.stateDir, "sessions")
	data, err := os.ReadFile(filepath.Join(sessions, "b.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec SessionRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	rec.Request.Egress = "bogus"
	store, err := NewStateStore(w.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Save(rec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sessions, "c.json"), []byte(`{"version":1,"name":`), 0o600); err != nil {
		t.Fatal(err)
	}

	w.restart(nil)
	w.compare("restart", []string{
		"dns 10.20.0.2 a allowlist allow 8.8.8.0/24,example.com",
		"file c.json.bad",
		"netns a slot 0 iface sm0h gateway 10.20.0.1 guest 10.20.0.2",
		"record a slot 0 guest 10.20.0.2 labels team=red",
		"rules 10.20.0.2 a iface sm0h egress allowlist static 8.8.8.0/24",
	})
	for _, name := range []string{"o", "b", "c"} {
		if _, err := w.d.Inspect(name); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("inspect %s after the restart: %v, want not found", name, err)
		}
	}
	// The name is free again; the quarantined record stays for the operator.
	if _, err := w.d.Create(context.Background(), corrupt.request(w.image)); err != nil {
		t.Fatalf("create c again: %v", err)
	}
	w.compare("create c again", []string{
		"box c netns /run/netns/sm-c dns none",
		"dns 10.20.0.2 a allowlist allow 8.8.8.0/24,example.com",
		"file c.json.bad",
		"netns a slot 0 iface sm0h gateway 10.20.0.1 guest 10.20.0.2",
		"netns c no nic",
		"record a slot 0 guest 10.20.0.2 labels team=red",
		"record c no nic sandbox",
		"rules 10.20.0.2 a iface sm0h egress allowlist static 8.8.8.0/24",
	})
}

// TestEngineDeleteByLabelFault: a delete by label that fails on one
// session deletes the others, names the one that failed, and keeps it (its
// record and what its failed step did not remove) for a retry, which
// finishes it.
func TestEngineDeleteByLabelFault(t *testing.T) {
	w := newWorld(t)
	m := newModel()
	for _, s := range []spec{smAllow, smPublic, smNone} {
		w.apply(m, create(s))
	}
	w.in.arm(map[string]int{callNetsDelete: 2}, crashPoint{})
	deleted, err := w.d.DeleteByLabel(context.Background(), "team", "red")
	w.in.disarm()
	if want := "delete session p: delete network: injected fault in nets.Delete"; err == nil || err.Error() != want || !slices.Equal(deleted, []string{"a"}) {
		t.Fatalf("delete by label = %v, %q; want [a], %q", deleted, err, want)
	}
	if _, err := w.d.Inspect("p"); err != nil {
		t.Fatalf("inspect p after its failed delete: %v", err)
	}
	w.compare("the failed delete by label", []string{
		"netns n no nic",
		"netns p slot 1 iface sm1h gateway 10.20.0.5 guest 10.20.0.6",
		"record n no nic",
		"record p slot 1 guest 10.20.0.6 labels team=red",
	})
	if deleted, err := w.d.DeleteByLabel(context.Background(), "team", "red"); err != nil || !slices.Equal(deleted, []string{"p"}) {
		t.Fatalf("retry = %v, %v; want [p]", deleted, err)
	}
	w.compare("the retry", []string{"netns n no nic", "record n no nic"})
}
