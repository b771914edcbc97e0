package dnsproxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/netpolicy"
)

const (
	// maxUDPResponse caps the UDP payload size the proxy sends, whatever
	// the client advertises.
	maxUDPResponse = 4096
	// ednsSize is the UDP payload size the proxy advertises to clients and
	// upstreams (the DNS flag day 2020 value).
	ednsSize = 1232
	// ttlMargin is kept between the attestation's expiry and the TTL a
	// client sees: the answer leaves after the set insert, and TTLs are whole
	// seconds, so a cache entry must end at least this much earlier.
	ttlMargin = time.Second
)

// ErrAttest is wrapped by the error recorded in an Event when the Attester
// failed and the answer became SERVFAIL.
var ErrAttest = errors.New("attest failed")

// handle answers one raw query that arrived from src over UDP (tcp=false)
// or TCP. It returns the packed reply, or nil when the packet must be
// dropped without an answer (it did not parse, or it was not a query). Every
// decision is counted, logged at debug level and sent to the event sink.
//
// handle is the seam unit tests and the fuzz target drive directly: it does
// no socket I/O of its own except through the upstream Dial function.
func (p *Proxy) handle(ctx context.Context, src netip.Addr, raw []byte, tcp bool) []byte {
	x := p.parse(ctx, src, raw, tcp)
	if x == nil {
		return nil
	}
	if x.decide(p) {
		up, idx, rtt, err := p.forwardFor(ctx, x.s, x.q, x.flags)
		x.useUpstream(p, up, idx, rtt, err)
	}
	return p.finish(ctx, x)
}

// handleAsync is handle for a UDP query that does not wait for the
// upstream: to.send is called exactly once, with what handle would return,
// either before handleAsync returns (no upstream needed, or the packet is
// dropped: then with nil) or later, from the goroutine that got the
// upstream's answer (see forwardAsync). The answer's addresses are
// attested before to.send is called, as in handle. The decision is
// recorded after the send (the client does not wait for the event sink),
// and to.done is called last. raw is not kept after handleAsync returns.
func (p *Proxy) handleAsync(src netip.Addr, raw []byte, to replier) {
	ctx := p.ctx
	x := p.parse(ctx, src, raw, false)
	if x == nil {
		to.send(nil)
		to.done()
		return
	}
	if !x.decide(p) {
		p.release(ctx, x, to)
		return
	}
	x.to = to
	x.up = asyncQuery{ctx: x.s.ctx, q: x.q, flags: x.flags, done: x}
	p.forwardAsync(&x.up)
}

// forwarded completes x, a UDP query handleAsync sent upstream, from the
// upstream's answer (or error), and releases its reply.
func (x *queryState) forwarded(up *dns.Msg, idx int, rtt time.Duration, err error) {
	p := x.up.p
	x.useUpstream(p, up, idx, rtt, p.sessionErr(x.s, err))
	p.release(p.ctx, x, x.to)
}

// A replier takes one UDP query's reply: send writes it (nil: none),
// done follows once the decision is recorded (it frees the query's slot).
type replier interface {
	send(out []byte)
	done()
}

// release sends x's reply through to, then records the decision.
func (p *Proxy) release(ctx context.Context, x *queryState, to replier) {
	to.send(p.pack(x))
	p.record(ctx, x.ev)
	to.done()
}

// queryState is one query's state on its way through handle: the request,
// the reply being built and the event describing it, and what decide
// found for the upstream part.
type queryState struct {
	tcp   bool
	req   *dns.Msg
	resp  *dns.Msg
	ev    Event
	s     *compiledSession // nil: an unknown source
	q     dns.Question
	key   string // the lowercased name without its final dot
	flags queryFlags
	ports []netpolicy.PortSpec
	hints bool

	// A UDP query forwarded without waiting (handleAsync): the upstream
	// part of its state and where its reply goes.
	up asyncQuery
	to replier
}

