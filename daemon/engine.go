package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/container"
	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/internal/txn"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"

	"github.com/enforcerd/enforcerd/container/rules"
)

// liveSession is one adopted or created session. Immutable after it is
// published in Engine.sessions.
type liveSession struct {
	rec    SessionRecord
	policy netpolicy.Policy
	rules  nft.SessionRules
}

func (s *liveSession) hasNIC() bool { return s.rec.Slot >= 0 }

// addSessionLocked makes s a live session, its guest addresses indexed;
// removeSessionLocked ends one. e.mu is held. (An update or a grant's end
// replaces a live session under the same name and guest: no index change.)
func (e *Engine) addSessionLocked(s *liveSession) {
	e.sessions[s.rec.Name] = s
	if s.hasNIC() {
		e.byGuest[s.rec.Guest] = s.rec.Name
		if s.rec.Guest6.IsValid() {
			e.byGuest[s.rec.Guest6] = s.rec.Name
		}
	}
}

func (e *Engine) removeSessionLocked(name string) {
	if s, ok := e.sessions[name]; ok && s.hasNIC() {
		delete(e.byGuest, s.rec.Guest)
		if s.rec.Guest6.IsValid() {
			delete(e.byGuest, s.rec.Guest6)
		}
	}
	delete(e.sessions, name)
}

