package namecheck

import (
	"encoding/binary"
	"net/netip"
	"time"
)

// Action is what a queued packet gets.
type Action uint8

const (
	// Accept: let the packet go on; its flow stays as it is (pending):
	// no payload, a server's packet, or the first bytes of a flow
	// allowed but not yet acknowledged by the server.
	Accept Action = iota
	Drop          // gone; the guest retransmits if it cares
	// Pass: the server acknowledged the checked bytes: mark the flow
	// checked (the plain path from now on) and let the packet go on.
	Pass
	Refuse // the flow is refused: mark it so, and answer as the session's on-deny says
)

// Verdict is the action for one queued packet.
type Verdict struct {
	ID     uint32
	Action Action
}

// Results of a decided flow.
const (
	ResultAllowed = "allowed"
	ResultRefused = "refused"
	ResultPassed  = "passed"
)

// Causes of a refusal (the flow event's detail "cause"; its reason is
// always name-mismatch: the flow did not show a name the policy allows).
const (
	CauseNotAllowed = "not-allowed" // a name the policy does not allow on the port
	CauseIncomplete = "incomplete"  // no name within the bounds (bytes, time), or the flow's first byte unknown
	CauseUnreadable = "unreadable"  // TLS or HTTP that does not parse as servers parse it, a changed byte, urgent data
	// CauseUnconfirmed: the server did not acknowledge the checked bytes
	// within HoldFor (a segment it discarded, a packet that died on the
	// way: what it received is not known to be what was checked).
	CauseUnconfirmed = "unconfirmed"
	// CauseNotQUIC: a UDP flow to 443 whose first datagram is not a
	// QUIC Initial of a version the check reads (v1, v2): 443/udp speaks
	// QUIC, and no name can be read from anything else.
	CauseNotQUIC = "not-quic"
)

// Decision is one decided flow.
type Decision struct {
	UDP     bool // a QUIC flow (no sequence numbers: Seq is 0)
	Guest   netip.Addr
	SrcPort uint16
	Dst     netip.Addr
	DstPort uint16
	Result  string // ResultAllowed, ResultRefused, ResultPassed
	Cause   string // for ResultRefused: CauseNotAllowed, CauseIncomplete or CauseUnreadable
	Via     string // ViaTLS, ViaHTTP or ""
	Name    string // the name asked for (the first refused one when refused)
	Lacked  string // refused by name: the entry the policy lacks, NAME:PORT
	// Seq is the sequence number of the flow's first byte: where the
	// server's receive window starts, since it got none of them (a reset
	// for it carries this).
	Seq uint32
	// SeqAlt, when not 0, is a second place the server's window may
	// start (a flow refused after its checked bytes were sent): a reset
	// goes to both.
	SeqAlt uint32
	// Was is the result the flow had before this refusal (allowed or
	// passed, then refused before the server acknowledged it); "" for a
	// first decision.
	Was string
	// NoReset: the flow was refused at its SYN, which never left: its
	// server knows nothing to reset.
	NoReset bool
}

// Judge answers whether guest's policy allows name on port (TCP, or UDP
// for a QUIC flow); when not, lacked is the entry it lacks. The daemon's
// answers with the session's policy; ok is false for an unknown guest
// too.
type Judge func(guest netip.Addr, name string, port uint16, udp bool) (lacked string, ok bool)

// Config bounds the checker.
type Config struct {
	Judge Judge
	// HoldFor: a flow holding payload with no decision after this is
	// refused (CauseIncomplete). Default 10 s.
	HoldFor time.Duration
	// MaxFlows: undecided flows one guest may have (SYN seen); a SYN
	// beyond is dropped. Default 1024.
	MaxFlows int
	// MaxHolding: undecided flows one guest may have holding payload; a
	// payload segment of another is dropped (retransmitted later).
	// Default 64.
	MaxHolding int
}

// FlowKey is a flow as the guest sends it.
type FlowKey struct {
	UDP     bool
	Guest   netip.Addr
	SrcPort uint16
	Dst     netip.Addr
	DstPort uint16
}

