// Command enforcerd-cni is a CNI plugin (spec 1.1: ADD, DEL, CHECK,
// VERSION, STATUS, GC) that gives each container an enforcerd session: a
// thin client of the local daemon over its socket. The daemon makes the
// veth pair with its peer in the runtime's netns (attach mode), with the
// rules, DNS registration and anti-spoofing of any session; this binary
// imports no netlink or libcontainer code, so one exec is cheap.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/enforcerd/enforcerd/api"
)

// pluginVersion is stamped by make build.
var pluginVersion = "0.1.0-dev"

// callTimeout bounds one verb's calls to the daemon (a create with pin
// resolves names).
const callTimeout = 60 * time.Second

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add: cmdAdd, Del: cmdDel, Check: cmdCheck, GC: cmdGC, Status: cmdStatus,
	}, supportedVersions, "enforcerd-cni "+pluginVersion)
}

func setup(args *skel.CmdArgs) (*netConf, *api.Client, context.Context, context.CancelFunc, error) {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return nil, nil, nil, nil, types.NewError(types.ErrDecodingFailure, err.Error(), "")
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	return conf, api.NewClient(conf.Socket), ctx, cancel, nil
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, c, ctx, cancel, err := setup(args)
	if err != nil {
		return err
	}
	defer cancel()
	p, peers, err := buildPolicy(conf, args.Args)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	refused, err := checkLabPeers(ctx, c, conf.Name, peers)
	if err != nil {
		return daemonError(conf, "add", err)
	}
	if refused != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, refused.Error(), "")
	}
	info, err := c.Create(ctx, createRequest(conf, p, args.ContainerID, args.Netns, args.IfName))
	if err != nil {
		return daemonError(conf, "add", err)
	}
	// The netns's resolv.conf is written while the interface is read (file
	// system work beside a thread in the netns: they share nothing).
	wrote := make(chan error, 1)
	go func() { wrote <- writeNetnsResolvConf(etcNetns, args.Netns, info.Name, info.DNS) }()
	mac, err := ifaceMAC(args.Netns, args.IfName)
	if err == nil && mac == nil {
		err = fmt.Errorf("%s in netns %s has no ethernet address", args.IfName, args.Netns)
	}
	if werr := <-wrote; err == nil {
		err = werr
	}
	if err != nil {
		if rerr := removeNetnsResolvConf(etcNetns, args.Netns, info.Name); rerr != nil {
			err = errors.Join(err, rerr)
		}
		// (the daemon made it a moment ago: undo, so a failed ADD leaves nothing)
		if rerr := c.Remove(ctx, info.Name); rerr != nil && !errors.Is(rerr, api.ErrNotFound) {
			err = errors.Join(err, rerr)
		}
		return types.NewError(types.ErrInternal, "add: "+err.Error(), "")
	}
	res, err := result(info, args.IfName, args.Netns, mac)
	if err != nil {
		return types.NewError(types.ErrInternal, err.Error(), "")
	}
	return types.PrintResult(res, conf.CNIVersion)
}

// supportedVersions are the spec versions the plugin answers in: every
// version the CNI library converts a 1.1.0 result to (version.All). CHECK
// exists from 0.4.0, GC and STATUS from 1.1.0; the library refuses them
// for older versions itself. Debian 12's podman 4.3 reads results up to
// 1.0.0, containerd 2 up to 1.1.0.
var supportedVersions = version.All

