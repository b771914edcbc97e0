package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// why answers "what does this session's policy do with DEST now, and why"
// from the session's policy, the guard and the kernel's attested set; a
// name the policy allows is resolved through the upstreams (a name it does
// not allow is never sent anywhere, as the proxy would not send it).

// whyDest is a parsed DEST[:PORT][/PROTO].
type whyDest struct {
	name  string     // a host name, or "" for an address
	addr  netip.Addr // an address, or zero for a name
	port  uint16     // 0: any port
	proto netpolicy.Proto
}

// parseWhyDest parses NAME|IPv4[:PORT][/tcp|udp], or an IPv6 address as
// IPv6 or [IPv6][:PORT][/tcp|udp] (the entry grammar's forms).
func parseWhyDest(s string) (whyDest, error) {
	var d whyDest
	in := s
	v6 := ""
	if i := strings.LastIndexByte(s, '/'); i >= 0 {
		switch p := strings.ToLower(s[i+1:]); p {
		case "tcp":
			d.proto = netpolicy.ProtoTCP
		case "udp":
			d.proto = netpolicy.ProtoUDP
		default:
			return d, fmt.Errorf("destination %q: protocol %q: want tcp or udp", in, s[i+1:])
		}
		s = s[:i]
	}
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return d, fmt.Errorf("destination %q: want [IPv6]:PORT", in)
		}
		v6, s = s[1:end], s[end+1:]
		if s != "" && !strings.HasPrefix(s, ":") {
			return d, fmt.Errorf("destination %q: want [IPv6]:PORT", in)
		}
	case strings.Count(s, ":") > 1: // a bare IPv6 address: no port
		v6, s = s, ""
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		n, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || n == 0 {
			return d, fmt.Errorf("destination %q: port %q: want 1 to 65535", in, s[i+1:])
		}
		d.port = uint16(n)
		s = s[:i]
	}
	if d.proto != netpolicy.ProtoAny && d.port == 0 {
		return d, fmt.Errorf("destination %q: a protocol needs a port, e.g. %s:443/%s", in, s, d.proto)
	}
	if d.port != 0 && d.proto == netpolicy.ProtoAny {
		d.proto = netpolicy.ProtoTCP
	}
	if v6 != "" {
		a, err := netip.ParseAddr(v6)
		if err != nil || !a.Is6() || a.Zone() != "" || a.Is4In6() {
			return d, fmt.Errorf("destination %q: IPv6 address %q: want one without a zone, not v4-mapped", in, v6)
		}
		d.addr = a
		return d, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if !a.Is4() {
			return d, fmt.Errorf("destination %q: sessions are IPv4 only; want an IPv4 address or a name", in)
		}
		d.addr = a
		return d, nil
	}
	name, err := netpolicy.NormalizeName(s)
	if err != nil {
		return d, fmt.Errorf("destination %q: want a name or an IPv4 address, optionally :PORT and /tcp or /udp: %v", in, err)
	}
	d.name = name
	return d, nil
}

