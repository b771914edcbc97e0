// Package world builds the self-contained test world every live test and the
// demo run in: a simulated host network namespace (which plays the host's
// root netns, where enforcerd and its nftables table live) and a simulated
// internet namespace linked to it by one veth pair, holding every server a
// test talks to.
//
// Nothing in a world is routed to the machine's real interfaces: the
// simulated host's only route out is its uplink to the simulated internet,
// and the simulated internet has no route anywhere but back to that uplink.
// Every object carries the world's run ID in its name and is removed by that
// exact name.
//
// Addresses (all inside the world):
//
//	198.18.0.1/30   internet side of the uplink
//	198.18.0.2/30   simulated host side of the uplink (its default route via .1)
//	198.18.0.53     authoritative DNS server (UDP and TCP)
//	198.18.1.10, 198.18.1.11, 198.18.2.10
//	                web servers: HTTP :80, TCP echo :7, UDP echo :7
//	169.254.169.254 a metadata look-alike, same servers: never reachable from a session
//	168.63.129.16   a cloud host endpoint look-alike (Azure's), same servers: likewise
//	10.99.0.10      a private server, same servers: never reachable from a session
//	198.18.3.10     a shared address (a CDN's front end), servers started by
//	                ServeShared: TLS :443 and :8443 with one certificate per
//	                name chosen by SNI (and ECH keys), HTTP :80 routed by
//	                Host, an SSH-like TCP :22 and a UDP :443 sink; each
//	                records every byte it received (Shared.Captures)
//
// IPv6, only once a test calls EnableIPv6 (2001:2::/48, RFC 5180's
// benchmarking prefix, the twin of 198.18.0.0/15):
//
//	2001:2::1/64    internet side of the uplink
//	2001:2::2/64    simulated host side of the uplink (its default route via ::1)
//	2001:2:0:1::10, 2001:2:0:1::11
//	                web servers: HTTP :80, TCP echo :7, UDP echo :7
//
// This package is only for tests and the demo; product code never imports it.
package world
