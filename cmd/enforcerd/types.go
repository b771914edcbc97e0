package main

import (
	"context"
	"errors"
	"io"
	"time"
)

// API version prefix of every route on the unix socket.
const apiPrefix = "/v1"

// CreateRequest is the body of POST /v1/sessions.
type CreateRequest struct {
	Name        string            `json:"name"`
	Rootfs      string            `json:"rootfs,omitempty"`       // empty with NetworkOnly
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
	CPUs        float64           `json:"cpus,omitempty"` // like docker's --cpus; 0 = container.DefaultCPUs
	Labels      map[string]string `json:"labels,omitempty"`
}

// AttestedAddr is one element of a session's attested set.
type AttestedAddr struct {
	IP      string    `json:"ip"`
	Expires time.Time `json:"expires"`
}

// Counters are a session's packet counters from the host's nftables table.
type Counters struct {
	AcceptedPackets uint64 `json:"accepted_packets"`
	AcceptedBytes   uint64 `json:"accepted_bytes"`
	DroppedPackets  uint64 `json:"dropped_packets"`
	DroppedBytes    uint64 `json:"dropped_bytes"`
	// LimitedPackets: new flows dropped because the session was at its
	// flow cap or over its new-flow rate (also in DroppedPackets).
	LimitedPackets uint64 `json:"limited_packets"`
}

// PolicyView is the normalised policy of a session as inspect shows it.
type PolicyView struct {
	Allow    []string            `json:"allow"`
	LabPeers []string            `json:"lab_peers,omitempty"`
	Lab      bool                `json:"lab,omitempty"`
	Pinned   map[string][]string `json:"pinned,omitempty"`
}

// SandboxView is what a session's sandbox holds, the defaults filled in
// where the request gave none. Its fields appear at the top level of a
// SessionInfo, and only for a session with a sandbox.
type SandboxView struct {
	MemoryBytes int64   `json:"memory_bytes"` // container.DefaultMemoryBytes when not given
	Pids        int64   `json:"pids"`         // container.DefaultPidsMax when not given
	CPUs        float64 `json:"cpus"`         // container.DefaultCPUs when not given
	NetRaw      bool    `json:"net_raw"`
	Writable    bool    `json:"writable"`
}

// SessionInfo is what list and inspect return.
type SessionInfo struct {
	Name      string     `json:"name"`
	Netns     string     `json:"netns"`
	GuestIP   string     `json:"guest_ip,omitempty"`
	GatewayIP string     `json:"gateway_ip,omitempty"`
	HostVeth  string     `json:"host_veth,omitempty"`
	DNS       string     `json:"dns,omitempty"` // the resolver the session uses (the anycast address); none without a NIC
	Egress    string     `json:"egress"`
	Policy    PolicyView `json:"policy"`
	Sandbox   bool       `json:"sandbox"`
	Rootfs    string     `json:"rootfs,omitempty"`
	// *SandboxView's fields, flattened; absent with --network-only.
	*SandboxView
	Attested []AttestedAddr    `json:"attested"`
	Counters Counters          `json:"counters"`
	Labels   map[string]string `json:"labels"`
	Created  time.Time         `json:"created"`
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
}

// Event is one line of a session's audit stream (NDJSON).
type Event struct {
	Time    time.Time      `json:"time"`
	Session string         `json:"session"`
	Kind    string         `json:"kind"` // "dns" or "lifecycle"
	Action  string         `json:"action,omitempty"`
	Detail  map[string]any `json:"detail,omitempty"`
}

// Errors the engine returns; the API maps them to status codes.
var (
	ErrNotFound      = errors.New("unknown session")        // 404
	ErrNameTaken     = errors.New("session name taken")     // 409
	ErrPoolExhausted = errors.New("address pool exhausted") // 503
	ErrBadRequest    = errors.New("bad request")            // 400
	ErrNoSandbox     = errors.New("session has no sandbox") // 409
	ErrExecTimeout   = errors.New("command timed out")      // exec exit 124
	// ErrNotStarted: the command never started; Exec returns its status
	// with it (127 not found, 126 cannot be run, as container runtimes).
	ErrNotStarted = errors.New("command not started")
)

// Engine is what the API serves: the session lifecycle composed from nsmgr,
// netpolicy, dnsproxy and container. Errors wrap the sentinels above.
type Engine interface {
	Create(ctx context.Context, req CreateRequest) (SessionInfo, error)
	Delete(ctx context.Context, name string) error
	DeleteByLabel(ctx context.Context, key, value string) ([]string, error)
	List(labelKey, labelValue string) []SessionInfo
	Inspect(name string) (SessionInfo, error)
	// Exec runs a command in the session's sandbox, streaming its output,
	// and returns its exit status (ErrExecTimeout wrapped on timeout).
	Exec(ctx context.Context, name string, req ExecRequest, stdout, stderr io.Writer) (int, error)
	// Events returns the recorded events of a session and, when follow is
	// set, a channel of new ones closed when ctx ends or the session goes.
	Events(ctx context.Context, name string, follow bool) ([]Event, <-chan Event, error)
	Healthy() error
}