// result is the CNI result of a session: the host veth and the container's
// interface with its MAC (read in the netns: runtimes such as podman
// require it), the guest's /30 with its gateway, the default route, and
// the DNS anycast address as the nameserver. On a dual-stack daemon
// (serve --pool6) also the guest's /126 with its gateway, the IPv6
// default route and the v6 anycast address. The host veth's MAC is not
// there: it lives in the daemon's netns, which the plugin does not enter,
// and inspect does not report it.
func result(info api.SessionInfo, ifname, netns string, mac net.HardwareAddr) (*types100.Result, error) {
	guest, err := netip.ParseAddr(info.GuestIP)
	if err != nil {
		return nil, fmt.Errorf("session %s: guest address %q: %w", info.Name, info.GuestIP, err)
	}
	gw, err := netip.ParseAddr(info.GatewayIP)
	if err != nil {
		return nil, fmt.Errorf("session %s: gateway address %q: %w", info.Name, info.GatewayIP, err)
	}
	inContainer := 1
	res := &types100.Result{
		CNIVersion: types100.ImplementedSpecVersion,
		Interfaces: []*types100.Interface{
			{Name: info.HostVeth},
			{Name: ifname, Mac: mac.String(), Sandbox: netns},
		},
		IPs: []*types100.IPConfig{{
			Interface: &inContainer,
			Address:   net.IPNet{IP: guest.AsSlice(), Mask: net.CIDRMask(30, 32)},
			Gateway:   gw.AsSlice(),
		}},
		Routes: []*types.Route{{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: gw.AsSlice()}},
	}
	if info.DNS != "" {
		res.DNS.Nameservers = []string{info.DNS}
	}
	if info.Guest6IP == "" {
		return res, nil
	}
	guest6, err := netip.ParseAddr(info.Guest6IP)
	if err != nil || !guest6.Is6() {
		return nil, fmt.Errorf("session %s: guest IPv6 address %q: want an IPv6 address", info.Name, info.Guest6IP)
	}
	gw6, err := netip.ParseAddr(info.Gateway6IP)
	if err != nil || !gw6.Is6() {
		return nil, fmt.Errorf("session %s: IPv6 gateway %q: want an IPv6 address", info.Name, info.Gateway6IP)
	}
	res.IPs = append(res.IPs, &types100.IPConfig{
		Interface: &inContainer,
		Address:   net.IPNet{IP: guest6.AsSlice(), Mask: net.CIDRMask(guest6Bits, 128)},
		Gateway:   gw6.AsSlice(),
	})
	res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, GW: gw6.AsSlice()})
	if info.DNS6 != "" {
		res.DNS.Nameservers = append(res.DNS.Nameservers, info.DNS6)
	}
	return res, nil
}

// guest6Bits is the prefix length of a dual-stack session's IPv6 address
// (its slot's /126, nsmgr.Pool6SlotBits; the plugin imports no nsmgr).
const guest6Bits = 126

// cmdDel deletes the attachment's session: one request, which the daemon
// carries out only if the session is this attachment's (its container ID
// and interface name). Gone already (or never made, or the netns gone) is
// success; a session of that name that is another attachment's is left
// alone.
func cmdDel(args *skel.CmdArgs) error {
	conf, c, ctx, cancel, err := setup(args)
	if err != nil {
		return err
	}
	defer cancel()
	name := sessionName(conf.Name, args.ContainerID, args.IfName)
	err = c.RemoveAttachment(ctx, name, api.AttachmentRef{ContainerID: args.ContainerID, IfName: args.IfName})
	switch {
	case errors.Is(err, api.ErrNameTaken):
		return nil // (another attachment's: not ours to delete)
	case err != nil && !errors.Is(err, api.ErrNotFound):
		return daemonError(conf, "del", err)
	}
	// Deleted now, or before (a DEL that the runtime repeats after the
	// session went: the netns's resolv.conf may still be there).
	if err := removeNetnsResolvConf(etcNetns, args.Netns, name); err != nil {
		return types.NewError(types.ErrInternal, "del: "+err.Error(), "")
	}
	return nil
}

func owns(info api.SessionInfo, containerID, ifname string) bool {
	return info.ContainerID == containerID && info.IfName == ifname
}

// cmdCheck verifies that the session exists as ADD returned it (the same
// container, netns, interface and address) and that the container's netns
// still holds it: the interface up, with the guest's /30, the MAC of the
// result and the default route via the gateway. The daemon answers for the
// session; the kernel inside CNI_NETNS, read by the plugin itself, for the
// interface.
func cmdCheck(args *skel.CmdArgs) error {
	conf, c, ctx, cancel, err := setup(args)
	if err != nil {
		return err
	}
	defer cancel()
	name := sessionName(conf.Name, args.ContainerID, args.IfName)
	info, err := c.Inspect(ctx, name)
	if err != nil {
		return daemonError(conf, "check", err)
	}
	if !owns(info, args.ContainerID, args.IfName) || info.NetnsPath != args.Netns {
		return fmt.Errorf("check: session %s is container %s's %s in %s, not container %s's %s in %s",
			name, info.ContainerID, info.IfName, info.NetnsPath, args.ContainerID, args.IfName, args.Netns)
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return types.NewError(types.ErrDecodingFailure, "check: prevResult: "+err.Error(), "")
	}
	if conf.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "check: no prevResult", "")
	}
	prev, err := types100.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "check: prevResult: "+err.Error(), "")
	}
	for _, ip := range prev.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		want := info.GuestIP
		if a.Unmap().Is6() {
			want = info.Guest6IP
		}
		if got := a.Unmap().String(); got != want {
			return fmt.Errorf("check: session %s has address %s, the result said %s", name, addrOrNone(want != "", want), got)
		}
	}
	if len(prev.IPs) == 0 {
		return fmt.Errorf("check: the result of session %s has no address", name)
	}
	ci, err := inspectIface(args.Netns, args.IfName)
	if err != nil {
		return fmt.Errorf("check: %w", err)
	}
	return checkIface(ci, info, prev, args.IfName, args.Netns)
}

