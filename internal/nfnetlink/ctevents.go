package nfnetlink

// ctnetlink events: the kernel multicasts a message when a conntrack
// entry is confirmed (NEW) and when it is destroyed (DESTROY), the latter
// with the entry's accounting when net.netfilter.nf_conntrack_acct is on.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// ctnetlink multicast groups (NFNLGRP_CONNTRACK_NEW / _DESTROY) and the
// attributes an event carries besides the tuple.
const (
	GroupConntrackNew     = unix.NFNLGRP_CONNTRACK_NEW
	GroupConntrackDestroy = unix.NFNLGRP_CONNTRACK_DESTROY

	ctMsgNew            = unix.NFNL_SUBSYS_CTNETLINK << 8 // IPCTNL_MSG_CT_NEW (0)
	ctaTupleReply       = 2
	ctaMark             = 8
	ctaCountersOrig     = 9
	ctaCountersReply    = 10
	ctaID               = 12
	ctaTimestamp        = 20
	ctaCountersPackets  = 1 // u64
	ctaCountersBytes    = 2 // u64
	ctaCounters32Packet = 3 // u32 (old kernels)
	ctaCounters32Bytes  = 4 // u32 (old kernels)
	ctaTimestampStart   = 1 // u64 ns
	ctaTimestampStop    = 2 // u64 ns
)

// FlowEventType says whether an event reports a new or a destroyed entry.
type FlowEventType uint8

const (
	FlowNew FlowEventType = iota + 1
	FlowDestroy
)

// Counters are one direction's accounting of an entry.
type Counters struct {
	Packets, Bytes uint64
}

// FlowEvent is one ctnetlink event: the entry's original tuple, its id
// (unique among live entries), mark, and on DESTROY its accounting and,
// with nf_conntrack_timestamp on, its start and stop.
type FlowEvent struct {
	Type        FlowEventType
	Flow        Flow
	ID          uint32
	Mark        uint32
	HasCounters bool
	Orig, Reply Counters
	Start, Stop time.Time // zero unless the kernel timestamps entries
}

// parseFlowEvent reads one event message (the nfgenmsg already stripped).
func parseFlowEvent(typ FlowEventType, b []byte) (FlowEvent, error) {
	ev := FlowEvent{Type: typ}
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return ev, fmt.Errorf("parse conntrack event: %w", err)
	}
	for ad.Next() {
		v := ad.Bytes()
		switch ad.Type() {
		case ctaTupleOrig:
			ev.Flow.tuple = append([]byte(nil), v...)
			ev.Flow.Src, ev.Flow.Dst, ev.Flow.Proto, ev.Flow.Sport, ev.Flow.Dport = parseTuple(ev.Flow.tuple)
		case ctaZone:
			ev.Flow.zone = append([]byte(nil), v...)
		case ctaMark:
			if len(v) == 4 {
				ev.Mark = binary.BigEndian.Uint32(v)
			}
		case ctaID:
			if len(v) == 4 {
				ev.ID = binary.BigEndian.Uint32(v)
			}
		case ctaCountersOrig:
			ev.Orig, ev.HasCounters = parseCounters(v), true
		case ctaCountersReply:
			ev.Reply, ev.HasCounters = parseCounters(v), true
		case ctaTimestamp:
			ev.Start, ev.Stop = parseTimestamp(v)
		}
	}
	return ev, ad.Err()
}

// parseCounters reads CTA_COUNTERS_ORIG/REPLY: 64-bit counters, or the
// 32-bit ones of old kernels.
func parseCounters(b []byte) Counters {
	var c Counters
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return c
	}
	for ad.Next() {
		v := ad.Bytes()
		switch {
		case ad.Type() == ctaCountersPackets && len(v) == 8:
			c.Packets = binary.BigEndian.Uint64(v)
		case ad.Type() == ctaCountersBytes && len(v) == 8:
			c.Bytes = binary.BigEndian.Uint64(v)
		case ad.Type() == ctaCounters32Packet && len(v) == 4:
			c.Packets = uint64(binary.BigEndian.Uint32(v))
		case ad.Type() == ctaCounters32Bytes && len(v) == 4:
			c.Bytes = uint64(binary.BigEndian.Uint32(v))
		}
	}
	return c
}

