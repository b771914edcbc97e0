package dhcpguest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// Defaults of a Lease.
const (
	DefaultLeaseTime = 5 * time.Minute
	DefaultMTU       = 1500
)

// Lease is the one lease a Responder hands out.
type Lease struct {
	MAC       net.HardwareAddr // the only client answered
	Addr      netip.Addr       // the guest's address
	Bits      int              // prefix length of the guest's subnet
	Gateway   netip.Addr       // router and server identifier
	DNS       netip.Addr       // the DNS anycast address
	MTU       uint16           // 0: DefaultMTU
	LeaseTime time.Duration    // 0: DefaultLeaseTime
}

// Validate checks a Lease.
func (l Lease) Validate() error {
	switch {
	case len(l.MAC) != 6:
		return fmt.Errorf("lease mac %q: want 6 octets", l.MAC)
	case !l.Addr.Is4() || !l.Gateway.Is4() || !l.DNS.Is4():
		return fmt.Errorf("lease %s via %s, dns %s: want IPv4 addresses", l.Addr, l.Gateway, l.DNS)
	case l.Bits < 1 || l.Bits > 30:
		return fmt.Errorf("lease prefix length %d: want 1 to 30", l.Bits)
	case l.MTU != 0 && l.MTU < 576:
		return fmt.Errorf("lease mtu %d: want 576 or more", l.MTU)
	}
	return nil
}

// Outcome says what Answer did with a frame.
type Outcome string

const (
	Ignored Outcome = "ignored" // not a DHCP request to a server, or a message type not served
	Foreign Outcome = "foreign" // another MAC (frame source or client hardware address): no answer
	Offered Outcome = "offer"
	Acked   Outcome = "ack"
	Nacked  Outcome = "nak" // a request for another address
	Other   Outcome = "other-server"
)

// Frame offsets and sizes.
const (
	ethLen     = 14
	ipv4MinLen = 20
	udpLen     = 8
	serverPort = 67
	clientPort = 68
)

var errShort = errors.New("frame too short")

// Answer is the responder's pure core: given a frame the guest sent (an
// Ethernet frame, as read from the tap), it returns the frame to send back
// or nil, and what it did. serverMAC is the answer's source MAC. A frame
// that is not an IPv4/UDP datagram to port 67, or whose DHCP message does
// not parse, is Ignored with the reason in err.
func Answer(frame []byte, l Lease, serverMAC net.HardwareAddr) ([]byte, Outcome, error) {
	payload, src, err := dhcpPayload(frame)
	if err != nil {
		return nil, Ignored, err
	}
	if !bytes.Equal(src, l.MAC) {
		return nil, Foreign, nil
	}
	req, err := dhcpv4.FromBytes(payload)
	if err != nil {
		return nil, Ignored, fmt.Errorf("parse dhcp message: %w", err)
	}
	if req.OpCode != dhcpv4.OpcodeBootRequest || req.HWType != iana.HWTypeEthernet {
		return nil, Ignored, nil
	}
	if !bytes.Equal(req.ClientHWAddr, l.MAC) {
		return nil, Foreign, nil
	}
	reply, outcome, err := l.reply(req)
	if reply == nil || err != nil {
		return nil, outcome, err
	}
	return l.frame(reply, serverMAC), outcome, nil
}

// reply builds the DHCP answer to req (from the lease's MAC), or nil.
func (l Lease) reply(req *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, Outcome, error) {
	var typ dhcpv4.MessageType
	outcome := Ignored
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		typ, outcome = dhcpv4.MessageTypeOffer, Offered
	case dhcpv4.MessageTypeRequest:
		if sid := req.ServerIdentifier(); sid != nil && !sid.Equal(l.Gateway.AsSlice()) {
			return nil, Other, nil // the client chose another server
		}
		want := req.RequestedIPAddress() // SELECTING, INIT-REBOOT
		if want == nil {
			want = req.ClientIPAddr // RENEWING, REBINDING
		}
		if !want.Equal(l.Addr.AsSlice()) {
			typ, outcome = dhcpv4.MessageTypeNak, Nacked
		} else {
			typ, outcome = dhcpv4.MessageTypeAck, Acked
		}
	default:
		return nil, Ignored, nil
	}
	lease := l.LeaseTime
	if lease == 0 {
		lease = DefaultLeaseTime
	}
	mtu := l.MTU
	if mtu == 0 {
		mtu = DefaultMTU
	}
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(typ),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(l.Gateway.AsSlice())),
	}
	if typ != dhcpv4.MessageTypeNak {
		mtuBytes := binary.BigEndian.AppendUint16(nil, mtu)
		mods = append(mods,
			dhcpv4.WithYourIP(l.Addr.AsSlice()),
			dhcpv4.WithNetmask(net.CIDRMask(l.Bits, 32)),
			dhcpv4.WithRouter(l.Gateway.AsSlice()),
			dhcpv4.WithDNS(l.DNS.AsSlice()),
			dhcpv4.WithOption(dhcpv4.OptIPAddressLeaseTime(lease)),
			dhcpv4.WithOption(dhcpv4.OptRenewTimeValue(lease/2)),
			dhcpv4.WithOption(dhcpv4.OptRebindingTimeValue(lease*7/8)),
			dhcpv4.WithGeneric(dhcpv4.OptionInterfaceMTU, mtuBytes),
		)
	}
	reply, err := dhcpv4.NewReplyFromRequest(req, mods...)
	if err != nil {
		return nil, Ignored, fmt.Errorf("build %s: %w", typ, err)
	}
	return reply, outcome, nil
}