// parse unpacks raw; it returns nil when the packet is to be dropped
// without an answer (counted and logged).
func (p *Proxy) parse(ctx context.Context, src netip.Addr, raw []byte, tcp bool) *queryState {
	req := new(dns.Msg)
	if err := req.Unpack(raw); err != nil || req.Response {
		p.stats.malformed.Add(1)
		if p.log.Enabled(ctx, slog.LevelDebug) {
			p.log.Debug("dnsproxy: dropped malformed packet", "client", src, "len", len(raw), "err", err)
		}
		return nil
	}
	x := &queryState{tcp: tcp, req: req, ev: Event{Time: time.Now(), Client: src}, s: p.session(src)}
	if len(req.Question) > 0 {
		x.ev.Name = req.Question[0].Name
		x.ev.Type = dns.TypeToString[req.Question[0].Qtype]
	}
	return x
}

// finish packs x's reply (truncated to what the client takes), records
// the decision and returns the packed reply.
func (p *Proxy) finish(ctx context.Context, x *queryState) []byte {
	out := p.pack(x)
	p.record(ctx, x.ev)
	return out
}

// pack packs x's reply, truncated to what the client takes; a reply that
// does not pack becomes SERVFAIL (x.ev says so).
func (p *Proxy) pack(x *queryState) []byte {
	req, resp, ev := x.req, x.resp, &x.ev
	ev.Rcode = dns.RcodeToString[resp.Rcode]
	size := dns.MaxMsgSize
	if !x.tcp {
		size = dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = min(max(int(opt.UDPSize()), dns.MinMsgSize), maxUDPResponse)
		}
	}
	resp.Truncate(size)
	out, err := resp.Pack()
	if err != nil {
		// An upstream record we cannot re-encode: fail closed.
		ev.Verdict, ev.Rcode, ev.Err, ev.Addrs = VerdictServfail, "SERVFAIL", "pack reply: "+err.Error(), nil
		fail := new(dns.Msg)
		fail.SetRcode(req, dns.RcodeServerFailure)
		fail.RecursionAvailable = true
		out, _ = fail.Pack()
	}
	return out
}

// decide starts x's reply and decides it as far as it can without an
// upstream: it reports true when the name is to be forwarded (then
// useUpstream completes the reply), false when x.resp is the reply.
func (x *queryState) decide(p *Proxy) bool {
	s, req, ev := x.s, x.req, &x.ev
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	x.resp = resp
	reply := func(verdict string, rcode int) bool {
		ev.Verdict = verdict
		resp.Rcode = rcode
		return false
	}
	if s == nil {
		return reply(VerdictRefused, dns.RcodeRefused)
	}
	ev.Session = s.name
	if req.Opcode != dns.OpcodeQuery {
		return reply(VerdictNotImp, dns.RcodeNotImplemented)
	}
	if len(req.Question) != 1 {
		return reply(VerdictFormerr, dns.RcodeFormatError)
	}
	opt := req.IsEdns0()
	if opt != nil {
		resp.SetEdns0(ednsSize, opt.Do()) // DO mirrored (RFC 3225)
		if opt.Version() != 0 {
			return reply(VerdictFormerr, dns.RcodeBadVers)
		}
	}
	q := req.Question[0]
	x.q = q
	if q.Qclass != dns.ClassINET || q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR {
		return reply(VerdictRefused, dns.RcodeRefused)
	}

	key := lowerASCII(q.Name)
	if len(key) > 1 {
		key = key[:len(key)-1]
	}
	if s.deniedName(q.Name) {
		return reply(VerdictDenied, dns.RcodeNameError) // before pinned names and every mode
	}
	if addrs, ok := s.pinned[key]; ok {
		p.answerPinned(s, q, addrs, resp, ev)
		return false
	}
	var ports []netpolicy.PortSpec
	hints := true
	switch s.mode {
	case netpolicy.ModePublic:
	case netpolicy.ModeAllowlist:
		ok, pp, h := s.match.match(q.Name)
		if !ok {
			return reply(VerdictDenied, dns.RcodeNameError)
		}
		ports, hints = pp, h
	default:
		return reply(VerdictDenied, dns.RcodeNameError)
	}

	x.key, x.ports, x.hints = key, ports, hints
	x.flags = queryFlags{cd: req.CheckingDisabled, do: opt != nil && opt.Do()}
	return true
}

