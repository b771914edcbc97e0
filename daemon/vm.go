package daemon

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/dhcpguest"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// VM sessions (api.CreateRequest.VM): nsmgr builds the bridge and tap
// (CreateVM), the firewall and DNS proxy treat the session like any other,
// and the daemon runs one dhcpguest.Responder per session, started at
// create and at re-adoption, stopped at delete and at Close.

// VMNetwork is the Network's VM side (nsmgr.Manager has it). Kept apart
// from Network so that a Network without VMs (the tests' fakes) refuses
// them instead of needing a stub.
type VMNetwork interface {
	CreateVM(name string, vm nsmgr.VMConfig) (nsmgr.Session, error)
}

// StartLease starts the DHCP responder of a VM session: in the netns at
// netnsPath, on the tap, serving l. Parts.StartLease replaces it in tests.
type StartLease func(netnsPath, tap string, l dhcpguest.Lease) (io.Closer, error)

// The lease a VM guest gets.
const (
	vmMTU       = 1500 // the veth's
	vmLeaseTime = dhcpguest.DefaultLeaseTime
)

// leases holds the running responders by session.
type leases struct {
	mu sync.Mutex
	by map[string]io.Closer
}

// startDHCPResponder is the production StartLease: it opens the netns file
// and makes the responder's socket on a thread inside it.
func startDHCPResponder(netnsPath, tap string, l dhcpguest.Lease) (io.Closer, error) {
	f, err := os.Open(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", netnsPath, err)
	}
	defer f.Close() // the socket keeps the netns
	ns := netns.NsHandle(f.Fd())
	return dhcpguest.Start(func(fn func() error) error { return nsmgr.Do(ns, fn) }, tap, l, nil)
}

// validateVM checks the VM fields of a request, implies network_only and
// fills in the defaults (tap0, the derived MAC), so the record keeps the
// values used.
func (e *Engine) validateVM(req *api.CreateRequest) error {
	if !req.VM {
		for _, f := range []struct {
			set         bool
			field, flag string
		}{{req.Tap != "", "tap", "--tap"}, {req.TapOwner != nil, "tap_owner", "--tap-owner"}, {req.MAC != "", "mac", "--mac"}} {
			if f.set {
				return fmt.Errorf("%s (%s) needs vm (--vm): only a VM session has a tap", f.field, f.flag)
			}
		}
		return nil
	}
	if req.NetnsPath != "" {
		return fmt.Errorf("vm with netns_path %q: a VM session makes its own netns; leave out one of them", req.NetnsPath)
	}
	if req.Rootfs != "" || req.Image != "" {
		return errors.New("vm: a VM session has no sandbox (the VM is the guest); leave out rootfs and image")
	}
	if err := sandboxOnlyField(*req); err != nil {
		return fmt.Errorf("vm: %w", err)
	}
	req.NetworkOnly = true
	cfg, err := vmConfig(*req)
	if err != nil {
		return err
	}
	if err := nsmgr.ValidateVMConfig(e.cfg.NamePrefix, req.Name, &cfg); err != nil {
		return err
	}
	req.Tap, req.MAC = cfg.Tap, cfg.MAC.String()
	return nil
}

// vmConfig is the nsmgr.VMConfig of a request.
func vmConfig(req api.CreateRequest) (nsmgr.VMConfig, error) {
	cfg := nsmgr.VMConfig{Tap: req.Tap, TapOwner: nsmgr.NoTapOwner}
	if req.TapOwner != nil {
		if *req.TapOwner < 0 {
			return cfg, fmt.Errorf("tap_owner %d: want a uid from 0 to 4294967294", *req.TapOwner)
		}
		cfg.TapOwner = *req.TapOwner
	}
	if req.MAC != "" {
		mac, err := nsmgr.ParseGuestMAC(req.MAC)
		if err != nil {
			return cfg, err
		}
		cfg.MAC = mac
	}
	return cfg, nil
}

// createVMNetwork makes a VM session's network.
func (e *Engine) createVMNetwork(req api.CreateRequest) (nsmgr.Session, error) {
	vmn, ok := e.nets.(VMNetwork)
	if !ok {
		return nsmgr.Session{}, errors.New("this daemon's network makes no VM sessions")
	}
	cfg, err := vmConfig(req)
	if err != nil {
		return nsmgr.Session{}, err
	}
	return vmn.CreateVM(req.Name, cfg)
}

// vmLease is the lease of a VM session's guest.
func (e *Engine) vmLease(rec SessionRecord) (dhcpguest.Lease, error) {
	mac, err := net.ParseMAC(rec.Request.MAC)
	if err != nil {
		return dhcpguest.Lease{}, fmt.Errorf("recorded mac %q: %w", rec.Request.MAC, err)
	}
	return dhcpguest.Lease{
		MAC: mac, Addr: rec.Guest, Bits: 30, Gateway: rec.Gateway, DNS: e.dnsAddr,
		MTU: vmMTU, LeaseTime: vmLeaseTime,
	}, nil
}

