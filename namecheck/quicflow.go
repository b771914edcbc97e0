package namecheck

import (
	"encoding/binary"
	"time"
)

const udpProto = 17

// datagram is what the checker reads of a queued UDP packet (IPv4 or
// IPv6).
type datagram struct {
	key     FlowKey
	payload []byte
	ext     bool // IPv6 extension headers before the UDP header
}

func parseDatagram(ip ipPacket) (datagram, bool) {
	var d datagram
	u := ip.l4
	if ip.proto != udpProto || len(u) < 8 {
		return d, false
	}
	n := int(binary.BigEndian.Uint16(u[4:6]))
	if n < 8 || n > len(u) {
		return d, false
	}
	d.key = FlowKey{
		UDP:   true,
		Guest: ip.src, SrcPort: binary.BigEndian.Uint16(u[0:2]),
		Dst: ip.dst, DstPort: binary.BigEndian.Uint16(u[2:4]),
	}
	d.payload = u[8:n]
	d.ext = ip.ext
	return d, true
}

// datagram handles a queued UDP packet of a pending QUIC flow (--quic
// check). Every datagram the guest sends is held until its flow's
// ClientHello is read whole from the Initial packets; then all of them
// pass (the flow is marked checked: the plain path from now on) or none
// does (the first is refused: the guest gets the session's answer, an
// ICMP error under reject and reset). Nothing of a refused flow reaches
// its server: unlike TCP's, a UDP server has no handshake to finish
// before the client's first bytes.
func (c *Checker) datagram(now time.Time, id uint32, ip ipPacket, fromGuest bool) ([]Verdict, *Decision) {
	d, ok := parseDatagram(ip)
	if !ok {
		return []Verdict{{id, Drop}}, nil
	}
	if !fromGuest {
		// Queued between the verdict and its mark: its flow was allowed
		// (a refused flow's server never got a datagram to answer).
		return []Verdict{{id, Accept}}, nil
	}
	f := c.flows[d.key]
	switch {
	case f != nil && f.decided && f.allowed:
		return []Verdict{{id, Pass}}, nil
	case f != nil && f.decided:
		return []Verdict{{id, Drop}}, nil
	case f == nil:
		g := c.guest(d.key.Guest)
		if g.holding >= c.cfg.MaxHolding {
			return []Verdict{{id, Drop}}, nil // the client sends its Initial again
		}
		g.holding++
		f = &flowState{udp: true, quic: &QUICHello{}, since: now, inHolding: true}
		c.flows[d.key] = f
	}
	f.seen = now
	f.held = append(f.held, id)
	if d.ext {
		// IPv6 extension headers before the UDP header: refused, never
		// read past (see refuseExtended).
		return c.decideQUIC(d.key, f, Result{Kind: Unreadable}, CauseUnreadable)
	}
	r := f.quic.Add(d.payload)
	switch {
	case r.Kind == NeedMore && f.quic.datagrams >= MaxQUICDatagrams:
		return c.decideQUIC(d.key, f, r, CauseIncomplete)
	case r.Kind == NeedMore:
		return nil, nil
	case r.Kind == Other:
		return c.decideQUIC(d.key, f, Result{Kind: Unreadable}, CauseNotQUIC)
	}
	return c.decideQUIC(d.key, f, r, CauseUnreadable)
}

// decideQUIC ends QUIC flow key with what its Initial packets showed
// (or the refusal cause for Unreadable and NeedMore): its held datagrams
// all pass, or the first carries the refusal and the rest are dropped.
func (c *Checker) decideQUIC(key FlowKey, f *flowState, r Result, cause string) ([]Verdict, *Decision) {
	d := &Decision{UDP: true, Guest: key.Guest, SrcPort: key.SrcPort, Dst: key.Dst, DstPort: key.DstPort, Via: ViaQUIC}
	c.judge(key, r, cause, d)
	if cause == CauseNotQUIC {
		d.Via = ""
	}
	f.decided, f.allowed, f.result = true, d.Result != ResultRefused, d.Result
	vs := make([]Verdict, len(f.held))
	for i, id := range f.held {
		switch {
		case f.allowed:
			vs[i] = Verdict{id, Pass}
		case i == 0:
			vs[i] = Verdict{id, Refuse}
		default:
			vs[i] = Verdict{id, Drop}
		}
	}
	f.held, f.quic = nil, nil
	c.release(key.Guest, f)
	return vs, d
}
