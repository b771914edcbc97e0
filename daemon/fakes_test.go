package daemon

// Recording fakes of the daemon's four parts for the state-machine test.
// Each holds its state the way the kernel (or the container runtime, or
// the DNS proxy) would, and renders it as sorted text lines, so a test
// compares the whole world at once. A shared injector makes any mutating
// call fail (a fault: the method returns an error and changes nothing) or
// crash (a panic with a crashed value before or after the call's effect,
// which models the process dying there: the deferred undo of Create does
// not run, since its named error is still nil).

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// errInjected is every injected fault's error.
var errInjected = errors.New("injected fault")

// crashed is the panic value of an injected crash.
type crashed struct{ at string }

// The mutating calls, as the injector names them.
const (
	callNetsCreate    = "nets.Create"
	callNetsDelete    = "nets.Delete"
	callFwAdd         = "fw.AddSession"
	callFwRemove      = "fw.RemoveSession"
	callDNSRegister   = "dns.Register"
	callDNSUnregister = "dns.Unregister"
	callBoxesCreate   = "boxes.Create"
	callBoxesDestroy  = "boxes.Destroy"
	callStateSave     = "state.Save" // failed by the test through the state directory, not here
)

// crashPoint is where an armed injector panics: at the nth call of method,
// before or after the call has its effect.
type crashPoint struct {
	method string
	n      int
	after  bool
}

func (c crashPoint) String() string {
	if c.after {
		return "after " + c.method
	}
	return "before " + c.method
}

// injector counts the mutating calls since it was armed and fails or
// crashes the ones it was armed for.
type injector struct {
	calls  map[string]int
	faults map[string]int // method -> the call (from 1) that fails
	crash  crashPoint
}

func newInjector() *injector { return &injector{calls: map[string]int{}, faults: map[string]int{}} }

// arm resets the counts and sets what fails and where the process crashes.
func (in *injector) arm(faults map[string]int, crash crashPoint) {
	in.calls = map[string]int{}
	in.faults = faults
	if in.faults == nil {
		in.faults = map[string]int{}
	}
	in.crash = crash
}

func (in *injector) disarm() { in.arm(nil, crashPoint{}) }

// enter is called first by every mutating call: it crashes or fails it if
// armed to.
func (in *injector) enter(method string) error {
	in.calls[method]++
	n := in.calls[method]
	if in.crash.method == method && in.crash.n == n && !in.crash.after {
		panic(crashed{in.crash.String()})
	}
	if in.faults[method] == n {
		return fmt.Errorf("%w in %s", errInjected, method)
	}
	return nil
}

// leave is called by a mutating call once it had its effect.
func (in *injector) leave(method string) {
	if in.crash.method == method && in.crash.n == in.calls[method] && in.crash.after {
		panic(crashed{in.crash.String()})
	}
}

// fakeNetwork is nsmgr as the kernel holds it: a netns per name and, with
// a NIC, a slot of the pool (the lowest free one, so a name deleted and
// created again gets its old address back: the hardest case for peering).
type fakeNetwork struct {
	in     *injector
	prefix string
	pool   netip.Prefix
	netns  map[string]nsmgr.Session
	// aborted: "NETNS_PATH LOCAL -> REMOTE" per socket AbortTCP was given.
	aborted []string
}