// flowState is one flow's check. An allowed flow is awaiting until the
// server acknowledges every byte that was checked (confirmAt): until
// then its packets are still queued, and a byte the guest sends again
// must be the one checked. Only then is it marked checked (Pass): what a
// server's TCP discarded (a segment failing PAWS, one whose TTL runs out
// past the host) cannot have been what it read.
type flowState struct {
	stream    *Stream
	held      []uint32
	since     time.Time // first payload held; for an awaiting flow, its decision
	seen      time.Time // last packet
	decided   bool
	allowed   bool
	awaiting  bool
	confirmAt uint32 // the sequence number past the checked bytes
	inFlows   bool   // counted in its guest's flows (undecided)
	inHolding bool   // counted in its guest's holding (held or awaiting)
	// refuseNext: refused while nothing was held (unconfirmed): the next
	// guest packet carries the answer.
	refuseNext bool
	result     string // the decision's Result
	// udp: a QUIC flow; quic reads its Initial packets until decided.
	udp  bool
	quic *QUICHello
}

type guestCount struct{ flows, holding int }

// Checker keeps the state of the checks. It is not safe for concurrent
// use: one goroutine, or the caller's lock.
type Checker struct {
	cfg    Config
	flows  map[FlowKey]*flowState
	guests map[netip.Addr]*guestCount
}

// NewChecker returns an empty checker.
func NewChecker(cfg Config) *Checker {
	if cfg.HoldFor <= 0 {
		cfg.HoldFor = 10 * time.Second
	}
	if cfg.MaxFlows <= 0 {
		cfg.MaxFlows = 1024
	}
	if cfg.MaxHolding <= 0 {
		cfg.MaxHolding = 64
	}
	return &Checker{cfg: cfg, flows: map[FlowKey]*flowState{}, guests: map[netip.Addr]*guestCount{}}
}

// forgetDecided is how long a decided flow is remembered, for packets
// queued before its mark took effect.
const forgetDecided = 30 * time.Second

// forgetIdle is how long an undecided flow that holds nothing is kept
// (a connection whose server speaks first may wait long for its client;
// the per-guest MaxFlows bounds how many)
// (a connection that never sends).
const forgetIdle = time.Hour

// TCP flags.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
	tcpURG = 0x20
)

const tcpProto = 6

// segment is what the checker reads of a queued TCP packet (IPv4 or
// IPv6).
type segment struct {
	key     FlowKey
	seq     uint32
	ack     uint32
	flags   byte
	payload []byte
	ext     bool // IPv6 extension headers before the TCP header
}

func parseSegment(ip ipPacket) (segment, bool) {
	var s segment
	t := ip.l4
	if ip.proto != tcpProto || len(t) < 20 {
		return s, false
	}
	off := int(t[12]>>4) * 4
	if off < 20 || off > len(t) {
		return s, false
	}
	s.key = FlowKey{
		Guest: ip.src, SrcPort: binary.BigEndian.Uint16(t[0:2]),
		Dst: ip.dst, DstPort: binary.BigEndian.Uint16(t[2:4]),
	}
	s.seq = binary.BigEndian.Uint32(t[4:8])
	s.ack = binary.BigEndian.Uint32(t[8:12])
	s.flags = t[13]
	s.payload = t[off:]
	s.ext = ip.ext
	return s, true
}

func (c *Checker) guest(a netip.Addr) *guestCount {
	g := c.guests[a]
	if g == nil {
		g = &guestCount{}
		c.guests[a] = g
	}
	return g
}