// dhcpPayload checks that frame is an untagged IPv4 UDP datagram to port
// 67, not fragmented, and returns its payload and source MAC.
func dhcpPayload(frame []byte) (payload []byte, src net.HardwareAddr, err error) {
	if len(frame) < ethLen+ipv4MinLen+udpLen {
		return nil, nil, errShort
	}
	if binary.BigEndian.Uint16(frame[12:14]) != 0x0800 {
		return nil, nil, errors.New("not IPv4")
	}
	src = net.HardwareAddr(frame[6:12])
	ip := frame[ethLen:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < ipv4MinLen || len(ip) < ihl+udpLen {
		return nil, nil, errors.New("bad IPv4 header")
	}
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if total < ihl+udpLen || total > len(ip) {
		return nil, nil, fmt.Errorf("IPv4 total length %d of a %d-byte packet", total, len(ip))
	}
	ip = ip[:total] // drop the Ethernet padding
	if ip[9] != 17 {
		return nil, nil, errors.New("not UDP")
	}
	if binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 {
		return nil, nil, errors.New("a fragment")
	}
	udp := ip[ihl:]
	if binary.BigEndian.Uint16(udp[2:4]) != serverPort {
		return nil, nil, errors.New("not to port 67")
	}
	ulen := int(binary.BigEndian.Uint16(udp[4:6]))
	if ulen < udpLen || ulen > len(udp) {
		return nil, nil, fmt.Errorf("UDP length %d of a %d-byte datagram", ulen, len(udp))
	}
	return udp[udpLen:ulen], src, nil
}

// frame wraps a reply in UDP, IPv4 and Ethernet headers: from the
// gateway's address, port 67, to the client's MAC and port 68, to the
// offered address (broadcast for a NAK or when the client set the
// broadcast flag, RFC 2131 4.1).
func (l Lease) frame(reply *dhcpv4.DHCPv4, serverMAC net.HardwareAddr) []byte {
	msg := reply.ToBytes()
	dst := l.Addr
	if reply.MessageType() == dhcpv4.MessageTypeNak || reply.IsBroadcast() {
		dst = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	}
	src := l.Gateway
	out := make([]byte, ethLen+ipv4MinLen+udpLen+len(msg))
	copy(out[0:6], l.MAC)
	copy(out[6:12], serverMAC)
	binary.BigEndian.PutUint16(out[12:14], 0x0800)
	ip := out[ethLen : ethLen+ipv4MinLen]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(ipv4MinLen+udpLen+len(msg)))
	ip[8] = 64 // TTL
	ip[9] = 17 // UDP
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:12], checksum(ip, 0))
	udp := out[ethLen+ipv4MinLen:]
	binary.BigEndian.PutUint16(udp[0:2], serverPort)
	binary.BigEndian.PutUint16(udp[2:4], clientPort)
	binary.BigEndian.PutUint16(udp[4:6], uint16(udpLen+len(msg)))
	copy(udp[udpLen:], msg)
	// The pseudo-header's sum, then the datagram's.
	var pseudo uint32
	for _, b := range [][]byte{s4[:], d4[:]} {
		pseudo += uint32(binary.BigEndian.Uint16(b[0:2])) + uint32(binary.BigEndian.Uint16(b[2:4]))
	}
	pseudo += 17 + uint32(len(udp))
	sum := checksum(udp, pseudo)
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:8], sum)
	return out
}

// checksum is the Internet checksum of b, starting from sum.
func checksum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i : i+2]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// ClientFrame wraps a DHCP message as a client in INIT sends it: from
// src's MAC and 0.0.0.0:68 to the broadcast MAC and 255.255.255.255:67. A
// test's (and a probe's) stand-in for a guest.
func ClientFrame(src net.HardwareAddr, msg *dhcpv4.DHCPv4) []byte {
	l := Lease{MAC: net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, Addr: netip.AddrFrom4([4]byte{255, 255, 255, 255}), Gateway: netip.AddrFrom4([4]byte{})}
	out := l.frame(msg, src)
	// Swap the ports: client to server.
	udp := out[ethLen+ipv4MinLen:]
	binary.BigEndian.PutUint16(udp[0:2], clientPort)
	binary.BigEndian.PutUint16(udp[2:4], serverPort)
	binary.BigEndian.PutUint16(udp[6:8], 0) // no checksum (allowed for IPv4)
	return out
}

// ParseReply returns the DHCP message in a frame Answer built, checking
// its headers' lengths, ports and checksums.
func ParseReply(frame []byte) (*dhcpv4.DHCPv4, error) {
	if len(frame) < ethLen+ipv4MinLen+udpLen {
		return nil, errShort
	}
	ip := frame[ethLen:]
	ihl := int(ip[0]&0x0f) * 4
	if ihl != ipv4MinLen || checksum(ip[:ihl], 0) != 0 {
		return nil, errors.New("bad IPv4 header or checksum")
	}
	udp := ip[ihl:]
	if binary.BigEndian.Uint16(udp[0:2]) != serverPort || binary.BigEndian.Uint16(udp[2:4]) != clientPort {
		return nil, errors.New("not from port 67 to port 68")
	}
	var pseudo uint32
	for i := 12; i < 20; i += 2 {
		pseudo += uint32(binary.BigEndian.Uint16(ip[i : i+2]))
	}
	pseudo += 17 + uint32(len(udp))
	if checksum(udp, pseudo) != 0 {
		return nil, errors.New("bad UDP checksum")
	}
	return dhcpv4.FromBytes(udp[udpLen:])
}