// startLease starts a VM session's responder (a no-op for other sessions).
func (e *Engine) startLease(rec SessionRecord) error {
	if !rec.Request.VM {
		return nil
	}
	l, err := e.vmLease(rec)
	if err != nil {
		return err
	}
	start := e.startLeaseFn
	if start == nil {
		start = startDHCPResponder
	}
	r, err := start(rec.NetnsPath, rec.Request.Tap, l)
	if err != nil {
		return fmt.Errorf("start dhcp responder of %s: %w", rec.Name, err)
	}
	e.leases.mu.Lock()
	defer e.leases.mu.Unlock()
	if e.leases.by == nil {
		e.leases.by = map[string]io.Closer{}
	}
	if old := e.leases.by[rec.Name]; old != nil {
		old.Close()
	}
	e.leases.by[rec.Name] = r
	return nil
}

// stopLease stops a session's responder, if it has one.
func (e *Engine) stopLease(name string) {
	e.leases.mu.Lock()
	r := e.leases.by[name]
	delete(e.leases.by, name)
	e.leases.mu.Unlock()
	if r != nil {
		r.Close()
	}
}

// stopLeases stops every responder (Close).
func (e *Engine) stopLeases() {
	e.leases.mu.Lock()
	by := e.leases.by
	e.leases.by = nil
	e.leases.mu.Unlock()
	for _, r := range by {
		r.Close()
	}
}

// vmView is inspect's view of a VM session.
func (e *Engine) vmView(rec SessionRecord) *api.VMView {
	if !rec.Request.VM || !rec.Guest.IsValid() {
		return nil
	}
	v := &api.VMView{
		NetnsPath: rec.NetnsPath,
		Tap:       rec.Request.Tap,
		TapOwner:  rec.Request.TapOwner,
		Bridge:    nsmgr.VMBridge,
		MAC:       rec.Request.MAC,
		Address:   netip.PrefixFrom(rec.Guest, 30).String(),
		Gateway:   rec.Gateway.String(),
		DNS:       addrString(e.dnsAddr),
		MTU:       vmMTU,
		LeaseSecs: int(vmLeaseTime / time.Second),
	}
	v.KernelIPArg = KernelIPArg(rec.Guest, 30, rec.Gateway, e.dnsAddr)
	return v
}

// KernelIPArg is the Linux kernel's ip= boot argument
// (Documentation/admin-guide/nfs/nfsroot.rst) configuring eth0 statically:
// ip=<client>::<gateway>:<netmask>::eth0:off:<dns>.
func KernelIPArg(guest netip.Addr, bits int, gw, dns netip.Addr) string {
	mask := net.IP(net.CIDRMask(bits, 32)).String()
	arg := fmt.Sprintf("ip=%s::%s:%s::eth0:off", guest, gw, mask)
	if dns.IsValid() {
		arg += ":" + dns.String()
	}
	return arg
}

// forkRequest turns a fork's request (api.CreateRequest.ForkOf) into the
// source's request as recorded now, with the fork's name, and its mac, tap
// and tap owner when given. Nothing of the source's kernel state is
// copied: the create that follows makes everything new.
func (e *Engine) forkRequest(req api.CreateRequest) (api.CreateRequest, error) {
	rest := req
	rest.Name, rest.ForkOf, rest.MAC, rest.Tap, rest.TapOwner = "", "", "", "", nil
	if err := nsmgr.ValidateSessionName(req.ForkOf); err != nil {
		return req, badRequest(fmt.Errorf("fork_of: %w", err))
	}
	if !reflect.ValueOf(rest).IsZero() {
		return req, badRequest(errors.New("fork_of: give only name, mac, tap and tap_owner; the policy is the source's"))
	}
	e.mu.Lock()
	src, ok := e.sessions[req.ForkOf]
	var rec SessionRecord
	if ok {
		rec = src.rec
	}
	e.mu.Unlock()
	if !ok {
		return req, fmt.Errorf("fork_of %q: %w", req.ForkOf, api.ErrNotFound)
	}
	if rec.Request.NetnsPath != "" {
		return req, badRequest(fmt.Errorf("fork_of %q: an attached session (netns_path) cannot be forked: its netns is the runtime's", req.ForkOf))
	}
	out := rec.Request
	out.Name, out.ForkOf, out.MAC = req.Name, req.ForkOf, req.MAC
	out.Labels = maps.Clone(rec.Request.Labels)
	out.Allow, out.Scope, out.Deny = slices.Clone(out.Allow), slices.Clone(out.Scope), slices.Clone(out.Deny)
	out.LabPeers, out.InboundFromHost = slices.Clone(out.LabPeers), slices.Clone(out.InboundFromHost)
	if out.Image != "" {
		out.Rootfs = "" // validateRequest resolves the image again
	}
	if req.Tap != "" {
		out.Tap = req.Tap
	}
	if req.TapOwner != nil {
		out.TapOwner = req.TapOwner
	}
	if !out.VM && (req.MAC != "" || req.Tap != "" || req.TapOwner != nil) {
		return req, badRequest(fmt.Errorf("fork_of %q: mac, tap and tap_owner need a VM session; %s is not one", req.ForkOf, req.ForkOf))
	}
	return out, nil
}