// reserve claims a name for a create or delete; release gives it back.
func (e *Engine) reserve(name string, mustExist bool) (*liveSession, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pending[name] {
		return nil, api.Classify(fmt.Errorf("session %q: another operation on it is in progress", name), api.ErrBusy)
	}
	s, exists := e.sessions[name]
	if mustExist && !exists {
		return nil, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	if !mustExist && exists {
		return nil, fmt.Errorf("session %q already exists: %w", name, api.ErrNameTaken)
	}
	e.pending[name] = true
	return s, nil
}

func (e *Engine) release(name string) {
	e.mu.Lock()
	delete(e.pending, name)
	delete(e.creating, name)
	e.mu.Unlock()
}

// badRequest wraps a validation error so the API answers 400 with the
// error's own one-line text.
func badRequest(err error) error { return api.Classify(err, api.ErrBadRequest) }

// buildPolicy turns a request into a validated policy. It touches nothing.
func (e *Engine) buildPolicy(req api.CreateRequest) (netpolicy.Policy, error) {
	var p netpolicy.Policy
	for _, s := range req.Allow {
		ent, err := netpolicy.ParseEntry(s, e.guard)
		if err != nil {
			return p, badRequest(err)
		}
		p.Allow = append(p.Allow, ent)
	}
	for _, s := range req.Scope {
		ent, err := netpolicy.ParseScope(s, e.guard)
		if err != nil {
			return p, badRequest(err)
		}
		p.Allow = append(p.Allow, ent)
	}
	p.Allow = netpolicy.DedupEntries(p.Allow)
	for _, s := range req.Deny {
		ent, err := e.guard.ParseDeny(s)
		if err != nil {
			return p, badRequest(err)
		}
		p.Deny = append(p.Deny, ent)
	}
	p.Deny = netpolicy.DedupEntries(p.Deny)
	// "" is drop: a record written before reject became the default (no
	// on_deny) keeps the silence it was created with. Create and a
	// replacing update write the default out (defaultOnDeny), so a new
	// record never holds "".
	if req.OnDeny != "" {
		a, err := netpolicy.ParseDenyAnswer(req.OnDeny)
		if err != nil {
			return p, badRequest(err)
		}
		p.OnDeny = a
	}
	if req.NameCheck != "" {
		n, err := netpolicy.ParseNameCheck(req.NameCheck)
		if err != nil {
			return p, badRequest(err)
		}
		p.NameCheck = n
	}
	if req.QUIC != "" {
		q, err := netpolicy.ParseQUIC(req.QUIC)
		if err != nil {
			return p, badRequest(err)
		}
		p.QUIC = q
	}
	p.LabPeers = req.LabPeers
	p.Lab = req.Lab
	for _, s := range req.InboundFromHost {
		ps, err := netpolicy.ParseInboundPort(s)
		if err != nil {
			return p, badRequest(err)
		}
		p.InboundFromHost = append(p.InboundFromHost, ps)
	}
	p.InboundFromHost = netpolicy.NormalizeInbound(p.InboundFromHost)
	switch {
	case req.Egress != "":
		m, err := netpolicy.ParseMode(req.Egress)
		if err != nil {
			return p, badRequest(err)
		}
		p.Egress = m
	case len(p.Allow) > 0 || len(p.LabPeers) > 0 || req.Lab:
		// A lab target gets a NIC and an address but no egress unless it
		// is given more: an allowlist with nothing in it.
		p.Egress = netpolicy.ModeAllowlist
	case req.NetnsPath != "":
		// An attachment is an interface: with nothing allowed, only the
		// DNS proxy answers.
		p.Egress = netpolicy.ModeAllowlist
	default:
		p.Egress = netpolicy.ModeNone
	}
	if p.Egress == netpolicy.ModeNone && req.NetnsPath != "" {
		return p, badRequest(fmt.Errorf("egress none: netns_path %q needs an interface, which egress none has not; want egress allowlist with no allow entries to let nothing out", req.NetnsPath))
	}
	if p.Egress == netpolicy.ModeNone && req.Lab {
		return p, badRequest(errors.New("--lab needs a network: a lab target cannot have egress none"))
	}
	if err := p.Validate(); err != nil {
		return p, badRequest(err)
	}
	if req.Pin {
		if p.Egress != netpolicy.ModeAllowlist {
			return p, badRequest(fmt.Errorf("--pin needs egress allowlist, not %s", p.Egress))
		}
		for _, ent := range p.Allow {
			if ent.Kind == netpolicy.KindWildcard || ent.Kind == netpolicy.KindMultiWildcard {
				return p, badRequest(fmt.Errorf("--pin: wildcard %q cannot be resolved once; name each host", ent.String()))
			}
			// Pinning would ask the upstream for a denied name.
			if d, denied := p.DeniedName(ent.Name); denied {
				return p, badRequest(fmt.Errorf("--pin: host %s is denied by deny entry %q; remove one of them", ent.Name, d.String()))
			}
		}
	}
	return p, nil
}

// validateRequest checks a create request before anything is made. It
// replaces req.Rootfs by the image's real path, so the directory mounted is
// the one checked.
func (e *Engine) validateRequest(req *api.CreateRequest) error {
	if err := nsmgr.ValidateSessionName(req.Name); err != nil {
		return badRequest(err)
	}
	if err := e.validateVM(req); err != nil {
		return badRequest(err)
	}
	if req.NetnsPath != "" || req.IfName != "" || req.ContainerID != "" {
		if err := validateAttach(req); err != nil {
			return badRequest(err)
		}
	}
	if req.Image != "" {
		if req.Rootfs != "" || req.NetworkOnly {
			return badRequest(fmt.Errorf("image %q: want exactly one of --rootfs DIR, --image NAME or --network-only", req.Image))
		}
		rootfs, err := e.imageRootfs(req.Image)
		if err != nil {
			return err
		}
		req.Rootfs = rootfs
	}
	if req.NetworkOnly == (req.Rootfs != "") {
		return badRequest(errors.New("want exactly one of --rootfs DIR, --image NAME or --network-only"))
	}
	if req.Rootfs != "" {
		real, err := e.grantImage(req.Rootfs)
		if err != nil {
			return badRequest(err)
		}
		req.Rootfs = real
	}
	if req.NetworkOnly {
		if err := sandboxOnlyField(*req); err != nil {
			return badRequest(err)
		}
	} else if err := container.CheckResources(req.MemoryBytes, req.Pids, req.CPUs); err != nil {
		// The container layer's rule and text, before any network is built.
		return badRequest(err)
	}
	for k := range req.Labels {
		if k == "" || strings.ContainsAny(k, "=,") {
			return badRequest(fmt.Errorf("label key %q: must be non-empty without '=' or ','", k))
		}
	}
	return nil
}

// validateAttach checks the attach fields of a request (see
// api.CreateRequest.NetnsPath), fills in the defaults (network_only, eth0)
// and records the fields as labels.
func validateAttach(req *api.CreateRequest) error {
	if req.NetnsPath == "" {
		return errors.New("ifname and container_id need netns_path: they name an interface in a netns the caller made")
	}
	if req.Rootfs != "" || req.Image != "" {
		return fmt.Errorf("netns_path %q: a session attached to a netns has no sandbox; leave out rootfs and image", req.NetnsPath)
	}
	req.NetworkOnly = true
	if req.IfName == "" {
		req.IfName = nsmgr.GuestIface
	}
	if err := nsmgr.ValidateAttachment(nsmgr.Attachment{NetnsPath: req.NetnsPath, IfName: req.IfName}); err != nil {
		return err
	}
	if err := validateContainerID(req.ContainerID); err != nil {
		return err
	}
	labels := maps.Clone(req.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[api.LabelNetns] = req.NetnsPath
	labels[api.LabelIfName] = req.IfName
	if req.ContainerID != "" {
		labels[api.LabelContainerID] = req.ContainerID
	}
	req.Labels = labels
	return nil
}

// validateContainerID applies the CNI spec's rule for container ids
// (letters, digits, '_', '.' and '-', starting with a letter or digit), with
// a bound: the id lands in a label and in every inspect.
func validateContainerID(id string) error {
	const want = "want 1 to 256 characters of letters, digits, '_', '.' and '-', starting with a letter or digit"
	if id == "" {
		return nil
	}
	if len(id) > 256 {
		return fmt.Errorf("container_id %q: %d characters; %s", id, len(id), want)
	}
	for i, r := range id {
		alnum := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
		if !alnum && (i == 0 || r != '_' && r != '.' && r != '-') {
			return fmt.Errorf("container_id %q: character %q not allowed at %d; %s", id, r, i, want)
		}
	}
	return nil
}

// sandboxOnlyField refuses a --network-only request that sets what only a
// sandbox has: the session would silently hold less than asked for. The
// error names the JSON field and the CLI flag.
func sandboxOnlyField(req api.CreateRequest) error {
	for _, f := range []struct {
		set         bool
		field, flag string
	}{
		{req.MemoryBytes != 0, "memory_bytes", "--memory"},
		{req.Pids != 0, "pids", "--pids"},
		{req.CPUs != 0, "cpus", "--cpus"},
		{req.NetRaw, "net_raw", "--net-raw"},
		{req.Writable, "writable", "--writable"},
	} {
		if f.set {
			return fmt.Errorf("%s (%s) has no effect with network_only (--network-only): there is no sandbox; leave it out", f.field, f.flag)
		}
	}
	return nil
}

// grantImage returns the real path of rootfs if the operator granted it
// (container.ResolveImage over --images-dir). Any API caller may name any
// path, and the sandbox's root is root over what it mounts: a socket-group
// member asking for / would read the host's /etc/shadow. So the grant
// holds for root callers too, and without --images-dir nothing is granted.
func (e *Engine) grantImage(rootfs string) (string, error) {
	if !filepath.IsAbs(rootfs) {
		return "", fmt.Errorf("rootfs %q: want an absolute directory", rootfs)
	}
	// The grant first: a caller learns nothing about a directory the
	// operator did not grant, not even whether DIR/bin exists.
	resolved, err := container.ResolveImage(rootfs, e.cfg.ImagesDirs)
	if err != nil {
		return "", err
	}
	if fi, err := os.Stat(filepath.Join(resolved, "bin")); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("rootfs %q: not a root filesystem (no bin directory)", rootfs)
	}
	return resolved, nil
}

// resolvePeers finds the lab targets a session names. Each must be a live
// lab target.
func (e *Engine) resolvePeers(names []string) ([]PeerRecord, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []PeerRecord
	for _, n := range names {
		s, ok := e.sessions[n]
		if !ok {
			return nil, badRequest(fmt.Errorf("lab peer %q: no such session", n))
		}
		if !s.rec.Request.Lab {
			return nil, badRequest(fmt.Errorf("lab peer %q: not a lab target (create it with --lab)", n))
		}
		out = append(out, PeerRecord{Name: n, Guest: s.rec.Guest, Created: s.rec.Created})
	}
	return out, nil
}

// livePeers keeps the recorded peers that still exist as the very session
// they were at create (same name, address and creation time).
func (e *Engine) livePeers(session string, recorded []PeerRecord) []PeerRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []PeerRecord
	for _, p := range recorded {
		s, ok := e.sessions[p.Name]
		if ok && s.rec.Request.Lab && s.rec.Guest == p.Guest && s.rec.Created.Equal(p.Created) {
			out = append(out, p)
			continue
		}
		e.log.Warn("lab target gone since create; its peering is not restored", "session", session, "peer", p.Name)
	}
	return out
}

