package api

import "time"

// Prefix is the version prefix of every route on the unix socket.
const Prefix = "/v1"

// CreateRequest is the body of POST /v1/sessions.
type CreateRequest struct {
	Name   string `json:"name"`
	Rootfs string `json:"rootfs,omitempty"` // empty with NetworkOnly
	// Image names an image of the daemon's image store (GET /v1/images):
	// the sandbox runs from its rootfs. Exclusive with Rootfs.
	Image       string            `json:"image,omitempty"`
	NetworkOnly bool              `json:"network_only,omitempty"` // no sandbox: bring your own runtime
	Writable    bool              `json:"writable,omitempty"`     // overlay upper dir instead of read-only + tmpfs /tmp
	Egress      string            `json:"egress,omitempty"`       // none|allowlist|public; "" = derived
	Allow       []string          `json:"allow,omitempty"`
	Scope       []string          `json:"scope,omitempty"`
	Pin         bool              `json:"pin,omitempty"`
	Lab         bool              `json:"lab,omitempty"`
	LabPeers    []string          `json:"lab_peers,omitempty"`
	NetRaw      bool              `json:"net_raw,omitempty"`
	MemoryBytes int64             `json:"memory_bytes,omitempty"`
	Pids        int64             `json:"pids,omitempty"`
	CPUs        float64           `json:"cpus,omitempty"` // like docker's --cpus; 0 = rules.DefaultCPUs
	Labels      map[string]string `json:"labels,omitempty"`
	// Deny entries win over every allow, in every mode: a name, wildcard,
	// address or CIDR (an address or CIDR optionally with a port).
	Deny []string `json:"deny,omitempty"`
	// OnDeny is what a packet the session's policy drops gets: "reject"
	// (the default when "": ICMP administratively prohibited, type 3 code
	// 13, for every protocol; a connect fails at once with EHOSTUNREACH),
	// "reset" (a TCP reset for TCP, so a connect says ECONNREFUSED;
	// admin-prohibited otherwise) or "drop" (silence). The daemon records
	// the value it applied; a record from before reject was the default
	// has none and keeps meaning drop.
	OnDeny string `json:"on_deny,omitempty"`
	// NameCheck is "tls" (the default when "") or "off": with tls, the
	// first bytes of every TCP flow the table admits because of a name
	// (an attested or pinned address; in public mode with deny entries by name,
	// every TCP flow) are read before any leaves the host, and a TLS
	// server_name or HTTP/1.x Host the policy does not allow on that port
	// ends the flow (docs/network-model.md, "Names on shared addresses").
	NameCheck string `json:"name_check,omitempty"`
	// QUIC is what the name check does with UDP/443 to a name-admitted
	// address: "refuse" (the default when "": refused as on_deny says,
	// so clients fall back to TCP) or "check" (the datagrams are held
	// until the ClientHello in the QUIC Initial packets is read, and its
	// server_name is checked as a TLS flow's). Only meaningful with
	// name_check tls.
	QUIC string `json:"quic,omitempty"`
	// Attach mode (what the CNI plugin asks for): the session's interface
	// is made in NetnsPath, a netns the caller made and keeps, instead of a
	// netns of the session's own; there is no sandbox (network_only is
	// implied). The three fields are also labels (LabelNetns, LabelIfName,
	// LabelContainerID).
	NetnsPath   string `json:"netns_path,omitempty"`
	IfName      string `json:"ifname,omitempty"`       // with netns_path; "" = eth0
	ContainerID string `json:"container_id,omitempty"` // with netns_path: the runtime's container id
	// Locked: the policy never changes; updates are refused (ErrLocked).
	Locked bool `json:"locked,omitempty"`
	// InboundFromHost are the ports on which the host (the daemon's netns:
	// the node, a kubelet's probes) may open connections into the session:
	// "PORT" (TCP and UDP) or "PORT/tcp", "PORT/udp". Empty: none, every
	// connection from the host is dropped (replies to the session's own
	// flows and the DNS proxy's answers always pass).
	InboundFromHost []string `json:"inbound_from_host,omitempty"`
	// VM: the session is a VM guest's (network_only is implied): in its
	// netns a bridge joins eth0 to a tap for the VMM, and the daemon's
	// DHCP responder leases the guest address to MAC alone. Tap names the
	// tap ("" = tap0), TapOwner the uid an unprivileged VMM runs as (nil:
	// root only), MAC the guest's MAC ("" = derived from the session: the
	// record keeps the value used).
	VM       bool   `json:"vm,omitempty"`
	Tap      string `json:"tap,omitempty"`
	TapOwner *int   `json:"tap_owner,omitempty"`
	MAC      string `json:"mac,omitempty"`
	// ForkOf makes this session a fork of the named one (session fork):
	// its policy, labels, lock and kind (sandbox, network-only or VM)
	// are the source's as the daemon records them now, with its own slot,
	// netns, tap and MAC (MAC "" = derived from the new name; give the
	// source's to keep a snapshot's), and none of the source's attested
	// addresses or flows. With it only name, mac, tap and tap_owner may
	// be given.
	ForkOf string `json:"fork_of,omitempty"`
	// AllowFor makes this call's Allow entries a grant with an end: a Go
	// duration ("10m", "90s"); when it has passed the daemon revokes them
	// as an update's revoke does (their static and attested addresses
	// leave the kernel, the DNS proxy refuses the names, established
	// flows under them are cut unless KeepEstablished). The deadline is in
	// the session's record, so it holds across a restart.
	AllowFor string `json:"allow_for,omitempty"`
	// KeepEstablished (with AllowFor only): the grant's end leaves the
	// established flows under its entries alone.
	KeepEstablished bool `json:"keep_established,omitempty"`
	// Connections makes this call's Allow entries (addresses, CIDRs and,
	// in egress allowlist, names: the flows to the addresses the
	// session's DNS answers for the name gave) a grant of that many new
	// flows each, counted in the kernel; the
	// next is refused (reason grant-used).
	Connections uint32 `json:"connections,omitempty"`
	// Budget gives each of this call's Allow entries (addresses, CIDRs
	// and names, as Connections) a byte budget: the bytes the guest may send to it, counted
	// in the kernel (IP packet lengths); once spent, new and established
	// packets to it are refused (reason budget).
	Budget uint64 `json:"budget,omitempty"`
	// EgressBudget is the bytes the guest may send in all (every
	// forwarded packet's IP length); once spent, everything it sends is
	// refused (reason budget). 0: none.
	EgressBudget uint64 `json:"egress_budget,omitempty"`
}

