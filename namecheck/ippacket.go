package namecheck

import (
	"encoding/binary"
	"net/netip"
)

// ipPacket is what the checker reads of a queued packet's IP header,
// IPv4 or IPv6: its addresses, its transport protocol, and its transport
// header and payload (as long as the IP header says).
type ipPacket struct {
	src, dst netip.Addr
	proto    byte
	l4       []byte
	// ext: an IPv6 packet with extension headers before its transport
	// header (their chain was walked to find it). A guest's such packet
	// on a pending flow is refused, never read past (see Packet).
	ext bool
}

// IPv6 extension headers the walk steps over to find a flow's key (RFC
// 8200 4): each has its next header in its first byte and its length in
// its second. A fragment header never reaches the checker: conntrack
// reassembles before the forward hook and drops the header.
const (
	ip6HopByHop = 0
	ip6Routing  = 43
	ip6Fragment = 44
	ip6AH       = 51
	ip6DestOpts = 60
	// ip6MaxExt bounds the walk: no legitimate packet carries more.
	ip6MaxExt = 8
)

// parseIP reads a packet from its IP header on.
func parseIP(p []byte) (ipPacket, bool) {
	if len(p) == 0 {
		return ipPacket{}, false
	}
	switch p[0] >> 4 {
	case 4:
		return parseIPv4(p)
	case 6:
		return parseIPv6(p)
	}
	return ipPacket{}, false
}

func parseIPv4(p []byte) (ipPacket, bool) {
	var ip ipPacket
	if len(p) < 20 {
		return ip, false
	}
	ihl := int(p[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(p[2:4]))
	if ihl < 20 || total < ihl || total > len(p) {
		return ip, false
	}
	if binary.BigEndian.Uint16(p[6:8])&0x3fff != 0 {
		return ip, false // a fragment: conntrack reassembles before forward, so never here
	}
	ip.src, ip.dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
	ip.proto, ip.l4 = p[9], p[ihl:total]
	return ip, true
}

func parseIPv6(p []byte) (ipPacket, bool) {
	var ip ipPacket
	if len(p) < 40 {
		return ip, false
	}
	plen := int(binary.BigEndian.Uint16(p[4:6]))
	total := 40 + plen
	if plen == 0 || total > len(p) {
		return ip, false // a jumbogram (payload length 0) or truncated
	}
	ip.src, ip.dst = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40]))
	nh, off := p[6], 40
	for n := 0; ; n++ {
		var hlen int
		switch nh {
		case ip6HopByHop, ip6Routing, ip6DestOpts:
			if off+2 > total {
				return ip, false
			}
			hlen = (int(p[off+1]) + 1) * 8
		case ip6AH:
			if off+2 > total {
				return ip, false
			}
			hlen = (int(p[off+1]) + 2) * 4
		case ip6Fragment:
			return ip, false // never here (see above): not read
		default:
			ip.proto, ip.l4 = nh, p[off:total]
			return ip, true
		}
		if n == ip6MaxExt || off+hlen > total {
			return ip, false
		}
		ip.ext = true
		nh, off = p[off], off+hlen
	}
}