func peerGuests(ps []PeerRecord) []netip.Addr {
	out := make([]netip.Addr, len(ps))
	for i, p := range ps {
		out[i] = p.Guest
	}
	return out
}

// Create provisions a session: network, rules, DNS registration, sandbox,
// record. Any failure unwinds what was done, in reverse.
func (e *Engine) Create(ctx context.Context, req api.CreateRequest) (info api.SessionInfo, err error) {
	start := time.Now()
	defer func() { e.metrics.ObserveCreate(time.Since(start), err) }()
	defer func() {
		// Runs last, after the undo joined its errors into err.
		if err != nil {
			e.recordCall(ctx, req.Name, "create_failed", createEssentials(req), err)
		}
	}()
	var inherited []GrantRecord
	if req.ForkOf != "" {
		if req, err = e.forkRequest(req); err != nil {
			return info, err
		}
		// The source's open grants end in the fork at their deadlines too.
		e.mu.Lock()
		if src, ok := e.sessions[req.ForkOf]; ok {
			for _, g := range src.rec.Grants {
				if g.Ended == nil {
					inherited = append(inherited, g)
				}
			}
		}
		e.mu.Unlock()
	}
	if err := e.validateRequest(&req); err != nil {
		return info, err
	}
	policy, err := e.buildPolicy(req)
	if err != nil {
		return info, err
	}
	if req.KeepEstablished && req.AllowFor == "" {
		return info, badRequest(errKeepWithoutGrant)
	}
	ask := grantAsk{allowFor: req.AllowFor, keep: req.KeepEstablished, connections: req.Connections, budget: req.Budget}
	if err := e.checkGrantEntries(req.Allow, ask, policy.Egress); err != nil {
		return info, err
	}
	grant, err := newGrant(req.Allow, ask, time.Now())
	if err != nil {
		return info, badRequest(err)
	}
	// The grant is the record's; the stored request does not ask again
	// (a fork or a re-adopt would otherwise grant anew).
	req.AllowFor, req.KeepEstablished, req.Connections, req.Budget = "", false, 0, 0
	defaultOnDeny(&req, &policy)
	// Parsed as given, stored without the credentials a scope URL may
	// carry: the record, the events and the logs never hold them.
	req.Scope = stripScopes(req.Scope)
	if _, err := e.reserve(req.Name, false); err != nil {
		return info, err
	}
	defer e.release(req.Name)
	if req.Rootfs != "" {
		if err := e.claimRootfs(req.Name, req.Rootfs); err != nil {
			return info, err
		}
	}

	peers, err := e.resolvePeers(policy.LabPeers)
	if err != nil {
		return info, err
	}
	var pinned map[string][]netip.Addr
	if req.Pin {
		if pinned, err = e.resolvePins(ctx, policy); err != nil {
			return info, err
		}
	}

	// A failed step unwinds the steps before it; undos that fail are
	// joined into the returned error (the step's error first, its sentinel
	// kept) and logged, since what they left behind is the operator's.
	var undo txn.Undo
	defer func() {
		if err == nil {
			return
		}
		if uerr := undo.Unwind(); uerr != nil {
			e.log.Error("create failed and its undo left objects behind", "session", req.Name, "err", uerr)
			err = errors.Join(err, uerr)
		}
	}()

	// The session's event file is made by the event log's writer while
	// the network is made (its first record then only appends).
	e.events.Prepare(req.Name)
	undo.Push("events file", func() error { e.events.Abandon(req.Name); return nil })

	nicNeeded := policy.Egress != netpolicy.ModeNone
	if req.VM && !nicNeeded {
		return info, badRequest(errors.New("vm with egress none: a VM guest needs an address; give an egress policy (allow, scope, public)"))
	}
	rec := SessionRecord{
		Name:    req.Name,
		Created: time.Now().UTC(),
		Request: req,
		Pinned:  pinned,
		Sandbox: !req.NetworkOnly,
		Peers:   peers,
	}
	rec.Grants = inherited
	if grant != nil {
		rec.Grants = append(rec.Grants, *grant)
	}
	s := &liveSession{rec: rec, policy: policy}
	// A session of its own netns gets its rules while nsmgr makes its
	// netns and veth (CreateAlongside): the elements need only the slot's
	// names and addresses, and match nothing until the veth exists.
	// rulesAdded and rulesErr are the alongside work's, read after
	// CreateAlongside returned (which waited for it).
	var rulesAdded bool
	var rulesErr error
	addRules := func(ns nsmgr.Session) error {
		s.rules = e.sessionRules(rec.withNetwork(ns), policy, peerGuests(peers))
		if rulesErr = e.fw.AddSession(s.rules); rulesErr != nil {
			return rulesErr
		}
		rulesAdded = true
		return nil
	}
	var netSess nsmgr.Session
	if req.VM {
		netSess, err = e.createVMNetwork(req)
	} else if req.NetnsPath != "" {
		netSess, err = e.nets.Attach(req.Name, nsmgr.Attachment{NetnsPath: req.NetnsPath, IfName: req.IfName})
	} else {
		netSess, err = e.nets.CreateAlongside(req.Name, nicNeeded, addRules)
	}
	if err != nil {
		if rulesAdded { // the network unwound itself; the rules are ours
			undo.Push("rules", func() error { return e.fw.RemoveSession(s.rules) })
		}
		var ex *nsmgr.ExhaustedError
		switch {
		case rulesErr != nil:
			return info, fmt.Errorf("add rules of %s: %w", req.Name, rulesErr)
		case errors.As(err, &ex):
			return info, api.Classify(ex, api.ErrPoolExhausted)
		}
		var refused *nsmgr.RefusedError
		if errors.As(err, &refused) {
			return info, badRequest(refused)
		}
		return info, fmt.Errorf("create network of %s: %w", req.Name, err)
	}
	undo.Push("network", func() error { return e.nets.Delete(req.Name, netSess.Slot) })
	if rulesAdded {
		undo.Push("rules", func() error { return e.fw.RemoveSession(s.rules) })
	}

	rec = rec.withNetwork(netSess)
	s.rec = rec
	if nicNeeded {
		if !rulesAdded { // a VM's or an attached session's: after its network
			if err = addRules(netSess); err != nil {
				return info, fmt.Errorf("add rules of %s: %w", req.Name, err)
			}
			undo.Push("rules", func() error { return e.fw.RemoveSession(s.rules) })
		}
		if err = e.dns.Register(e.dnsPolicy(s)); err != nil {
			return info, fmt.Errorf("register %s with the dns proxy: %w", req.Name, err)
		}
		undo.Push("dns registration", func() error { e.dns.Unregister(rec.Guest); return nil })
	}
	if err = e.startLease(rec); err != nil {
		return info, err
	}
	undo.Push("dhcp responder", func() error { e.stopLease(req.Name); return nil })
	if rec.Sandbox {
		if err = e.boxes.Create(e.sandboxSpec(s)); err != nil {
			return info, fmt.Errorf("start sandbox of %s: %w", req.Name, err)
		}
		undo.Push("sandbox", func() error { return e.boxes.Destroy(req.Name) })
	}
	if err = e.state.Save(rec); err != nil {
		return info, fmt.Errorf("save record of %s: %w", req.Name, err)
	}

	e.mu.Lock()
	e.addSessionLocked(s)
	e.mu.Unlock()
	e.scheduleGrants(rec)
	e.events.Open(req.Name, req.Labels)
	detail := createEssentials(req)
	if grant != nil && grant.hasEnd() {
		detail["grant_deadline"] = grant.Deadline
	}
	if grant != nil && grant.Connections > 0 {
		detail["grant_connections"] = grant.Connections
	}
	if grant != nil && grant.Budget > 0 {
		detail["grant_budget"] = grant.Budget
	}
	detail["egress"], detail["allow"] = string(policy.Egress), entryStrings(policy.Allow)
	detail["guest_ip"], detail["sandbox"] = addrString(rec.Guest), rec.Sandbox
	e.recordCall(ctx, req.Name, "created", detail, nil, "pinned", len(pinned), "took", time.Since(start))
	// A session this new has nothing attested and zero counters: answer
	// without dumping the kernel's sets.
	return e.summary(s), nil
}