// GrantView is one grant with an end (PolicyView.Grants): the entries,
// when they expire, and, once they did, when.
type GrantView struct {
	Entries []string `json:"entries"`
	// Deadline is absent for a grant without an end (allow_for).
	Deadline        *time.Time `json:"deadline,omitempty"`
	KeepEstablished bool       `json:"keep_established,omitempty"`
	Ended           *time.Time `json:"ended,omitempty"`
	// Connections is each entry's count of new flows (0: none); Remaining
	// says, per entry, how many are left, read from the kernel (absent
	// when the grant no longer limits the entry: revoked, or a later
	// grant of the same entry replaced its count).
	Connections uint32            `json:"connections,omitempty"`
	Remaining   map[string]uint32 `json:"remaining,omitempty"`
	// Budget is each entry's byte budget (0: none); Spent says, per entry,
	// the bytes counted so far (absent when the grant no longer limits it).
	Budget uint64            `json:"budget,omitempty"`
	Spent  map[string]uint64 `json:"spent,omitempty"`
}

// BudgetView is a byte budget and what is spent of it (PolicyView).
type BudgetView struct {
	Bytes uint64 `json:"bytes"`
	Spent uint64 `json:"spent"`
	Left  uint64 `json:"left"`
}

// VMView is how a VM guest joins its session (SessionInfo.VM): the VMM
// runs in NetnsPath (jailer --netns, nsenter --net, setns) and attaches
// to Tap with MAC; the guest configures itself by DHCP or with KernelIPArg.
type VMView struct {
	NetnsPath string `json:"netns_path"`
	Tap       string `json:"tap"`
	TapOwner  *int   `json:"tap_owner,omitempty"`
	Bridge    string `json:"bridge"`
	MAC       string `json:"mac"`
	Address   string `json:"address"` // the guest's address with its prefix length (10.20.0.2/30)
	Gateway   string `json:"gateway"`
	DNS       string `json:"dns"`
	MTU       int    `json:"mtu"`
	LeaseSecs int    `json:"lease_seconds"`
	// KernelIPArg is the Linux kernel's ip= boot argument for the same
	// configuration, for a VMM that configures the guest statically.
	KernelIPArg string `json:"kernel_ip_arg"`
}

