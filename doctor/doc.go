// Package doctor is `enforcerd doctor`: the host checks (root and
// capabilities, netns and veth, nftables, /proc/sys/net, overlay,
// seccomp, cgroups, mount propagation, foreign links, the pool against the
// host's addresses, other firewalls' forward drops, legacy iptables,
// upstreams, the installed socket unit, the running daemon) and the
// datapath proof (a throwaway pair of sessions whose counters must show
// one packet accepted and one dropped). Run returns a Report; the CLI
// (cmd/enforcerd/cli_doctor.go) renders it, and serve runs its fatal
// subset before its first kernel change.
//
// It is a package because a diagnostic is a job apart from the lifecycle
// it diagnoses (tailscale's net/netcheck is the model): it drives the
// domain packages directly, in throwaway netns and under throwaway names,
// and shares no state with package daemon. Its probes reach other netns
// only through nsmgr's primitives (nsmgr.Do, nsmgr.HandleIn), never by
// netlink.NewHandleAt. The socket unit's reading (units.go) lives here
// too: serve's socket activation compares the unit with its config the
// same way.
package doctor