// withNetwork is rec with the network's fields of ns.
func (rec SessionRecord) withNetwork(ns nsmgr.Session) SessionRecord {
	rec.Slot, rec.Netns, rec.NetnsPath, rec.HostIface = ns.Slot, ns.Netns, ns.NetnsPath, ns.HostIface
	rec.Guest, rec.Gateway, rec.Guest6, rec.Gateway6 = ns.Guest, ns.Gateway, ns.Guest6, ns.Gateway6
	return rec
}

func (e *Engine) sessionRules(rec SessionRecord, p netpolicy.Policy, peers []netip.Addr) nft.SessionRules {
	return nft.SessionRules{
		Name:      rec.Name,
		HostIface: rec.HostIface,
		Guest:     rec.Guest,
		Egress:    p.Egress,
		Static:    netpolicy.StaticTargets(p, rec.Pinned),
		Peers:     peers,
		Deny:      netpolicy.DenyTargets(p),
		OnDeny:    p.OnDeny,
		NameCheck: p.NameCheck == netpolicy.NameCheckTLS,
		QUICCheck: p.NameCheck == netpolicy.NameCheckTLS && p.QUIC == netpolicy.QUICCheck,
		DenyNames: slices.ContainsFunc(p.Deny, func(e netpolicy.Entry) bool { return e.Kind != netpolicy.KindCIDR }),
		Pinned:    netpolicy.PinnedTargets(p, rec.Pinned),

		InboundFromHost: p.InboundFromHost,
		Limits:          e.limitsOf(rec, p).nft,
	}
}