// checkIface compares what the container's netns holds with the session
// and the result ADD returned: the interface up, with the guest's /30, the
// result's MAC, and the default route via the gateway.
func checkIface(ci containerIface, info api.SessionInfo, prev *types100.Result, ifname, netns string) error {
	where := ifname + " in netns " + netns
	if !ci.Up {
		return fmt.Errorf("check: %s is down", where)
	}
	want := info.GuestIP + "/30"
	if got := ci.Addr.String(); !ci.Addr.IsValid() || got != want {
		return fmt.Errorf("check: %s has address %s, want %s", where, addrOrNone(ci.Addr.IsValid(), got), want)
	}
	for _, i := range prev.Interfaces {
		if i.Name == ifname && i.Sandbox == netns && i.Mac != "" && i.Mac != ci.MAC.String() {
			return fmt.Errorf("check: %s has mac %s, the result said %s", where, ci.MAC, i.Mac)
		}
	}
	if !ci.HasRoute || ci.Gateway.String() != info.GatewayIP {
		return fmt.Errorf("check: %s has default route %s, want via %s", where, addrOrNone(ci.HasRoute, "via "+ci.Gateway.String()), info.GatewayIP)
	}
	if info.Guest6IP == "" {
		return nil
	}
	want6 := info.Guest6IP + "/" + strconv.Itoa(guest6Bits)
	if !slices.ContainsFunc(ci.Addrs6, func(p netip.Prefix) bool { return p.String() == want6 }) {
		return fmt.Errorf("check: %s has IPv6 addresses %v, want %s among them", where, ci.Addrs6, want6)
	}
	if !ci.HasRoute6 || ci.Gateway6.String() != info.Gateway6IP {
		return fmt.Errorf("check: %s has IPv6 default route %s, want via %s", where, addrOrNone(ci.HasRoute6, "via "+ci.Gateway6.String()), info.Gateway6IP)
	}
	return nil
}

func addrOrNone(ok bool, s string) string {
	if !ok {
		return "none"
	}
	return s
}

// cmdGC deletes the sessions of this network whose attachment the runtime
// no longer lists as valid.
func cmdGC(args *skel.CmdArgs) error {
	conf, c, ctx, cancel, err := setup(args)
	if err != nil {
		return err
	}
	defer cancel()
	valid := map[types.GCAttachment]bool{}
	for _, a := range conf.ValidAttachments {
		valid[a] = true
	}
	sessions, err := c.List(ctx, labelNetwork, conf.Name)
	if err != nil {
		return daemonError(conf, "gc", err)
	}
	var errs, fileErrs []error
	for _, s := range sessions {
		if s.NetnsPath == "" || valid[types.GCAttachment{ContainerID: s.ContainerID, IfName: s.IfName}] {
			continue
		}
		if err := c.Remove(ctx, s.Name); err != nil && !errors.Is(err, api.ErrNotFound) {
			errs = append(errs, err)
			continue
		}
		fileErrs = append(fileErrs, removeNetnsResolvConf(etcNetns, s.NetnsPath, s.Name))
	}
	if err := errors.Join(errs...); err != nil {
		return daemonError(conf, "gc", err)
	}
	if err := errors.Join(fileErrs...); err != nil {
		return types.NewError(types.ErrInternal, "gc: "+err.Error(), "")
	}
	return nil
}

// cmdStatus is nil while the daemon answers and is ready.
func cmdStatus(args *skel.CmdArgs) error {
	conf, c, ctx, cancel, err := setup(args)
	if err != nil {
		return err
	}
	defer cancel()
	if err := c.Ready(ctx); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf("enforcerd at %s is not ready: %v", conf.Socket, err), "")
	}
	return nil
}

// daemonError turns a daemon call's error into a CNI error whose msg is
// the daemon's one line: a refused request (a bad policy names its value)
// is an invalid network config; an unreachable daemon is try-again-later.
func daemonError(conf *netConf, verb string, err error) error {
	var ae *api.Error
	switch {
	case errors.As(err, &ae) && errors.Is(err, api.ErrBadRequest):
		return types.NewError(types.ErrInvalidNetworkConfig, ae.Message, "")
	case errors.As(err, &ae):
		return types.NewError(types.ErrInternal, ae.Message, "")
	}
	return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s: enforcerd does not answer at %s (the network config's \"socket\")", verb, conf.Socket), err.Error())
}