// The labels an attached session carries, from its request's fields.
const (
	LabelContainerID = "enforcerd.io/container-id"
	LabelNetns       = "enforcerd.io/netns"
	LabelIfName      = "enforcerd.io/ifname"
)

// AttestedAddr is one element of a session's attested set.
type AttestedAddr struct {
	IP      string    `json:"ip"`
	Expires time.Time `json:"expires"`
}

// Counters are a session's packet counters from the host's nftables table.
type Counters struct {
	AcceptedPackets uint64 `json:"accepted_packets"`
	AcceptedBytes   uint64 `json:"accepted_bytes"`
	// ReceivedPackets and ReceivedBytes count what was forwarded into the
	// session: the replies of its flows (a download is mostly replies).
	ReceivedPackets uint64 `json:"received_packets"`
	ReceivedBytes   uint64 `json:"received_bytes"`
	DroppedPackets  uint64 `json:"dropped_packets"`
	DroppedBytes    uint64 `json:"dropped_bytes"`
	// LimitedPackets: new flows dropped because the session was at its
	// flow cap or over its new-flow rate (also in DroppedPackets).
	LimitedPackets uint64 `json:"limited_packets"`
	// DroppedByReason counts dropped packets by reason (not-allowed, port,
	// special-purpose, resolver, spoofed, inbound, rate-limit, denied, name-mismatch, quic), exactly,
	// whatever the log's rate limit; reasons without drops are absent.
	// spoofed and inbound drops are not in DroppedPackets.
	DroppedByReason map[string]uint64 `json:"dropped_by_reason,omitempty"`
	// DroppedNoReason counts the packets in DroppedPackets that no reason
	// counts: packets conntrack calls invalid (a TCP reset or ACK of no
	// connection it knows, a malformed header) and ICMP errors about
	// another's flow, dropped before any policy looks at them. So
	// DroppedPackets = DroppedNoReason + the DroppedByReason counts other
	// than spoofed and inbound.
	DroppedNoReason uint64 `json:"dropped_no_reason"`
	// DropsNotLogged counts dropped new flows that got no flow event: the
	// kernel's per-session log budget suppressed them.
	DropsNotLogged uint64 `json:"drops_not_logged"`
}

// PolicyView is the normalised policy of a session as inspect shows it.
type PolicyView struct {
	Allow     []string            `json:"allow"`
	LabPeers  []string            `json:"lab_peers,omitempty"`
	Lab       bool                `json:"lab,omitempty"`
	Pinned    map[string][]string `json:"pinned,omitempty"`
	Deny      []string            `json:"deny,omitempty"`
	OnDeny    string              `json:"on_deny"`    // reject, reset or drop
	NameCheck string              `json:"name_check"` // tls or off
	QUIC      string              `json:"quic"`       // refuse or check (UDP/443 under the name check)
	// InboundFromHost: the ports the host may open connections to
	// (CreateRequest.InboundFromHost), normalised.
	InboundFromHost []string `json:"inbound_from_host,omitempty"`
	// Generation counts the policy's versions: 1 at create, one more per
	// update (name it in a PolicyUpdate to refuse a stale update).
	Generation uint64 `json:"generation"`
	Locked     bool   `json:"locked,omitempty"`
	// Updated is the last update, absent until the first.
	Updated *PolicyChange `json:"updated,omitempty"`
	// Grants are the grants with an end (allow_for), a count
	// (connections) or a byte budget (budget), ended ones included.
	Grants []GrantView `json:"grants,omitempty"`
	// EgressBudget is the session's byte budget (egress_budget), absent
	// without one.
	EgressBudget *BudgetView `json:"egress_budget,omitempty"`
}

// SandboxView is what a session's sandbox holds, the defaults filled in
// where the request gave none. Its fields appear at the top level of a
// SessionInfo, and only for a session with a sandbox.
type SandboxView struct {
	MemoryBytes int64   `json:"memory_bytes"` // rules.DefaultMemoryBytes when not given
	Pids        int64   `json:"pids"`         // rules.DefaultPidsMax when not given
	CPUs        float64 `json:"cpus"`         // rules.DefaultCPUs when not given
	NetRaw      bool    `json:"net_raw"`
	Writable    bool    `json:"writable"`
}