// Packet handles one queued packet (from its IPv4 or IPv6 header on),
// queued because its flow is pending: fromGuest tells a guest's packet
// from its server's. It returns the verdicts it makes (none while it is
// held, several when it decides a flow that held others) and the flow it
// decided, if any. A guest's IPv6 packet with extension headers before
// its transport header refuses its flow (refuseExtended).
func (c *Checker) Packet(now time.Time, id uint32, pkt []byte, fromGuest bool) ([]Verdict, *Decision) {
	ip, ok := parseIP(pkt)
	if !ok {
		return []Verdict{{id, Drop}}, nil
	}
	if ip.proto == udpProto {
		return c.datagram(now, id, ip, fromGuest)
	}
	s, ok := parseSegment(ip)
	if !ok {
		return []Verdict{{id, Drop}}, nil
	}
	if !fromGuest {
		return c.serverPacket(id, s), nil
	}
	if s.ext {
		return c.refuseExtended(now, id, s)
	}
	f := c.flows[s.key]
	switch {
	case s.flags&tcpRST != 0:
		vs := c.forget(s.key, f)
		if len(s.payload) > 0 {
			return append(vs, Verdict{id, Drop}), nil
		}
		return append(vs, Verdict{id, Accept}), nil
	case s.flags&tcpSYN != 0:
		if len(s.payload) > 0 {
			// TCP Fast Open data would leave unchecked; without it the
			// client retries a plain SYN.
			return []Verdict{{id, Drop}}, nil
		}
		if f != nil && !f.decided && f.stream.start == s.seq+1 {
			f.seen = now // a retransmitted SYN
			return []Verdict{{id, Accept}}, nil
		}
		vs := c.forget(s.key, f)
		g := c.guest(s.key.Guest)
		if g.flows >= c.cfg.MaxFlows {
			return append(vs, Verdict{id, Drop}), nil
		}
		g.flows++
		c.flows[s.key] = &flowState{stream: NewStream(s.seq + 1), seen: now, inFlows: true}
		return append(vs, Verdict{id, Accept}), nil
	case len(s.payload) == 0:
		if f != nil && s.flags&tcpFIN != 0 && !f.decided && len(f.held) == 0 {
			// Closed without a byte sent: nothing to check (a connect
			// probe), and its state must not count against the guest's
			// MaxFlows for the idle hour.
			return append(c.forget(s.key, f), Verdict{id, Accept}), nil
		}
		if f != nil {
			f.seen = now
		}
		return []Verdict{{id, Accept}}, nil
	}
	if f == nil {
		// Its first byte is unknown (the SYN came before a restart, or
		// was forgotten): refuse, never pass unchecked.
		// The guest retransmits from its first unacknowledged byte: the
		// server's window starts there.
		d := &Decision{Guest: s.key.Guest, SrcPort: s.key.SrcPort, Dst: s.key.Dst, DstPort: s.key.DstPort, Result: ResultRefused, Cause: CauseIncomplete, Seq: s.seq}
		c.flows[s.key] = &flowState{decided: true, seen: now}
		return []Verdict{{id, Refuse}}, d
	}
	f.seen = now
	switch {
	case f.decided && f.awaiting:
		if !f.stream.Matches(s.seq, s.payload) || s.flags&tcpURG != 0 {
			// A byte the server may not have had (it has not acknowledged
			// it) sent again, changed: what it reads is not what was
			// checked.
			d := &Decision{Guest: s.key.Guest, SrcPort: s.key.SrcPort, Dst: s.key.Dst, DstPort: s.key.DstPort,
				Result: ResultRefused, Cause: CauseUnreadable, Seq: f.stream.start, SeqAlt: f.confirmAt, Was: f.result}
			c.release(s.key.Guest, f)
			f.allowed, f.awaiting, f.stream = false, false, nil
			return []Verdict{{id, Refuse}}, d
		}
		return []Verdict{{id, Accept}}, nil
	case f.decided && f.allowed:
		return []Verdict{{id, Pass}}, nil
	case f.decided && f.refuseNext:
		f.refuseNext = false
		return []Verdict{{id, Refuse}}, nil
	case f.decided:
		return []Verdict{{id, Drop}}, nil
	}
	g := c.guest(s.key.Guest)
	if len(f.held) == 0 {
		if g.holding >= c.cfg.MaxHolding {
			return []Verdict{{id, Drop}}, nil
		}
		g.holding++
		f.inHolding = true
		f.since = now
	}
	f.held = append(f.held, id)
	conflict, over := f.stream.Add(s.seq, s.payload)
	switch {
	case s.flags&tcpURG != 0:
		// Urgent data: the server's TCP takes the urgent byte out of the
		// stream (without SO_OOBINLINE), so it reads other bytes than
		// the ones checked ("Hos\x01t: evil" becomes a Host header). Any
		// unprivileged socket can send it (MSG_OOB); no TLS or HTTP
		// client does in its first request.
		return c.decide(s.key, f, Result{Kind: Unreadable}, CauseUnreadable)
	case conflict:
		return c.decide(s.key, f, Result{Kind: Unreadable}, CauseUnreadable)
	case over:
		return c.decide(s.key, f, Result{Kind: Unreadable}, CauseIncomplete)
	}
	r := Inspect(f.stream.Prefix())
	if r.Kind == NeedMore {
		if f.stream.Len() >= MaxBytes {
			return c.decide(s.key, f, r, CauseIncomplete)
		}
		return nil, nil
	}
	return c.decide(s.key, f, r, CauseUnreadable)
}

