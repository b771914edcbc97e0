// Package nsmgr owns the per-session network plumbing of enforcerd: the IPAM
// of /30 slots carved from the session pool, the named network namespace of
// every session (bind-mounted under /run/netns so `ip netns exec` works on
// it), the veth pair joining it to the daemon's netns, their addresses, the
// guest's default route, the IPv6, forwarding and ARP settings, the DNS
// anycast interface, the iproute2 resolv.conf of each netns, and the
// recovery and reaping of those objects by prefix.
//
// Everything nsmgr creates carries the prefix (Config.Prefix) and is found
// and removed by exact name:
//
//	netns           <prefix>-<session>   (file under Config.NetnsDir)
//	prepared netns  <prefix>-pool_<pid>_<n> (file under Config.NetnsDir: made ahead of demand,
//	                                      claimed by Create, removed by Close and Reap; see prepared.go)
//	host-side veth  <prefix><slot>h      (in Config.HostNS, alias "<prefix>-<session>")
//	guest-side veth eth0                 (in the session netns)
//	attached veth   <prefix><slot>h      (alias "<prefix>-<session> attached"; its peer named by
//	                                      the caller in a netns nsmgr did not make, see Attach)
//	DNS interface   <prefix>dns          (in Config.HostNS)
//	resolv.conf     <prefix>-<session>/resolv.conf (under Config.EtcNetnsDir, for `ip netns exec`)
//
// An attached session (Attach) has no netns file, resolv.conf or netns of
// its own: its veth is created with its peer directly in the runtime's
// netns, deleted synchronously by Delete and Reap, and the runtime's netns
// is never unmounted or removed.
//
// A released slot is handed out again only once its old host veth is gone
// and Config.GuestClean (the firewall's conntrack flush) says nothing keyed
// by its guest address remains. Serve refuses to start beside a link that
// carries the prefix and is none of these (ForeignLinks).
//
// The alias on the host-side veth names its owner: interface names of two
// prefixes can collide ("enf" slot 25 and "enf2" slot 5 are both "enf25h"),
// so Recover and Reap only claim a link whose alias carries "<prefix>-".
//
// nsmgr never assumes that the calling thread's netns is the host netns: it
// takes the host netns as a handle and talks to every namespace through
// netlink handles bound to it. The only place that switches a thread's netns
// is netnsdo.go (Do and its sibling for creating a netns): the thread is
// locked, and unlocked only after switching back succeeded.
//
// The pure core (name validation and derivation, the IPAM) has no I/O and is
// unit-tested in this package; everything that touches the kernel is tested
// live in integration/nsmgr_live_test.go.
package nsmgr
