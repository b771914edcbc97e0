package netpolicy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ParseInboundPort parses one port the host may open connections to in a
// session: PORT (TCP and UDP, as an allow entry's port) or PORT/tcp,
// PORT/udp.
func ParseInboundPort(s string) (PortSpec, error) {
	portStr, protoStr, hasProto := strings.Cut(s, "/")
	n, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || n == 0 {
		return PortSpec{}, fmt.Errorf("inbound from host %q: port %q: want PORT or PORT/tcp or PORT/udp, PORT from 1 to 65535", s, portStr)
	}
	ps := PortSpec{Port: uint16(n)}
	if hasProto {
		switch p := Proto(strings.ToLower(protoStr)); p {
		case ProtoTCP, ProtoUDP:
			ps.Proto = p
		default:
			return PortSpec{}, fmt.Errorf("inbound from host %q: protocol %q: want tcp or udp", s, protoStr)
		}
	}
	return ps, nil
}

// NormalizeInbound sorts inbound ports and drops those another one covers
// (80/tcp when 80 is there).
func NormalizeInbound(ps []PortSpec) []PortSpec {
	both := map[uint16]bool{}
	for _, p := range ps {
		if p.Proto == ProtoAny {
			both[p.Port] = true
		}
	}
	var out []PortSpec
	for _, p := range ps {
		if p.Proto != ProtoAny && both[p.Port] {
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b PortSpec) int {
		if a.Port != b.Port {
			return int(a.Port) - int(b.Port)
		}
		return strings.Compare(string(a.Proto), string(b.Proto))
	})
	return slices.Compact(out)
}

// InboundString is how a port is written back: PORT or PORT/PROTO.
func InboundString(p PortSpec) string {
	return strings.TrimPrefix(p.String(), ":")
}