// refuseExtended refuses the flow of a guest's IPv6 TCP packet that
// carries extension headers before its TCP header (hop-by-hop or
// destination options, a routing header, AH). No client needs them on a
// connection's first packets, and each is a way to make the server read
// other bytes, or another destination, than the checker: a routing
// header's final destination is not the address the table judged. So the
// flow is refused (cause unreadable), not passed unread: its SYN, its
// first segments, or a segment sent again while the server has not
// acknowledged the checked bytes. Once a flow passed, its packets take the
// plain path and are not queued; one queued meanwhile is dropped.
func (c *Checker) refuseExtended(now time.Time, id uint32, s segment) ([]Verdict, *Decision) {
	f := c.flows[s.key]
	refused := func(seq, alt uint32, was string) *Decision {
		return &Decision{Guest: s.key.Guest, SrcPort: s.key.SrcPort, Dst: s.key.Dst, DstPort: s.key.DstPort,
			Result: ResultRefused, Cause: CauseUnreadable, Seq: seq, SeqAlt: alt, Was: was}
	}
	switch {
	case f == nil || s.flags&tcpSYN != 0 && !f.decided:
		// A SYN (it never leaves: nothing to reset), or a segment of a
		// flow whose first byte is unknown.
		vs := c.forget(s.key, f)
		d := refused(s.seq, 0, "")
		d.NoReset = s.flags&tcpSYN != 0
		c.flows[s.key] = &flowState{decided: true, seen: now}
		return append(vs, Verdict{id, Refuse}), d
	case !f.decided:
		f.seen = now
		f.held = append(f.held, id)
		return c.decide(s.key, f, Result{Kind: Unreadable}, CauseUnreadable)
	case f.awaiting:
		f.seen = now
		d := refused(f.stream.start, f.confirmAt, f.result)
		c.release(s.key.Guest, f)
		f.allowed, f.awaiting, f.stream = false, false, nil
		return []Verdict{{id, Refuse}}, d
	}
	return []Verdict{{id, Drop}}, nil
}

// decide ends flow key with what Inspect read (or the refusal cause for
// Unreadable and NeedMore), releasing its held packets.
func (c *Checker) decide(key FlowKey, f *flowState, r Result, cause string) ([]Verdict, *Decision) {
	d := &Decision{Guest: key.Guest, SrcPort: key.SrcPort, Dst: key.Dst, DstPort: key.DstPort, Via: r.Via, Seq: f.stream.start}
	c.judge(key, r, cause, d)
	f.decided, f.allowed, f.result = true, d.Result != ResultRefused, d.Result
	if g := c.guests[key.Guest]; g != nil && f.inFlows {
		g.flows--
		f.inFlows = false
	}
	vs := make([]Verdict, len(f.held))
	for i, id := range f.held {
		switch {
		case f.allowed:
			vs[i] = Verdict{id, Accept} // the flow stays pending until the server acknowledges them
		case i == 0:
			vs[i] = Verdict{id, Refuse} // the one that carries the answer to the guest
		default:
			vs[i] = Verdict{id, Drop}
		}
	}
	f.held = nil
	if f.allowed {
		f.awaiting, f.confirmAt, f.since = true, f.stream.start+uint32(f.stream.Len()), f.seen
		return vs, d
	}
	c.release(key.Guest, f)
	f.stream = nil
	return vs, d
}

// judge fills d's result from what was read: a name the policy allows
// (all of them), none to read (passes), or refused with cause.
func (c *Checker) judge(key FlowKey, r Result, cause string, d *Decision) {
	switch r.Kind {
	case NoName, Other:
		d.Result = ResultPassed
	case Named:
		d.Result = ResultAllowed
		for _, n := range r.Names {
			if lacked, ok := c.cfg.Judge(key.Guest, n, key.DstPort, key.UDP); !ok {
				d.Result, d.Cause, d.Name, d.Lacked = ResultRefused, CauseNotAllowed, n, lacked
				break
			}
		}
		if d.Result == ResultAllowed {
			d.Name = r.Names[0]
		}
	default:
		d.Result, d.Cause = ResultRefused, cause
	}
}

