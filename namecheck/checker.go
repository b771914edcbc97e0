package namecheck

import (
	"encoding/binary"
	"net/netip"
	"time"
)

// Action is what a queued packet gets.
type Action uint8

const (
	Accept Action = iota // no payload of an undecided flow: let it go on
	Drop                 // gone; the guest retransmits if it cares
	Pass                 // the flow is decided allowed: mark it so, and let the packet go on
	Refuse               // the flow is refused: mark it so, and answer as the session's on-deny says
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
	CauseUnreadable = "unreadable"  // TLS or HTTP that does not parse as servers parse it, or a changed byte
)

// Decision is one decided flow.
type Decision struct {
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
}

// Judge answers whether guest's policy allows name on TCP port; when not,
// lacked is the entry it lacks. The daemon's answers with the session's
// policy; ok is false for an unknown guest too.
type Judge func(guest netip.Addr, name string, port uint16) (lacked string, ok bool)

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
	Guest   netip.Addr
	SrcPort uint16
	Dst     netip.Addr
	DstPort uint16
}

type flowState struct {
	stream  *Stream
	held    []uint32
	since   time.Time // first payload held
	seen    time.Time // last packet
	decided bool
	allowed bool
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
// (a connection that never sends).
const forgetIdle = 2 * time.Minute

// TCP flags.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// segment is what the checker reads of a queued IPv4 TCP packet.
type segment struct {
	key     FlowKey
	seq     uint32
	flags   byte
	payload []byte
}

func parseSegment(p []byte) (segment, bool) {
	var s segment
	if len(p) < 20 || p[0]>>4 != 4 || p[9] != 6 {
		return s, false
	}
	ihl := int(p[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(p[2:4]))
	if ihl < 20 || total < ihl+20 || total > len(p) {
		return s, false
	}
	if binary.BigEndian.Uint16(p[6:8])&0x3fff != 0 {
		return s, false // a fragment: conntrack reassembles before forward, so never here
	}
	t := p[ihl:total]
	off := int(t[12]>>4) * 4
	if off < 20 || off > len(t) {
		return s, false
	}
	s.key = FlowKey{
		Guest: netip.AddrFrom4([4]byte(p[12:16])), SrcPort: binary.BigEndian.Uint16(t[0:2]),
		Dst: netip.AddrFrom4([4]byte(p[16:20])), DstPort: binary.BigEndian.Uint16(t[2:4]),
	}
	s.seq = binary.BigEndian.Uint32(t[4:8])
	s.flags = t[13]
	s.payload = t[off:]
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

// Packet handles one queued packet (from its IPv4 header on), queued
// because its flow is pending: the verdicts it makes (none while it is
// held, several when it decides a flow that held others) and the flow it
// decided, if any.
func (c *Checker) Packet(now time.Time, id uint32, pkt []byte) ([]Verdict, *Decision) {
	s, ok := parseSegment(pkt)
	if !ok {
		return []Verdict{{id, Drop}}, nil
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
		c.flows[s.key] = &flowState{stream: NewStream(s.seq + 1), seen: now}
		return append(vs, Verdict{id, Accept}), nil
	case len(s.payload) == 0:
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
	if f.decided {
		if f.allowed {
			return []Verdict{{id, Pass}}, nil
		}
		return []Verdict{{id, Drop}}, nil
	}
	g := c.guest(s.key.Guest)
	if len(f.held) == 0 {
		if g.holding >= c.cfg.MaxHolding {
			return []Verdict{{id, Drop}}, nil
		}
		g.holding++
		f.since = now
	}
	f.held = append(f.held, id)
	conflict, over := f.stream.Add(s.seq, s.payload)
	switch {
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

// decide ends flow key with what Inspect read (or the refusal cause for
// Unreadable and NeedMore), releasing its held packets.
func (c *Checker) decide(key FlowKey, f *flowState, r Result, cause string) ([]Verdict, *Decision) {
	d := &Decision{Guest: key.Guest, SrcPort: key.SrcPort, Dst: key.Dst, DstPort: key.DstPort, Via: r.Via, Seq: f.stream.start}
	switch r.Kind {
	case NoName, Other:
		d.Result = ResultPassed
	case Named:
		d.Result = ResultAllowed
		for _, n := range r.Names {
			if lacked, ok := c.cfg.Judge(key.Guest, n, key.DstPort); !ok {
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
	f.decided, f.allowed = true, d.Result != ResultRefused
	if g := c.guests[key.Guest]; g != nil {
		g.flows--
		if len(f.held) > 0 {
			g.holding--
		}
	}
	vs := make([]Verdict, len(f.held))
	for i, id := range f.held {
		switch {
		case f.allowed:
			vs[i] = Verdict{id, Pass}
		case i == 0:
			vs[i] = Verdict{id, Refuse} // the one that carries the answer to the guest
		default:
			vs[i] = Verdict{id, Drop}
		}
	}
	f.held, f.stream = nil, nil
	return vs, d
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
	if !f.decided {
		if g := c.guests[key.Guest]; g != nil {
			g.flows--
			if len(f.held) > 0 {
				g.holding--
			}
		}
	}
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
			v, d := c.decide(k, f, Result{Kind: NeedMore}, CauseIncomplete)
			vs = append(vs, v...)
			ds = append(ds, *d)
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