// useUpstream completes x's reply from the upstream's answer up (or err):
// filtered, cut, and its addresses attested before it is returned.
func (x *queryState) useUpstream(p *Proxy, up *dns.Msg, idx int, rtt time.Duration, err error) {
	s, q, key, resp, ev := x.s, x.q, x.key, x.resp, &x.ev
	reply := func(verdict string, rcode int) {
		ev.Verdict = verdict
		resp.Rcode = rcode
	}
	if err != nil {
		ev.Err = err.Error()
		reply(VerdictServfail, dns.RcodeServerFailure)
		return
	}
	ev.Upstream, ev.Latency = p.upstreamAddrs[idx], rtt
	for _, rr := range up.Answer {
		if c, ok := rr.(*dns.CNAME); ok && s.deniedName(c.Target) {
			// An allowed name that is an alias of a denied one: the
			// denied name's addresses must not come in through it.
			ev.Err = "cname " + c.Target + " is denied"
			reply(VerdictDenied, dns.RcodeNameError)
			return
		}
	}
	keep := p.cfg.Guard.IsPublicUnicast
	if len(s.denied) > 0 {
		keep = func(a netip.Addr) bool { return p.cfg.Guard.IsPublicUnicast(a) && !s.deniedAddr(a) }
	}
	f := filterResponseFamilies(q.Name, up, x.hints, keep, s.aaaa)
	if !s.keepECH {
		f.stripECH()
	}
	ev.Dropped = f.dropped
	if n := f.limit(p.cfg.MaxAnswerAddrs); n > 0 {
		ev.Capped = n
		p.stats.answerCap.Add(1)
	}
	// A public session's traffic to any public address is accepted by the
	// firewall's public set: attesting would only grow the kernel's sets.
	if len(f.kept) > 0 && s.mode != netpolicy.ModePublic {
		ttl := max(time.Duration(f.minTTL)*time.Second, p.cfg.MinTTL)
		eff, err := p.attest(s, key, f.kept, ttl, x.ports)
		if err != nil {
			ev.Err = err.Error()
			reply(VerdictServfail, dns.RcodeServerFailure)
			return
		}
		ev.TTL = eff
		capTTLs(f.answer, ttlCap(eff))
	}
	ev.Addrs = f.kept
	if x.flags.do {
		// Signatures stay valid only over what passed unchanged: those over
		// a changed RRset are removed, and the answer is authenticated only
		// when nothing in it changed.
		f.answer = f.withoutStaleSignatures()
		resp.AuthenticatedData = up.AuthenticatedData && len(f.changed) == 0
	}
	resp.Answer, resp.Ns = f.answer, f.ns
	resp.Extra = append(f.extra, resp.Extra...) // keeps our OPT last
	resp.Rcode = up.Rcode
	ev.Verdict = VerdictAllowed
}

// forwardFor is forward for a query of s: its upstream waits end when the
// registration does (s.ctx, which descends from the proxy's context), and
// the error then wraps ErrSessionGone. A caller context other than the
// proxy's own (tests drive handle with their own) is joined to s.ctx.
func (p *Proxy) forwardFor(ctx context.Context, s *compiledSession, q dns.Question, fl queryFlags) (*dns.Msg, int, time.Duration, error) {
	up, idx, rtt, err := p.forwardIn(ctx, s.ctx, q, fl)
	return up, idx, rtt, p.sessionErr(s, err)
}

// sessionErr wraps ErrSessionGone around an upstream error of s that its
// unregistration caused.
func (p *Proxy) sessionErr(s *compiledSession, err error) error {
	if err != nil && s.ctx.Err() != nil && p.ctx.Err() == nil {
		p.stats.sessionGone.Add(1)
		err = fmt.Errorf("%w: session %q (guest %s): %w", ErrSessionGone, s.name, s.guest, err)
	}
	return err
}