// release uncounts a flow's holding (held payload, or awaiting the
// server's acknowledgement).
func (c *Checker) release(guest netip.Addr, f *flowState) {
	if g := c.guests[guest]; g != nil && f.inHolding {
		g.holding--
	}
	f.inHolding = false
}

// serverPacket handles a packet from the server of a pending flow: it
// goes on; an acknowledgement of every checked byte confirms the flow
// (Pass), ending its userspace path.
func (c *Checker) serverPacket(id uint32, s segment) []Verdict {
	key := FlowKey{Guest: s.key.Dst, SrcPort: s.key.DstPort, Dst: s.key.Guest, DstPort: s.key.SrcPort}
	f := c.flows[key]
	switch {
	case f == nil:
	case s.flags&tcpRST != 0:
		return append(c.forget(key, f), Verdict{id, Accept})
	case f.awaiting && s.flags&tcpACK != 0 && int32(s.ack-f.confirmAt) >= 0:
		f.awaiting, f.stream = false, nil
		c.release(key.Guest, f)
		return []Verdict{{id, Pass}}
	}
	return []Verdict{{id, Accept}}
}

// forget removes a flow's state; the packets it held (a RST or a new SYN
// ended the flow before its name was known) are dropped.
func (c *Checker) forget(key FlowKey, f *flowState) []Verdict {
	if f == nil {
		return nil
	}
	var vs []Verdict
	for _, id := range f.held {
		vs = append(vs, Verdict{id, Drop})
	}
	if g := c.guests[key.Guest]; g != nil && f.inFlows {
		g.flows--
	}
	c.release(key.Guest, f)
	delete(c.flows, key)
	if g := c.guests[key.Guest]; g != nil && g.flows <= 0 && g.holding <= 0 {
		delete(c.guests, key.Guest)
	}
	return vs
}

// Expire refuses the flows that held payload for longer than HoldFor
// without a decision (CauseIncomplete), and forgets decided and idle
// flows. Call it about once a second.
func (c *Checker) Expire(now time.Time) ([]Verdict, []Decision) {
	var vs []Verdict
	var ds []Decision
	for k, f := range c.flows {
		switch {
		case !f.decided && len(f.held) > 0 && now.Sub(f.since) >= c.cfg.HoldFor:
			decide := c.decide
			if f.udp {
				decide = c.decideQUIC
			}
			v, d := decide(k, f, Result{Kind: NeedMore}, CauseIncomplete)
			vs = append(vs, v...)
			ds = append(ds, *d)
		case f.awaiting && now.Sub(f.since) >= c.cfg.HoldFor:
			// Nothing of the flow is held (its bytes went on): the next
			// guest packet meets the refused state, and the server gets
			// its reset from the decision.
			ds = append(ds, Decision{Guest: k.Guest, SrcPort: k.SrcPort, Dst: k.Dst, DstPort: k.DstPort,
				Result: ResultRefused, Cause: CauseUnconfirmed, Seq: f.stream.start, SeqAlt: f.confirmAt, Was: f.result})
			c.release(k.Guest, f)
			f.allowed, f.awaiting, f.stream, f.seen, f.refuseNext = false, false, nil, now, true
		case f.decided && now.Sub(f.seen) >= forgetDecided,
			!f.decided && len(f.held) == 0 && now.Sub(f.seen) >= forgetIdle:
			vs = append(vs, c.forget(k, f)...)
		}
	}
	return vs, ds
}

// ForgetGuest drops the state of every flow of guest (its session is
// gone): the packets they held are dropped.
func (c *Checker) ForgetGuest(guest netip.Addr) []Verdict {
	var vs []Verdict
	for k, f := range c.flows {
		if k.Guest == guest {
			vs = append(vs, c.forget(k, f)...)
		}
	}
	delete(c.guests, guest)
	return vs
}

// Flows returns how many flows the checker keeps state for.
func (c *Checker) Flows() int { return len(c.flows) }
