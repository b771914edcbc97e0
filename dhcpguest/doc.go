// Package dhcpguest answers the DHCP of one VM guest: the responder a VM
// session's netns gets (see nsmgr.CreateVM). It owns one lease (a MAC and
// the address pre-assigned to it) and nothing else: it hands that address,
// the gateway, the DNS anycast address, an MTU and a short lease to that
// MAC, NAKs a request for any other address, and is silent for every other
// MAC.
//
// The pure core is Answer: a frame the guest sent in, a frame to send back
// (or none). Responder runs it on an AF_PACKET socket bound to the tap in
// the session netns, so it sees every frame the guest sends (a renewal is
// unicast to the server identifier, the gateway, which is not on the
// bridge) and nothing from outside the netns. Messages are parsed by
// github.com/insomniacslk/dhcp's dhcpv4; the Ethernet, IPv4 and UDP headers
// around them are checked here (fuzzed: FuzzAnswer).
package dhcpguest