func (e *Engine) dnsPolicy(s *liveSession) dnsproxy.SessionPolicy {
	return dnsproxy.SessionPolicy{
		Name:   s.rec.Name,
		Guest:  s.rec.Guest,
		Mode:   s.policy.Egress,
		Allow:  s.policy.Allow,
		Pinned: s.rec.Pinned,
		Deny:   s.policy.Deny,
		// Under the name check, clients get no ECH configuration: the
		// name they want is then the server_name the check reads.
		KeepECH: s.policy.NameCheck == netpolicy.NameCheckOff,
		// A dual-stack session's v6 queries are its own, and its AAAA
		// answers are attested into its v6 sets (the name check reads
		// IPv6 flows as it reads IPv4 ones); an IPv4-only session's are
		// emptied.
		Guest6: s.rec.Guest6,
		AAAA:   s.rec.Guest6.IsValid(),
	}
}

func (e *Engine) sandboxSpec(s *liveSession) container.Spec {
	req := s.rec.Request
	spec := container.Spec{
		Name:        s.rec.Name,
		Rootfs:      req.Rootfs,
		Writable:    req.Writable,
		NetnsPath:   s.rec.NetnsPath,
		NetRaw:      req.NetRaw,
		MemoryBytes: req.MemoryBytes,
		PidsMax:     req.Pids,
		CPUs:        req.CPUs,
		Hostname:    s.rec.Name,
		Hosts:       s.rec.Pinned,
	}
	if s.hasNIC() {
		spec.DNS = e.dnsAddr
	}
	return spec
}

// Delete tears a session down in the fixed order; every step tolerates
// "already gone", so a partial failure never blocks the rest.
func (e *Engine) Delete(ctx context.Context, name string) error {
	return e.deleteIf(ctx, name, nil)
}

// DeleteAttachment is Delete of a session only if it is at's (the
// container ID and interface name of its request); another's is left
// alone, an error wrapping api.ErrNameTaken. The check and the delete are
// one operation on the session: nothing can take the name in between.
func (e *Engine) DeleteAttachment(ctx context.Context, name string, at api.AttachmentRef) error {
	return e.deleteIf(ctx, name, func(rec SessionRecord) error {
		if rec.Request.ContainerID != at.ContainerID || rec.Request.IfName != at.IfName {
			return fmt.Errorf("session %q is container %q's %q, not container %q's %q: %w",
				name, rec.Request.ContainerID, rec.Request.IfName, at.ContainerID, at.IfName, api.ErrNameTaken)
		}
		return nil
	})
}

// deleteIf is Delete once check (nil: none) passed the session's record.
func (e *Engine) deleteIf(ctx context.Context, name string, check func(SessionRecord) error) (err error) {
	s, err := e.reserve(name, true)
	if err != nil {
		// (a CNI DEL repeated after the session went is no failure)
		if check == nil || !errors.Is(err, api.ErrNotFound) {
			e.recordCall(ctx, name, "delete_failed", nil, err)
		}
		return err
	}
	defer e.release(name)
	if check != nil {
		if err := check(s.rec); err != nil {
			return err // (not a failed delete: nothing was asked of this session)
		}
	}
	defer func() {
		if err != nil {
			e.recordCall(ctx, name, "delete_failed", nil, err)
		}
	}()
	if err := e.teardown(s.rec, s.rules); err != nil {
		return err
	}
	e.mu.Lock()
	e.removeSessionLocked(name)
	e.mu.Unlock()
	e.scheduleGrants(SessionRecord{Name: name}) // stops its grant timer
	e.names.drop(name)
	e.recordCall(ctx, name, "deleted", nil, nil)
	guest := netip.Addr{}
	if s.hasNIC() {
		guest = s.rec.Guest
	}
	e.ledgerSessionRemoved(name, guest)
	e.events.Close(name)
	return nil
}

