// Package depaware holds only a test: the checked-in list of what each
// binary links (cmd/enforcerd/depaware.txt, cmd/enforcerd-cni/depaware.txt,
// cmd/enforcerctl/depaware.txt:
// every package outside the standard library, from `go list -deps` with the
// binary's build tags), as tailscale's depaware does. A change in what a
// binary links is then a reviewed diff, not a surprise: a new dependency of
// the CLI's start, or netlink in the CNI plugin.
//
// The test fails when a list is stale (regenerate: make depaware), and when
// the CNI plugin or the API client library (package api and its apitest,
// what every client command of enforcerd talks through) reaches netlink,
// nftables or libcontainer; and when enforcerctl, the thin client, links
// any package of the daemon's side (daemon, doctor, the domain packages;
// of container only container/rules).
package depaware