// Why is GET /v1/sessions/{name}/why.
func (e *Engine) Why(ctx context.Context, name, dest, sni string) (api.WhyAnswer, error) {
	d, err := parseWhyDest(dest)
	if err != nil {
		return api.WhyAnswer{}, badRequest(err)
	}
	if sni == "" {
		return e.why(ctx, name, dest, d)
	}
	if d.port == 0 || d.proto != netpolicy.ProtoTCP {
		return api.WhyAnswer{}, badRequest(fmt.Errorf("--sni %q: the name check reads TCP flows; want DEST with a TCP port, e.g. %s:443", sni, strings.TrimSuffix(dest, "/udp")))
	}
	ans, err := e.why(ctx, name, dest, d)
	if err != nil || ans.Verdict != api.WhyAllowed {
		return ans, err
	}
	e.mu.Lock()
	s, ok := e.sessions[name]
	e.mu.Unlock()
	if !ok {
		return ans, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	return whyNameCheck(s.policy, d, ans, sni), nil
}

// whyNameCheck is what the name check makes of an allowed answer for a
// flow that asks for sni: the flows it reads are those a name admitted
// (an attested address; a name; in public mode with deny entries by
// name, any).
func whyNameCheck(p netpolicy.Policy, d whyDest, ans api.WhyAnswer, sni string) api.WhyAnswer {
	byName := ans.Reason == "attested" || ans.Reason == "pinned" || d.name != "" && p.Egress == netpolicy.ModeAllowlist
	if p.Egress == netpolicy.ModePublic {
		byName = slices.ContainsFunc(p.Deny, func(e netpolicy.Entry) bool { return e.Kind != netpolicy.KindCIDR })
	}
	switch {
	case !byName:
		ans.Detail += "; the name asked for is not checked here (not admitted because of a name)"
		return ans
	case p.NameCheck == netpolicy.NameCheckOff:
		ans.Detail += "; the name check is off: any name asked of it passes"
		return ans
	}
	if a, err := netip.ParseAddr(sni); err == nil && a.Is4() {
		ans.Detail += "; an address as the name passes the name check (it names the address)"
		return ans
	}
	lacked, ok := nameAllowed(p, sni, d.port, false)
	if ok {
		ans.Detail += fmt.Sprintf("; the name check allows %s on port %d", sni, d.port)
		return ans
	}
	ans.Verdict, ans.Addrs = api.WhyDropped, nil
	if p.OnDeny.Answers() {
		ans.Verdict = api.WhyRejected
	}
	ans.Reason, ans.Entry = netpolicy.ReasonNameMismatch, lacked
	ans.Detail = fmt.Sprintf("a TCP flow to %s asking for %s (TLS server_name or HTTP Host) is refused by the name check: the policy lacks %s", ans.Dest, sni, lacked)
	return ans
}

func (e *Engine) why(ctx context.Context, name, dest string, d whyDest) (api.WhyAnswer, error) {
	e.mu.Lock()
	s, ok := e.sessions[name]
	e.mu.Unlock()
	if !ok {
		return api.WhyAnswer{}, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	ans := api.WhyAnswer{Session: name, Dest: dest}
	if !s.hasNIC() {
		ans.Verdict, ans.Reason, ans.Detail = api.WhyDropped, "no-network", "egress none: the session has no interface, no route and no DNS"
		return ans, nil
	}
	if d.addr.Is6() && !s.rec.Guest6.IsValid() {
		ans.Verdict, ans.Reason = api.WhyDropped, "not-allowed"
		ans.Detail = "the session has no IPv6 (a daemon without --pool6, or an attached or VM session): IPv6 is off in its netns"
		return ans, nil
	}
	if d.name == "" {
		attested, err := e.attestedOf(s)
		if err != nil {
			return ans, err
		}
		v := e.whyAddr(s, d, d.addr, attested)
		ans.Verdict, ans.Reason, ans.Detail, ans.Entry = v.Verdict, v.Reason, v.Detail, v.entry
		ans.AttestedName, ans.AttestedType = v.AttestedName, v.AttestedType
		if v.Reason == "not-allowed" {
			if ent, g, ok := e.endedGrantFor(s, "", d.addr); ok {
				ans.Reason, ans.Entry, ans.Detail = ReasonGrantExpired, ent, grantExpiredDetail(ent, g)
			}
		}
		if v.Verdict == api.WhyAllowed {
			if reason, entry, detail, ok := e.limitVerdict(s, d.addr, d.port, d.proto); ok {
				ans.Verdict, ans.Reason, ans.Detail = e.denyVerdict(s), reason, detail
				if entry != "" {
					ans.Entry = entry
				}
			}
		}
		return ans, nil
	}
	ans, err := e.whyName(ctx, s, d, ans)
	if err == nil && ans.Verdict == api.WhyAllowed {
		// The session's egress budget, or the count or budget of a name
		// entry that matches the name.
		if reason, entry, detail, ok := e.limitVerdictName(s, d.name, d.port, d.proto); ok {
			ans.Verdict, ans.Reason, ans.Detail = e.denyVerdict(s), reason, detail
			if entry != "" {
				ans.Entry = entry
			}
		}
	}
	return ans, err
}

func (e *Engine) attestedOf(s *liveSession) ([]nft.AttestedAddr, error) {
	if s.policy.Egress != netpolicy.ModeAllowlist {
		return nil, nil
	}
	att, err := e.fw.Attested(s.rec.Guest)
	if err != nil {
		return nil, fmt.Errorf("why: read the attested set of %s: %w", s.rec.Name, err)
	}
	return att, nil
}

// whyName answers for a name: does the policy allow it (else NXDOMAIN),
// and what each of its addresses would meet.
func (e *Engine) whyName(ctx context.Context, s *liveSession, d whyDest, ans api.WhyAnswer) (api.WhyAnswer, error) {
	if den, ok := s.policy.DeniedName(d.name); ok {
		ans.Verdict, ans.Reason, ans.Entry = api.WhyNXDomain, netpolicy.ReasonDenied, den.String()
		ans.Detail = fmt.Sprintf("denied by %q: the proxy answers NXDOMAIN and never asks upstream", den.String())
		return ans, nil
	}
	var entry *netpolicy.Entry
	switch s.policy.Egress {
	case netpolicy.ModePublic:
	default:
		for i, en := range s.policy.Allow {
			if en.Kind != netpolicy.KindCIDR && en.MatchesName(d.name) {
				entry = &s.policy.Allow[i]
				break
			}
		}
		if entry == nil {
			ans.Verdict, ans.Reason = api.WhyNXDomain, "not-allowed"
			ans.Detail = fmt.Sprintf("no allow entry matches %s: the proxy answers NXDOMAIN and never asks upstream", d.name)
			if ent, g, ok := e.endedGrantFor(s, d.name, netip.Addr{}); ok {
				ans.Reason, ans.Entry = ReasonGrantExpired, ent
				ans.Detail = grantExpiredDetail(ent, g) + "; the proxy answers NXDOMAIN and never asks upstream"
			}
			return ans, nil
		}
		ans.Entry = entry.String()
	}
	var addrs []netip.Addr
	pinned, isPinned := s.rec.Pinned[d.name]
	switch {
	case isPinned:
		addrs = pinned
	case e.pin != nil:
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := e.pin(rctx, d.name)
		cancel()
		if err != nil {
			ans.Verdict, ans.Reason = api.WhyAllowed, "allowed"
			ans.Detail = fmt.Sprintf("the policy allows %s, but it does not resolve now: %v", d.name, err)
			return ans, nil
		}
		addrs = got
	}
	attested, err := e.attestedOf(s)
	if err != nil {
		return ans, err
	}
	ans.Verdict, ans.Reason = api.WhyAllowed, "allowed"
	ans.Detail = fmt.Sprintf("the policy allows %s", d.name)
	if entry != nil {
		ans.Detail = fmt.Sprintf("allowed by %q", entry.String())
	}
	if isPinned {
		ans.Detail += "; pinned at create"
	}
	var given, removed []api.WhyAddr // the addresses the guest gets, and those the proxy removes
	for _, a := range addrs {
		v := e.whyAddr(s, d, a, attested)
		if !isPinned && v.Reason == "not-allowed" && e.guard.IsPublicUnicast(a) {
			v.Verdict, v.Reason = api.WhyAllowed, "attested-on-answer"
			v.Detail = "not attested now; a lookup through the proxy attests it before the answer"
			if entry != nil && entry.Port != 0 && d.port != 0 && (entry.Port != d.port || (entry.Proto != netpolicy.ProtoAny && entry.Proto != d.proto)) {
				v.Verdict, v.Reason = e.denyVerdict(s), "port"
				v.Detail = fmt.Sprintf("a lookup attests it for %s only", strings.TrimPrefix(entry.PortSpec.String(), ":"))
			}
		}
		if _, denied := s.policy.DeniedAddr(a, 0, ""); denied || (!e.guard.IsPublicUnicast(a) && !isPinned) {
			v.Detail += "; the proxy removes it from the answer"
			removed = append(removed, v.WhyAddr)
		} else {
			given = append(given, v.WhyAddr)
		}
		ans.Addrs = append(ans.Addrs, v.WhyAddr)
	}
	destVerdict(&ans, d, given, removed)
	return ans, nil
}

// destVerdict makes the answer's own verdict the verdict of the destination
// as asked, not only of the name: a program connects to whichever address
// the answer gives it, so one address dropped on the port asked is a
// connection that fails, and an agent reading only .verdict must not be
// told yes (issue 27 finding 8). The addresses the proxy removes from the
// answer never reach the guest and decide only when it gets none.
func destVerdict(ans *api.WhyAnswer, d whyDest, given, removed []api.WhyAddr) {
	considered := given
	if len(considered) == 0 {
		considered = removed
	}
	var bad []api.WhyAddr
	for _, v := range considered {
		if v.Verdict != api.WhyAllowed {
			bad = append(bad, v)
		}
	}
	if len(bad) == 0 {
		return
	}
	first := bad[0]
	on := ""
	if d.port != 0 {
		on = fmt.Sprintf(" on %d/%s", d.port, d.proto)
	}
	ans.Verdict, ans.Reason = first.Verdict, first.Reason
	if len(bad) == len(considered) {
		ans.Detail = fmt.Sprintf("%s, but every address it resolves to is %s%s: %s %s", ans.Detail, first.Verdict, on, first.IP, first.Detail)
	} else {
		ans.Detail = fmt.Sprintf("%s, but %d of its %d addresses are %s%s: %s %s", ans.Detail, len(bad), len(considered), first.Verdict, on, first.IP, first.Detail)
	}
}

// denyVerdict is the verdict of a packet the session's policy does not
// accept: "dropped", or "rejected" when the session answers it (any
// on-deny but drop: the kernel answers the session's own packets the
// reason chains refuse, see netpolicy's drop_policy).
func (e *Engine) denyVerdict(s *liveSession) string {
	if onDeny(s.policy) != "drop" {
		return api.WhyRejected
	}
	return api.WhyDropped
}

type whyAddrResult struct {
	api.WhyAddr
	entry string
}

// whyAddr is the verdict of the table for one address (and d's port).
func (e *Engine) whyAddr(s *liveSession, d whyDest, a netip.Addr, attested []nft.AttestedAddr) whyAddrResult {
	r := whyAddrResult{WhyAddr: api.WhyAddr{IP: a.String()}}
	refused := e.denyVerdict(s)
	set := func(verdict, reason, detail string) whyAddrResult {
		r.Verdict, r.Reason, r.Detail = verdict, reason, detail
		return r
	}
	if a == s.rec.Guest || (s.rec.Guest6.IsValid() && a == s.rec.Guest6) {
		return set(api.WhyAllowed, "self", "the session's own address: it never leaves the session's netns")
	}
	if (a == e.dnsAddr || (e.dns6.IsValid() && a == e.dns6)) && (d.port == 0 || d.port == 53) {
		return set(api.WhyAllowed, "resolver", "the DNS proxy on the anycast address")
	}
	// A deny wins over every allow: lab peers, public mode, static and
	// attested elements (the policy chain's first rules).
	if den, ok := deniedAddr(s.policy, a, d.port, d.proto); ok {
		r.entry = den.String()
		return set(refused, netpolicy.ReasonDenied, fmt.Sprintf("denied by %q: %s before any accept", den.String(), refused))
	}
	for _, p := range s.rules.Peers {
		if p == a || (a.Is6() && e.guest6Of(p) == a) {
			return set(api.WhyAllowed, "lab-peer", "a lab target this session was peered with")
		}
	}
	if !e.guard.IsPublicUnicast(a) {
		detail := "special-purpose address: refused in every mode"
		if rg, ok := e.guard.BlockedBy(a); ok {
			detail = fmt.Sprintf("special-purpose: %s, refused in every mode", rg)
		}
		return set(refused, "special-purpose", detail)
	}
	static := s.rules.Static
	if d.port == 53 || d.port == 853 {
		for _, t := range static {
			if t.Prefix.Contains(a) && t.Port == d.port && (t.Proto == netpolicy.ProtoAny || t.Proto == d.proto) {
				r.entry = targetString(t)
				return set(api.WhyAllowed, "static", fmt.Sprintf("an entry names the resolver port: %s", targetString(t)))
			}
		}
		// (an allowed name with the port, --allow NAME:53, attests its
		// addresses with it: the resolver chain accepts those too)
		for _, at := range attested {
			if at.IP == a && at.Port == d.port && (at.Proto == netpolicy.ProtoAny || at.Proto == d.proto) {
				exp := time.Now().UTC().Add(at.Expires).Truncate(time.Second)
				r.Expires = &exp
				detail := fmt.Sprintf("an allowed name names the resolver port: %s, attested until %s", attestedString(at), exp.Format(time.RFC3339))
				if q, ok := e.names.lookupRecord(s.rec.Name, a); ok {
					r.AttestedName, r.AttestedType = q.name, q.qtype
					detail = fmt.Sprintf("an allowed name names the resolver port: %s, attested by the %s answer for %s until %s", attestedString(at), q.qtype, q.name, exp.Format(time.RFC3339))
				}
				return set(api.WhyAllowed, "attested", detail)
			}
		}
		return set(refused, "resolver", "DNS and DoT go to the proxy only; no entry names this port")
	}
	if s.policy.Egress == netpolicy.ModePublic {
		return set(api.WhyAllowed, "public", "egress public: every public unicast destination")
	}
	var otherPorts []string
	match := func(port uint16, proto netpolicy.Proto) bool {
		return port == 0 || d.port == 0 || (port == d.port && (proto == netpolicy.ProtoAny || proto == d.proto))
	}
	for _, t := range static {
		if !t.Prefix.Contains(a) {
			continue
		}
		if match(t.Port, t.Proto) {
			r.entry = targetString(t)
			reason := "static"
			if t.Prefix.Bits() == 32 && s.isPinnedAddr(a) {
				reason = "pinned"
			}
			return set(api.WhyAllowed, reason, fmt.Sprintf("in the session's static set: %s", targetString(t)))
		}
		otherPorts = append(otherPorts, targetString(t))
	}
	now := time.Now().UTC()
	for _, at := range attested {
		if at.IP != a {
			continue
		}
		if match(at.Port, at.Proto) {
			exp := now.Add(at.Expires).Truncate(time.Second)
			r.Expires = &exp
			by := "a DNS answer"
			if q, ok := e.names.lookupRecord(s.rec.Name, a); ok {
				r.AttestedName, r.AttestedType = q.name, q.qtype
				by = fmt.Sprintf("the %s answer for %s", q.qtype, q.name)
			}
			return set(api.WhyAllowed, "attested", fmt.Sprintf("attested by %s until %s", by, exp.Format(time.RFC3339)))
		}
		otherPorts = append(otherPorts, attestedString(at))
	}
	if len(otherPorts) > 0 {
		return set(refused, "port", fmt.Sprintf("allowed on other ports only: %s", strings.Join(otherPorts, ", ")))
	}
	if name, ok := e.names.lookup(s.rec.Name, a); ok {
		return set(refused, ReasonExpired, fmt.Sprintf("attested for %s, and expired: resolve the name again (or pin it)", name))
	}
	return set(refused, "not-allowed", "no entry and nothing attested for this address")
}

func (s *liveSession) isPinnedAddr(a netip.Addr) bool {
	for _, as := range s.rec.Pinned {
		for _, p := range as {
			if p == a {
				return true
			}
		}
	}
	return false
}

func targetString(t netpolicy.Target) string {
	s := t.Prefix.String()
	switch {
	case t.Prefix.IsSingleIP() && t.Prefix.Addr().Is6() && t.Port != 0:
		s = "[" + t.Prefix.Addr().String() + "]"
	case t.Prefix.IsSingleIP():
		s = t.Prefix.Addr().String()
	}
	return s + netpolicy.PortSpec{Port: t.Port, Proto: t.Proto}.String()
}

// deniedAddr is the deny entry the table applies to a on port and proto: a
// v6 deny entry drops its range on every port (the table's denied6).
func deniedAddr(p netpolicy.Policy, a netip.Addr, port uint16, proto netpolicy.Proto) (netpolicy.Entry, bool) {
	if a.Is6() {
		for _, e := range p.Deny {
			if e.Kind == netpolicy.KindCIDR && e.Prefix.Contains(a) {
				return e, true
			}
		}
		return netpolicy.Entry{}, false
	}
	return p.DeniedAddr(a, port, proto)
}

// guest6Of is the v6 address of the session whose v4 address is guest
// (invalid for none, or one without IPv6).
func (e *Engine) guest6Of(guest netip.Addr) netip.Addr {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.sessions {
		if s.rec.Guest == guest {
			return s.rec.Guest6
		}
	}
	return netip.Addr{}
}