// parseTimestamp reads CTA_TIMESTAMP (nanoseconds since the epoch).
func parseTimestamp(b []byte) (start, stop time.Time) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return
	}
	for ad.Next() {
		v := ad.Bytes()
		if len(v) != 8 {
			continue
		}
		ns := binary.BigEndian.Uint64(v)
		if ns == 0 || ns > 1<<62 {
			continue
		}
		switch ad.Type() {
		case ctaTimestampStart:
			start = time.Unix(0, int64(ns)).UTC()
		case ctaTimestampStop:
			stop = time.Unix(0, int64(ns)).UTC()
		}
	}
	return
}

// ParseFlowEventMessage reads one multicast message: ok is false for a
// message that is not a ctnetlink NEW or DELETE (DESTROY) event.
func ParseFlowEventMessage(m netlink.Message) (ev FlowEvent, ok bool, err error) {
	var typ FlowEventType
	switch uint16(m.Header.Type) {
	case ctMsgNew:
		typ = FlowNew
	case ctMsgDelete:
		typ = FlowDestroy
	default:
		return ev, false, nil
	}
	if len(m.Data) < 4 {
		return ev, false, fmt.Errorf("conntrack event of %d bytes: want at least 4", len(m.Data))
	}
	if m.Data[0] != unix.AF_INET {
		return ev, false, nil
	}
	ev, err = parseFlowEvent(typ, m.Data[4:])
	return ev, err == nil && ev.Flow.tuple != nil, err
}

// FlowEvents is a subscription to the NEW and DESTROY events of a netns.
type FlowEvents struct {
	c *netlink.Conn
}

// ErrEventsLost is what Receive returns when the socket's buffer overflowed
// (ENOBUFS): events were lost; the subscription goes on.
var ErrEventsLost = errors.New("conntrack events lost: the socket's receive buffer overflowed")

// SubscribeFlowEvents opens a netfilter socket in the netns netNS (an fd;
// 0: the caller's) joined to the NEW and DESTROY groups, with a receive
// buffer of bufBytes (0: the system's default).
func SubscribeFlowEvents(netNS int, bufBytes int) (*FlowEvents, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netNS})
	if err != nil {
		return nil, fmt.Errorf("open netfilter netlink socket: %w", err)
	}
	for _, g := range []uint32{GroupConntrackNew, GroupConntrackDestroy} {
		if err := c.JoinGroup(g); err != nil {
			c.Close()
			return nil, fmt.Errorf("join conntrack event group %d: %w", g, err)
		}
	}
	if bufBytes > 0 {
		if err := c.SetReadBuffer(bufBytes); err != nil {
			c.Close()
			return nil, fmt.Errorf("set the conntrack event socket's buffer to %d bytes: %w", bufBytes, err)
		}
	}
	return &FlowEvents{c: c}, nil
}

// Receive blocks for the next batch of events; ErrEventsLost after an
// overflow, another error once closed.
func (f *FlowEvents) Receive() ([]FlowEvent, error) {
	msgs, err := f.c.Receive()
	if err != nil {
		if errors.Is(err, syscall.ENOBUFS) {
			return nil, ErrEventsLost
		}
		return nil, err
	}
	out := make([]FlowEvent, 0, len(msgs))
	for _, m := range msgs {
		ev, ok, err := ParseFlowEventMessage(m)
		if err != nil || !ok {
			continue
		}
		out = append(out, ev)
	}
	return out, nil
}

// Close ends the subscription; a blocked Receive returns.
func (f *FlowEvents) Close() error { return f.c.Close() }

// EnableConntrackEvents turns on conntrack accounting (bytes and packets
// per entry, sent with DESTROY events) and, if off, conntrack events, in
// the caller's netns: writes to /proc/sys (sysctls), not a program run.
func EnableConntrackEvents() error {
	for _, p := range []string{"/proc/sys/net/netfilter/nf_conntrack_acct", "/proc/sys/net/netfilter/nf_conntrack_events"} {
		b, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		if len(b) > 0 && b[0] != '0' {
			continue // on (events: 1, or 2 = on while someone listens)
		}
		if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("turn on %s: %w", p, err)
		}
	}
	return nil
}