// teardown removes every part of a session that may exist, in order, and
// reports all failures together.
func (e *Engine) teardown(rec SessionRecord, rules nft.SessionRules) error {
	var errs []error
	if rec.Sandbox {
		if err := e.boxes.Destroy(rec.Name); err != nil {
			errs = append(errs, fmt.Errorf("destroy sandbox: %w", err))
		}
		if err := e.removeExecs(rec.Name); err != nil {
			errs = append(errs, err)
		}
	}
	e.stopLease(rec.Name)
	if rec.Slot >= 0 {
		e.dns.Unregister(rec.Guest)
		if rules.Guest.IsValid() {
			if err := e.fw.RemoveSession(rules); err != nil {
				errs = append(errs, fmt.Errorf("remove rules: %w", err))
			}
			// Nothing keyed by the guest address outlives the session.
			e.namecheck.forget(rec.Name, rules.Guest, rec.Guest6)
		}
	}
	if err := e.nets.Delete(rec.Name, rec.Slot); err != nil {
		errs = append(errs, fmt.Errorf("delete network: %w", err))
	}
	if len(errs) == 0 {
		if err := e.state.Remove(rec.Name); err != nil {
			errs = append(errs, fmt.Errorf("remove record: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete session %s: %w", rec.Name, err)
	}
	return nil
}

// DeleteByLabel deletes every session carrying the label.
func (e *Engine) DeleteByLabel(ctx context.Context, key, value string) ([]string, error) {
	var names []string
	for _, s := range e.List(key, value) {
		names = append(names, s.Name)
	}
	var deleted []string
	var errs []error
	for _, n := range names {
		if err := e.Delete(ctx, n); err != nil && !errors.Is(err, api.ErrNotFound) {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, n)
	}
	return deleted, errors.Join(errs...)
}

// List returns the sessions, filtered by a label when key is set, by name.
func (e *Engine) List(key, value string) []api.SessionInfo {
	e.mu.Lock()
	var ss []*liveSession
	for _, s := range e.sessions {
		if key == "" || s.rec.Request.Labels[key] == value {
			if _, ok := s.rec.Request.Labels[key]; key == "" || ok {
				ss = append(ss, s)
			}
		}
	}
	e.mu.Unlock()
	sort.Slice(ss, func(i, j int) bool { return ss[i].rec.Name < ss[j].rec.Name })
	// One dump of the attested and counter sets serves every session.
	attested, err := e.fw.AllAttested()
	if err != nil {
		e.log.Warn("read attested sets", "err", err)
	}
	counters, err := e.fw.AllCounters()
	if err != nil {
		e.log.Warn("read counters", "err", err)
	}
	out := make([]api.SessionInfo, 0, len(ss))
	for _, s := range ss {
		in := e.summary(s)
		if s.hasNIC() {
			in.Attested = attestedView(attested[s.rec.Guest])
			in.Counters = countersView(counters[s.rec.Guest])
		}
		out = append(out, in)
	}
	return out
}

func attestedView(as []nft.AttestedAddr) []api.AttestedAddr {
	now := time.Now().UTC()
	out := make([]api.AttestedAddr, 0, len(as))
	for _, a := range as {
		out = append(out, api.AttestedAddr{IP: attestedString(a), Expires: now.Add(a.Expires).Truncate(time.Millisecond)})
	}
	return out
}

func countersView(c nft.Counters) api.Counters {
	return api.Counters{
		AcceptedPackets: c.AcceptedPackets, AcceptedBytes: c.AcceptedBytes,
		ReceivedPackets: c.ReceivedPackets, ReceivedBytes: c.ReceivedBytes,
		DroppedPackets: c.DroppedPackets, DroppedBytes: c.DroppedBytes,
		LimitedPackets:  c.LimitedPackets,
		DroppedByReason: c.ByReason, DropsNotLogged: c.Unlogged,
		DroppedNoReason: droppedNoReason(c),
	}
}

// droppedNoReason is the part of the session's dropped packets no reason
// counts (see api.Counters.DroppedNoReason): the reasons of packets that
// are the session's own drops are in DroppedPackets, spoofed and inbound
// ones are not. The sets are read one after the other, so a packet counted
// in between can make the reasons' sum briefly exceed the total: 0 then.
func droppedNoReason(c nft.Counters) uint64 {
	var reasoned uint64
	for r, n := range c.ByReason {
		if r != netpolicy.ReasonSpoofed && r != netpolicy.ReasonInbound {
			reasoned += n
		}
	}
	if reasoned >= c.DroppedPackets {
		return 0
	}
	return c.DroppedPackets - reasoned
}

// Inspect returns a session with its attested set and counters.
func (e *Engine) Inspect(name string) (api.SessionInfo, error) {
	e.mu.Lock()
	s, ok := e.sessions[name]
	e.mu.Unlock()
	if !ok {
		return api.SessionInfo{}, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	return e.info(s), nil
}

// summary is a session without kernel reads (for list).
func (e *Engine) summary(s *liveSession) api.SessionInfo {
	pinned := map[string][]string{}
	for h, as := range s.rec.Pinned {
		for _, a := range as {
			pinned[h] = append(pinned[h], a.String())
		}
	}
	labels := s.rec.Request.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	var dns, dns6 string
	if s.hasNIC() {
		dns = addrString(e.dnsAddr)
		if s.rec.Guest6.IsValid() {
			dns6 = addrString(e.dns6)
		}
	}
	return api.SessionInfo{
		Name:       s.rec.Name,
		Netns:      s.rec.Netns,
		GuestIP:    addrString(s.rec.Guest),
		GatewayIP:  addrString(s.rec.Gateway),
		Guest6IP:   addrString(s.rec.Guest6),
		Gateway6IP: addrString(s.rec.Gateway6),
		DNS6:       dns6,
		HostVeth:   s.rec.HostIface,
		DNS:        dns,
		Egress:     string(s.policy.Egress),
		Policy: api.PolicyView{
			Allow:     entryStrings(s.policy.Allow),
			LabPeers:  s.policy.LabPeers,
			Lab:       s.policy.Lab,
			Pinned:    pinned,
			Deny:      entryStrings(s.policy.Deny),
			OnDeny:    onDeny(s.policy),
			NameCheck: s.policy.NameCheck.String(),
			QUIC:      s.policy.QUIC.String(),

			InboundFromHost: inboundStrings(s.policy.InboundFromHost),
			// A record from before updates existed is generation 1.
			Generation: max(s.rec.Generation, 1),
			Locked:     s.rec.Request.Locked,
			Updated:    s.rec.Updated,
			Grants:     grantViews(s.rec.Grants, sessionLimits{}, nil),
		},
		Sandbox:     s.rec.Sandbox,
		Rootfs:      s.rec.Request.Rootfs,
		Image:       s.rec.Request.Image,
		NetnsPath:   s.rec.Request.NetnsPath,
		IfName:      s.rec.Request.IfName,
		ContainerID: s.rec.Request.ContainerID,
		VM:          e.vmView(s.rec),
		SandboxView: sandboxView(s.rec),
		Attested:    []api.AttestedAddr{},
		NameCheck:   e.nameCheckView(s),
		Labels:      labels,
		Created:     s.rec.Created,
	}
}

// sandboxView is what a session's sandbox holds: the request's limits, or
// the defaults container applies to a limit left at zero (sandboxSpec
// passes the request's values on unchanged). Nil without a sandbox.
func sandboxView(rec SessionRecord) *api.SandboxView {
	if !rec.Sandbox {
		return nil
	}
	req := rec.Request
	v := &api.SandboxView{
		MemoryBytes: req.MemoryBytes, Pids: req.Pids, CPUs: req.CPUs,
		NetRaw: req.NetRaw, Writable: req.Writable,
	}
	if v.MemoryBytes == 0 {
		v.MemoryBytes = rules.DefaultMemoryBytes
	}
	if v.Pids == 0 {
		v.Pids = rules.DefaultPidsMax
	}
	if v.CPUs == 0 {
		v.CPUs = rules.DefaultCPUs
	}
	return v
}

// info is summary plus the kernel's view: attested set and counters.
func (e *Engine) info(s *liveSession) api.SessionInfo {
	in := e.summary(s)
	if !s.hasNIC() {
		return in
	}
	if att, err := e.fw.Attested(s.rec.Guest); err == nil {
		in.Attested = attestedView(att)
	} else {
		e.log.Warn("read attested set", "session", s.rec.Name, "err", err)
	}
	if c, err := e.fw.Counters(s.rec.Guest); err == nil {
		in.Counters = countersView(c)
	} else {
		e.log.Warn("read counters", "session", s.rec.Name, "err", err)
	}
	e.limitViews(s, &in)
	return in
}

// Events returns a session's recorded events and, with follow, new ones.
// A removed session's events are readable while its file is kept (serve
// --events-retention).
func (e *Engine) Events(ctx context.Context, name string, follow bool) ([]api.Event, <-chan api.Event, error) {
	return e.events.Read(ctx, name, follow)
}

// AllEvents returns the live sessions' recorded events carrying the label
// and, with follow, every later event of such a session.
func (e *Engine) AllEvents(ctx context.Context, key, value string, follow bool) ([]api.Event, <-chan api.Event, error) {
	recorded, ch := e.events.ReadAll(ctx, key, value, follow)
	return recorded, ch, nil
}

// Healthy reports whether the daemon enforces what it says: its table and
// base chains are in the kernel, the DNS interface holds the anycast
// address, and the DNS proxy's serve loops run (checked on a daemon made
// by Open; the process also ends when they stop, but a probe must not
// answer ok in between).
func (e *Engine) Healthy() error {
	if err := e.fw.Check(); err != nil {
		return err
	}
	if err := e.nets.CheckDNSInterface(); err != nil {
		return err
	}
	if e.proxy != nil {
		return e.proxy.Serving()
	}
	return nil
}

// lifecycle records an event the daemon made by itself (adopted, reaped).
func (e *Engine) lifecycle(name, action string, detail map[string]any) {
	ev := api.Event{Time: time.Now().UTC(), Session: name, Kind: api.EventKindLifecycle, Action: action, Detail: detail}
	e.events.Record(ev)
	e.logEvent(ev)
}

// recordCall records the event of an API call: its caller (from the
// socket's peer credentials), detail, and outcome: detail.outcome "ok",
// or "error" with detail.error the call's one-line error. logAttrs go to
// the log line only.
func (e *Engine) recordCall(ctx context.Context, name, action string, detail map[string]any, err error, logAttrs ...any) {
	if detail == nil {
		detail = map[string]any{}
	}
	detail["outcome"] = "ok"
	if err != nil {
		detail["outcome"], detail["error"] = "error", api.OneLine(err.Error())
	}
	ev := api.Event{Time: time.Now().UTC(), Session: name, Kind: api.EventKindLifecycle, Action: action, Detail: detail}
	if c, ok := api.CallerFrom(ctx); ok {
		ev.Caller = &c
	}
	e.events.Record(ev)
	e.logEvent(ev, logAttrs...)
}

// logEvent writes a lifecycle event as one INFO line with structured
// fields (session, action, caller_uid, caller_gid, caller_pid, and the
// detail's keys in order): under systemd the journal's record of every
// change.
func (e *Engine) logEvent(ev api.Event, extra ...any) {
	attrs := []any{"session", ev.Session, "action", ev.Action}
	if ev.Caller != nil {
		attrs = append(attrs, "caller_uid", ev.Caller.UID, "caller_gid", ev.Caller.GID, "caller_pid", ev.Caller.PID)
	}
	keys := make([]string, 0, len(ev.Detail))
	for k := range ev.Detail {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		attrs = append(attrs, k, ev.Detail[k])
	}
	e.log.Info("session "+strings.ReplaceAll(ev.Action, "_", " "), append(attrs, extra...)...)
}

// createEssentials is what a create event says of the request: the policy
// asked for (scope URLs without their userinfo), the image and labels.
func createEssentials(req api.CreateRequest) map[string]any {
	d := map[string]any{}
	if req.ForkOf != "" {
		d["fork_of"] = req.ForkOf
	}
	if req.VM {
		d["vm"], d["tap"], d["mac"] = true, req.Tap, req.MAC
	}
	if req.Egress != "" {
		d["egress"] = req.Egress
	}
	if len(req.Deny) > 0 {
		d["deny"] = req.Deny
	}
	if req.EgressBudget > 0 {
		d["egress_budget"] = req.EgressBudget
	}
	if req.OnDeny != "" {
		d["on_deny"] = req.OnDeny
	}
	if req.NameCheck != "" {
		d["name_check"] = req.NameCheck
	}
	if req.QUIC != "" {
		d["quic"] = req.QUIC
	}
	if len(req.InboundFromHost) > 0 {
		d["inbound_from_host"] = req.InboundFromHost
	}
	if req.Rootfs != "" {
		d["rootfs"] = req.Rootfs
	}
	if req.Image != "" {
		d["image"] = req.Image
	}
	if len(req.Allow) > 0 {
		d["allow"] = req.Allow
	}
	if len(req.Scope) > 0 {
		d["scope"] = stripScopes(req.Scope)
	}
	if len(req.Labels) > 0 {
		d["labels"] = req.Labels
	}
	if req.NetworkOnly {
		d["network_only"] = true
	}
	return d
}

// stripScopes returns the scope URLs without userinfo.
func stripScopes(scopes []string) []string {
	if scopes == nil {
		return nil
	}
	out := make([]string, len(scopes))
	for i, s := range scopes {
		out[i] = netpolicy.StripUserinfo(s)
	}
	return out
}

// dnsEventSink is the DNS proxy's event sink (dnsproxy.EventSink): Open
// hands it to the proxy, and every decision becomes a dns event of its
// session.
type dnsEventSink struct{ e *Engine }

// Record is dnsproxy.EventSink's method: recordDNSDecision.
func (s dnsEventSink) Record(ev dnsproxy.Event) { s.e.recordDNSDecision(ev) }

// recordDNSDecision turns one of the DNS proxy's decisions into a dns
// event of its session, remembering an allowed answer's names for the
// flow events of its addresses.
func (e *Engine) recordDNSDecision(ev dnsproxy.Event) {
	detail := map[string]any{"name": ev.Name, "type": ev.Type}
	if len(ev.Addrs) > 0 {
		detail["addrs"] = addrStrings(ev.Addrs)
	}
	if len(ev.Dropped) > 0 {
		detail["dropped"] = addrStrings(ev.Dropped)
	}
	if ev.Upstream != "" {
		detail["upstream"] = ev.Upstream
		detail["upstream_ms"] = float64(ev.Latency.Microseconds()) / 1000
	}
	if ev.Err != "" {
		detail["error"] = ev.Err
	}
	action := ev.Verdict
	if action == dnsproxy.VerdictAllowed && len(ev.Addrs) == 0 && len(ev.Dropped) > 0 {
		// Every address the answer had was filtered out: the session got
		// none, which "allowed" would hide.
		action = api.DNSActionFiltered
	}
	if ev.Session != "" {
		if ev.Verdict == dnsproxy.VerdictAllowed {
			e.names.remember(ev.Session, ev.Name, ev.Type, ev.Addrs)
		}
		e.events.RecordAsync(api.Event{Time: ev.Time.UTC(), Session: ev.Session, Kind: api.EventKindDNS, Action: action, Detail: detail})
	}
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func addrStrings(as []netip.Addr) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

func onDeny(p netpolicy.Policy) string { return p.OnDeny.String() }

// DefaultOnDeny is what a session's policy drops get when a create (or a
// replacing update) names no --on-deny: ICMP administratively prohibited,
// which a client reads at once as "No route to host" and a scanner as
// filtered. A session with egress none has nothing to answer: drop.
const DefaultOnDeny = "reject"

// defaultOnDeny writes the default answer into a request that names none,
// so the record says what the session was created with: a later default
// never changes it, and an old record without on_deny stays a drop.
func defaultOnDeny(req *api.CreateRequest, p *netpolicy.Policy) {
	if req.OnDeny != "" {
		return
	}
	if p.Egress == netpolicy.ModeNone {
		req.OnDeny = netpolicy.DenyDrop.String()
		return
	}
	req.OnDeny = DefaultOnDeny
	p.OnDeny = netpolicy.DenyReject
}

func inboundStrings(ps []netpolicy.PortSpec) []string {
	var out []string
	for _, p := range ps {
		out = append(out, netpolicy.InboundString(p))
	}
	return out
}

func entryStrings(es []netpolicy.Entry) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.String())
	}
	slices.Sort(out)
	return out
}

// attestedString renders an attested element: "198.18.1.10" or, for a
// port-constrained name, "198.18.1.10:443/tcp".
func attestedString(a nft.AttestedAddr) string {
	if a.Port == 0 {
		return a.IP.String()
	}
	return netip.AddrPortFrom(a.IP, a.Port).String() + "/" + string(a.Proto) // [v6]:port for IPv6
}

// SessionCount is the number of live sessions (for the metrics).
func (e *Engine) SessionCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.sessions)
}

// DNSStats are the DNS proxy's counters (for the metrics).
func (e *Engine) DNSStats() dnsproxy.Stats { return e.dns.Stats() }

// SessionCounters reads every session's counters (for the metrics), in one
// dump of the counter sets.
func (e *Engine) SessionCounters() map[string]nft.Counters {
	all, err := e.fw.AllCounters()
	if err != nil {
		e.log.Warn("read counters", "err", err)
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]nft.Counters{}
	for name, s := range e.sessions {
		if s.hasNIC() {
			out[name] = all[s.rec.Guest]
		}
	}
	return out
}