// forwardIn runs forward under session context sctx joined with ctx (no
// allocation when ctx is the proxy's own, of which sctx descends, or
// cannot end).
func (p *Proxy) forwardIn(ctx, sctx context.Context, q dns.Question, fl queryFlags) (*dns.Msg, int, time.Duration, error) {
	if ctx == p.ctx || ctx.Done() == nil {
		return p.forward(sctx, q, fl)
	}
	joined, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(sctx, cancel)
	defer stop()
	return p.forward(joined, q, fl)
}

// pinnedTTL is the TTL of a pinned answer when Config.MinTTL is zero.
// Pinned addresses stay in the static sets for the session's life, so any
// TTL is safe; this one keeps caches as fresh as for other names.
const pinnedTTL = 60 * time.Second

// answerPinned answers a pinned name from its pinned addresses: A queries
// get them (after the guard and the session's denied CIDRs); every other type an empty answer. Nothing is
// attested: the session's static sets hold the pinned addresses with their
// entry's port constraint (see SessionPolicy), and attesting them into the
// port-less set would open every port.
func (p *Proxy) answerPinned(s *compiledSession, q dns.Question, addrs []netip.Addr, resp *dns.Msg, ev *Event) {
	ev.Verdict = VerdictPinned
	if q.Qtype != dns.TypeA {
		return
	}
	var kept []netip.Addr
	for _, a := range addrs {
		if p.cfg.Guard.IsPublicUnicast(a) && !s.deniedAddr(a) {
			kept = append(kept, a)
		} else {
			ev.Dropped = append(ev.Dropped, a)
		}
	}
	ttl := ttlCap(cmp.Or(p.cfg.MinTTL, pinnedTTL))
	for _, a := range kept {
		resp.Answer = append(resp.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl},
			A:   a.AsSlice(),
		})
	}
	ev.Addrs = kept
}

// attest inserts addrs into the session's set through the Attester,
// records them under name in the session's attestLog, and returns the
// effective element timeout. It holds the registration's read
// lock across the check and the call, so that Unregister, once it returns,
// knows no attest of it is still running (see compiledSession).
func (p *Proxy) attest(s *compiledSession, name string, addrs []netip.Addr, ttl time.Duration, ports []netpolicy.PortSpec) (time.Duration, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.gone {
		p.stats.sessionGone.Add(1)
		return 0, fmt.Errorf("%w: session %q (guest %s): %d addresses not attested", ErrSessionGone, s.name, s.guest, len(addrs))
	}
	start := time.Now()
	var eff time.Duration
	var err error
	if na, ok := p.cfg.Attester.(NameAttester); ok {
		eff, err = na.AttestName(s.guest, name, addrs, ttl, ports)
	} else {
		eff, err = p.cfg.Attester.Attest(s.guest, addrs, ttl, ports)
	}
	p.stats.attest.observe(time.Since(start))
	if err != nil {
		p.stats.attestErrors.Add(1)
		if errors.Is(err, netpolicy.ErrAttestCap) {
			p.stats.attestCap.Add(1)
		}
		return 0, fmt.Errorf("%w: %d addresses for %s: %w", ErrAttest, len(addrs), s.guest, err)
	}
	if s.attests != nil {
		s.attests.note(name, addrs, ports)
	}
	return eff, nil
}

// ttlCap is the highest TTL a client may see for an address attested with
// element timeout eff.
func ttlCap(eff time.Duration) uint32 {
	if eff <= ttlMargin {
		return 0
	}
	return uint32((eff - ttlMargin) / time.Second)
}

// record counts, logs and publishes one decision.
func (p *Proxy) record(ctx context.Context, ev Event) {
	p.stats.countVerdict(ev.Verdict)
	if p.log.Enabled(ctx, slog.LevelDebug) {
		p.log.Debug("dnsproxy: decision", "session", ev.Session, "client", ev.Client, "name", ev.Name,
			"type", ev.Type, "verdict", ev.Verdict, "rcode", ev.Rcode, "addrs", ev.Addrs, "dropped", ev.Dropped,
			"upstream", ev.Upstream, "latency", ev.Latency, "ttl", ev.TTL, "err", ev.Err)
	}
	if p.cfg.Events != nil {
		p.cfg.Events.Record(ev)
	}
}
