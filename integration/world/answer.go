package world

import (
	"net/netip"
	"strings"

	"github.com/miekg/dns"
)

// NslookupAddrs returns the addresses busybox nslookup printed for the
// answer, in order. It prints the server first ("Server:" and an
// "Address:" line), then a "Name:" line and an "Address: x" line for each
// record of the answer: only those after the first Name: line count.
func NslookupAddrs(out string) []string {
	var addrs []string
	seenName := false
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "Name:") {
			seenName = true
		}
		if f := strings.Fields(line); seenName && len(f) > 1 && strings.HasPrefix(line, "Address") {
			addrs = append(addrs, f[len(f)-1])
		}
	}
	return addrs
}

// PublicAddrs returns n distinct public addresses (from 11.0.0.0/8, never
// routed in a world), for attesting addresses nothing answers on.
func PublicAddrs(n int) []netip.Addr {
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)})
	}
	return out
}

// AddrsOf returns the A record addresses in a DNS answer.
func AddrsOf(m *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				out = append(out, ip)
			}
		}
	}
	return out
}

// Addrs6Of returns the AAAA addresses of an answer, in order.
func Addrs6Of(m *dns.Msg) []netip.Addr {
	var out []netip.Addr
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.AAAA); ok {
			if ip, ok := netip.AddrFromSlice(a.AAAA.To16()); ok {
				out = append(out, ip)
			}
		}
	}
	return out
}