// SessionInfo is what list and inspect return.
type SessionInfo struct {
	Name       string     `json:"name"`
	Netns      string     `json:"netns"`
	GuestIP    string     `json:"guest_ip,omitempty"`
	GatewayIP  string     `json:"gateway_ip,omitempty"`
	Guest6IP   string     `json:"guest6_ip,omitempty"`   // a dual-stack session's IPv6 address (serve --pool6)
	Gateway6IP string     `json:"gateway6_ip,omitempty"` // its IPv6 gateway (the host end of its /126)
	DNS6       string     `json:"dns6,omitempty"`        // its IPv6 resolver (the v6 anycast address)
	HostVeth   string     `json:"host_veth,omitempty"`
	DNS        string     `json:"dns,omitempty"` // the resolver the session uses (the anycast address); none without a NIC
	Egress     string     `json:"egress"`
	Policy     PolicyView `json:"policy"`
	Sandbox    bool       `json:"sandbox"`
	Rootfs     string     `json:"rootfs,omitempty"`
	Image      string     `json:"image,omitempty"` // the image store's image the sandbox runs from, if one
	// Attached sessions only (see CreateRequest.NetnsPath); Netns is then
	// the netns path too.
	NetnsPath   string `json:"netns_path,omitempty"`
	IfName      string `json:"ifname,omitempty"`
	ContainerID string `json:"container_id,omitempty"`
	// VM sessions only: how the guest joins (see CreateRequest.VM).
	VM *VMView `json:"vm,omitempty"`
	// *SandboxView's fields, flattened; absent with --network-only.
	*SandboxView
	Attested []AttestedAddr `json:"attested"`
	Counters Counters       `json:"counters"`
	// NameCheck counts the flows the name check decided for this session
	// since the daemon started (absent without a network).
	NameCheck *NameCheckView    `json:"name_check,omitempty"`
	Labels    map[string]string `json:"labels"`
	Created   time.Time         `json:"created"`
}

// NameCheckView is a session's name check as inspect shows it: its mode
// and the flows it decided since the daemon started (Checked = Allowed +
// Refused + Passed).
type NameCheckView struct {
	Mode    string `json:"mode"`    // tls or off
	Checked uint64 `json:"checked"` // flows held and decided
	Allowed uint64 `json:"allowed"` // a name the policy allows on the port
	// Refused: a name the policy does not allow there, or a first
	// request that did not show a readable name within the bounds (a flow
	// event with reason name-mismatch each, its cause saying which).
	Refused uint64 `json:"refused"`
	// Passed: no name to check (a first payload that is neither a TLS
	// ClientHello nor an HTTP/1.x request, a ClientHello without
	// server_name, an address literal): L3 semantics.
	Passed uint64 `json:"passed"`
	// Overflowed: the session's packets the check dropped because its
	// backlog was full (a flood of checked connections); its TCP sends
	// them again. Not flows: packets.
	Overflowed uint64 `json:"overflowed"`
}

// ExecRequest is the body of POST /v1/sessions/{name}/exec.
type ExecRequest struct {
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	User string   `json:"user,omitempty"`
	// Stdin is the command's standard input, byte for byte: encoding/json
	// carries a []byte as a standard padded base64 string, because a JSON
	// string cannot hold bytes that are not UTF-8. Absent: /dev/null.
	Stdin   []byte `json:"stdin_b64,omitempty"`
	Timeout string `json:"timeout,omitempty"` // Go duration; "" = none
	// Detach answers at once with the exec's ExecInfo instead of
	// streaming its output (read it later from the output route).
	Detach bool `json:"detach,omitempty"`
}

// Event is one line of a session's audit stream (NDJSON).
type Event struct {
	Time    time.Time `json:"time"`
	Session string    `json:"session"`
	Kind    string    `json:"kind"` // one of the EventKind constants
	Action  string    `json:"action,omitempty"`
	// Caller is who made the API call the event records (create, exec,
	// delete); absent on events the daemon made by itself.
	Caller *Caller        `json:"caller,omitempty"`
	Detail map[string]any `json:"detail,omitempty"`
}

// Caller is the process at the other end of an API call's connection, from
// the socket's SO_PEERCRED: effective uid and gid, and pid.
type Caller struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	PID int32  `json:"pid"`
}