func (f *fakeNetwork) slotAddrs(slot int) (gw, guest netip.Addr) {
	a := f.pool.Addr().As4()
	base := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	at := func(off uint32) netip.Addr {
		v := base + uint32(slot)*4 + off
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	return at(1), at(2)
}

func (f *fakeNetwork) slots() int { return 1<<(32-f.pool.Bits())/4 - 1 } // the last /30 is the DNS one

// CreateAlongside runs alongside after the network (the real one runs it
// concurrently; the order of the recorded calls stays the model's), and
// unwinds the network when it fails, as nsmgr does.
func (f *fakeNetwork) CreateAlongside(name string, nic bool, alongside func(nsmgr.Session) error) (nsmgr.Session, error) {
	s, err := f.create(name, nic)
	if err != nil || !nic || alongside == nil {
		return s, err
	}
	if err := alongside(s); err != nil {
		delete(f.netns, name)
		return nsmgr.Session{}, fmt.Errorf("create session %s: %w", name, err)
	}
	return s, nil
}

func (f *fakeNetwork) create(name string, nic bool) (nsmgr.Session, error) {
	if err := f.in.enter(callNetsCreate); err != nil {
		return nsmgr.Session{}, err
	}
	if _, ok := f.netns[name]; ok {
		return nsmgr.Session{}, fmt.Errorf("create session %s: session exists", name)
	}
	s := nsmgr.Session{Name: name, Netns: f.prefix + "-" + name, NetnsPath: "/run/netns/" + f.prefix + "-" + name, Slot: -1}
	if nic {
		used := map[int]bool{}
		for _, o := range f.netns {
			used[o.Slot] = true
		}
		s.Slot = -2
		for i := range f.slots() {
			if !used[i] {
				s.Slot = i
				break
			}
		}
		if s.Slot == -2 {
			return nsmgr.Session{}, &nsmgr.ExhaustedError{}
		}
		s.HostIface = fmt.Sprintf("%s%dh", f.prefix, s.Slot)
		s.Gateway, s.Guest = f.slotAddrs(s.Slot)
		s.Subnet = netip.PrefixFrom(s.Gateway, 30).Masked()
	}
	f.netns[name] = s
	f.in.leave(callNetsCreate)
	return s, nil
}

// Attach is Create with a NIC whose netns is the caller's.
func (f *fakeNetwork) Attach(name string, at nsmgr.Attachment) (nsmgr.Session, error) {
	s, err := f.create(name, true)
	if err != nil {
		return s, err
	}
	s.Netns, s.NetnsPath, s.Attached, s.IfName = at.NetnsPath, at.NetnsPath, true, at.IfName
	f.netns[name] = s
	return s, nil
}

func (f *fakeNetwork) Delete(name string, slot int) error {
	if err := f.in.enter(callNetsDelete); err != nil {
		return err
	}
	delete(f.netns, name) // not there: done
	f.in.leave(callNetsDelete)
	return nil
}

func (f *fakeNetwork) Recover() ([]nsmgr.Session, error) {
	var out []nsmgr.Session
	for _, s := range f.netns {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (f *fakeNetwork) Reap(keep map[string]bool) ([]string, error) {
	var gone []string
	for name, s := range f.netns {
		if !keep[name] {
			delete(f.netns, name)
			gone = append(gone, "netns "+s.Netns)
		}
	}
	sort.Strings(gone)
	return gone, nil
}

func (f *fakeNetwork) IsGuestAddr(a netip.Addr) bool {
	if !f.pool.Contains(a) {
		return false
	}
	for slot := range f.slots() {
		if _, guest := f.slotAddrs(slot); guest == a {
			return true
		}
	}
	return false
}

func (f *fakeNetwork) CheckDNSInterface() error { return nil }

func (f *fakeNetwork) StartPrepared() {}

func (f *fakeNetwork) render() []string {
	var out []string
	for _, s := range f.netns {
		if s.Slot < 0 {
			out = append(out, fmt.Sprintf("netns %s no nic", s.Name))
			continue
		}
		out = append(out, fmt.Sprintf("netns %s slot %d iface %s gateway %s guest %s", s.Name, s.Slot, s.HostIface, s.Gateway, s.Guest))
	}
	return out
}

// fakeFirewall is the host table: one session's rules per guest address.
// Removing a session also removes the peering elements of every session
// that pointed at it, as the real table's RemoveSession does.
type fakeFirewall struct {
	in    *injector
	rules map[netip.Addr]nft.SessionRules
	// attested is what Attested lists; lastUpdate the last UpdateSession's
	// argument.
	attested   map[netip.Addr][]nft.AttestedAddr
	lastUpdate nft.SessionUpdate
	// cut is what CutFlows says it cut.
	cut []nft.CutFlow
}

func (f *fakeFirewall) AddSession(r nft.SessionRules) error {
	if err := f.in.enter(callFwAdd); err != nil {
		return err
	}
	r.Static = slices.Clone(r.Static)
	r.Peers = slices.Clone(r.Peers)
	f.rules[r.Guest] = r // a re-apply replaces
	f.in.leave(callFwAdd)
	return nil
}

func (f *fakeFirewall) RemoveSession(r nft.SessionRules) error {
	if err := f.in.enter(callFwRemove); err != nil {
		return err
	}
	f.remove(r.Guest)
	f.in.leave(callFwRemove)
	return nil
}

func (f *fakeFirewall) remove(guest netip.Addr) {
	delete(f.rules, guest)
	for g, r := range f.rules {
		r.Peers = slices.DeleteFunc(r.Peers, func(p netip.Addr) bool { return p == guest })
		f.rules[g] = r
	}
}

func (f *fakeFirewall) Sessions() ([]nft.SessionKey, error) {
	var out []nft.SessionKey
	for _, r := range f.rules {
		out = append(out, nft.SessionKey{HostIface: r.HostIface, Guest: r.Guest})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Guest.Less(out[j].Guest) })
	return out, nil
}

func (f *fakeFirewall) PruneGuests(gone func(netip.Addr) bool) (int, error) {
	for g := range f.rules {
		if gone(g) {
			f.remove(g)
		}
	}
	return 0, nil
}

func (f *fakeFirewall) Attested(g netip.Addr) ([]nft.AttestedAddr, error) {
	return f.attested[g], nil
}
func (f *fakeFirewall) AllAttested() (map[netip.Addr][]nft.AttestedAddr, error) {
	return nil, nil
}
func (f *fakeFirewall) Counters(netip.Addr) (nft.Counters, error) {
	return nft.Counters{}, nil
}
func (f *fakeFirewall) AllCounters() (map[netip.Addr]nft.Counters, error) { return nil, nil }
func (f *fakeFirewall) Check() error                                      { return nil }
func (f *fakeFirewall) LimitUsage(netip.Addr, nft.SessionLimits) (nft.LimitUsage, error) {
	return nft.LimitUsage{}, nil
}

func (f *fakeFirewall) render() []string {
	var out []string
	for _, r := range f.rules {
		line := fmt.Sprintf("rules %s %s iface %s egress %s", r.Guest, r.Name, r.HostIface, r.Egress)
		if len(r.Static) > 0 {
			line += " static " + targetsString(r.Static)
		}
		if len(r.Peers) > 0 {
			line += " peers " + addrsString(r.Peers)
		}
		out = append(out, line)
	}
	return out
}

func targetsString(ts []netpolicy.Target) string {
	var out []string
	for _, t := range ts {
		s := t.Prefix.String()
		if t.Port != 0 {
			s += fmt.Sprintf(":%d/%s", t.Port, t.Proto)
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func addrsString(as []netip.Addr) string {
	out := addrStrings(as)
	sort.Strings(out)
	return strings.Join(out, ",")
}

// fakeResolver is the DNS proxy's registry. It lives in the daemon's
// process: a restart starts with an empty one.
type fakeResolver struct {
	in  *injector
	reg map[netip.Addr]dnsproxy.SessionPolicy
	// forgotten is what Update tells its apply.
	forgotten bool
}

func (f *fakeResolver) Register(p dnsproxy.SessionPolicy) error {
	if err := f.in.enter(callDNSRegister); err != nil {
		return err
	}
	f.reg[p.Guest] = p
	f.in.leave(callDNSRegister)
	return nil
}

func (f *fakeResolver) Unregister(guest netip.Addr) {
	_ = f.in.enter(callDNSUnregister) // it cannot fail; it can crash
	delete(f.reg, guest)
	f.in.leave(callDNSUnregister)
}

func (f *fakeResolver) Stats() dnsproxy.Stats { return dnsproxy.Stats{} }

func (f *fakeResolver) render() []string {
	var out []string
	for _, p := range f.reg {
		line := fmt.Sprintf("dns %s %s %s", p.Guest, p.Name, p.Mode)
		if len(p.Allow) > 0 {
			line += " allow " + strings.Join(entryStrings(p.Allow), ",")
		}
		if len(p.Pinned) > 0 {
			line += " pinned " + pinnedString(p.Pinned)
		}
		out = append(out, line)
	}
	return out
}

func pinnedString(pinned map[string][]netip.Addr) string {
	var out []string
	for h, as := range pinned {
		out = append(out, h+"="+addrsString(as))
	}
	sort.Strings(out)
	return strings.Join(out, ";")
}

// fakeSandboxes is the container runtime: one sandbox per name.
type fakeSandboxes struct {
	in    *injector
	boxes map[string]container.Spec
}

func (f *fakeSandboxes) Create(spec container.Spec) error {
	if err := f.in.enter(callBoxesCreate); err != nil {
		return err
	}
	if _, ok := f.boxes[spec.Name]; ok {
		return fmt.Errorf("sandbox %s exists", spec.Name)
	}
	f.boxes[spec.Name] = spec
	f.in.leave(callBoxesCreate)
	return nil
}

func (f *fakeSandboxes) Destroy(name string) error {
	if err := f.in.enter(callBoxesDestroy); err != nil {
		return err
	}
	delete(f.boxes, name) // not there: done
	f.in.leave(callBoxesDestroy)
	return nil
}

func (f *fakeSandboxes) Exists(name string) bool { _, ok := f.boxes[name]; return ok }

func (f *fakeSandboxes) StartHeld(string, container.HeldSpec) (*os.Process, error) {
	return nil, errors.New("the fake runs nothing")
}

func (f *fakeSandboxes) SetHosts(name string, pinned map[string][]netip.Addr) error {
	spec, ok := f.boxes[name]
	if !ok {
		return fmt.Errorf("sandbox %s: %w", name, container.ErrNotFound)
	}
	spec.Hosts = pinned
	f.boxes[name] = spec
	return nil
}

func (f *fakeSandboxes) Reap(keep map[string]bool) ([]string, error) {
	var gone []string
	for name := range f.boxes {
		if !keep[name] {
			delete(f.boxes, name)
			gone = append(gone, name)
		}
	}
	sort.Strings(gone)
	return gone, nil
}

func (f *fakeSandboxes) render() []string {
	var out []string
	for _, s := range f.boxes {
		dns := "none"
		if s.DNS.IsValid() {
			dns = s.DNS.String()
		}
		line := fmt.Sprintf("box %s netns %s dns %s", s.Name, s.NetnsPath, dns)
		if len(s.Hosts) > 0 {
			line += " hosts " + pinnedString(s.Hosts)
		}
		out = append(out, line)
	}
	return out
}