// Event kinds, and the two markers only a follower receives.
const (
	EventKindDNS       = "dns"
	EventKindLifecycle = "lifecycle"
	// EventKindFlow: a flow the table dropped (Action "dropped", Detail
	// proto, dst, dport, reason) or answered as the session's on_deny says
	// (Action "rejected", Detail answer too: "icmp-admin-prohibited" or
	// "tcp-reset"), or the summary of those the log budget suppressed
	// (Action "unlogged", Detail count).
	EventKindFlow = "flow"
	// EventKindSummary: what a flood of guest-driven events (dns, flow)
	// left out of the stream. Action "unlogged": detail.count lines were
	// left out of the sample here (every one still counted); action
	// "counts": the last line of a session's events as read, every
	// guest-driven event since its creation by kind_action (dns_allowed,
	// dns_denied, flow_dropped, ...) and detail.unlogged, the lines left
	// out of the sample.
	EventKindSummary = "summary"
	// EventKindMissed: this follower was too slow and missed
	// Detail["count"] events (the record itself lost none).
	EventKindMissed = "missed"
	// EventKindEnd is the last line of a follow stream the daemon ended
	// because nothing more can come (Action "removed": the session is
	// gone). A follow stream that ends without it was cut: the daemon
	// stopped or died.
	EventKindEnd = "end"
)

// DNSActionFiltered is the action of a dns event whose answer had
// addresses and every one was filtered out (Detail["dropped"]): the
// session got no address, where "allowed" means it got some.
const DNSActionFiltered = "filtered"

// ExecFrame is one NDJSON frame of an exec response. The first frame of
// POST .../exec carries only ExecID. Output is in Data when it is valid
// UTF-8 and in DataB64 otherwise, so that no byte is lost; Offset is where
// the output stream stands after the frame: GET .../execs/{id}/output with
// that offset resumes right after it. The last frame carries Exit, and
// Error when the command did not end by itself (ExitTimeout) or enforcerd
// failed (ExitEnforcerd).
type ExecFrame struct {
	ExecID  string `json:"exec_id,omitempty"`
	Stream  string `json:"stream,omitempty"` // "stdout" or "stderr"
	Data    string `json:"data,omitempty"`
	DataB64 string `json:"data_b64,omitempty"`
	Offset  int64  `json:"offset,omitempty"`
	Exit    *int   `json:"exit,omitempty"`
	Error   string `json:"error,omitempty"`
}

// ExecInfo is one exec of a session: GET .../execs and .../execs/{id},
// and the answer of a detached POST .../exec. An exec runs in a holder
// process of its own: it outlives a restart of the daemon.
type ExecInfo struct {
	ID      string   `json:"id"`
	Session string   `json:"session"`
	Args    []string `json:"args"`
	State   string   `json:"state"` // ExecRunning or ExecExited
	// Exit is the status the exec's last frame carries, once exited.
	Exit *int `json:"exit,omitempty"`
	// Error is the last frame's error line, when it has one.
	Error       string     `json:"error,omitempty"`
	Started     time.Time  `json:"started"`
	Ended       *time.Time `json:"ended,omitempty"`
	OutputBytes int64      `json:"output_bytes"` // the offset the output has reached
}

// ExecInfo states.
const (
	ExecRunning = "running"
	ExecExited  = "exited"
)

// Exit statuses an exec frame carries besides the command's own, as
// container runtimes use them.
const (
	ExitTimeout   = 124 // the command timed out
	ExitEnforcerd = 125 // enforcerd itself failed
	ExitNotExec   = 126 // the command was found but cannot be run
	ExitNotFound  = 127 // the command was not found
)

// DeleteResponse is the body of both DELETE routes.
type DeleteResponse struct {
	Deleted []string `json:"deleted"`
}

// VersionInfo is the body of GET /v1/version.
type VersionInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"` // the git commit it was built from, when known
	Go      string `json:"go,omitempty"`     // the Go version it was built with
	API     string `json:"api"`
}

// Status is the body of GET /v1/healthz and /v1/readyz.
type Status struct {
	Status string `json:"status"`
}

// ErrorBody is the body of every refusal: one line naming the bad value,
// and the code a program branches on (one of Codes; a daemon older than
// the codes sends none).
type ErrorBody struct {
	Error string `json:"error"`
	Code  string `json:"code"`
}
