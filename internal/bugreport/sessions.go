package bugreport

import (
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// SessionSummary is one session in the report: what helps with a bug and
// nothing that can hold a secret. Policy entries, scopes, pins and the
// rootfs path are counted or left out; labels are kept (an operator's
// tags).
type SessionSummary struct {
	Name        string             `json:"name"`
	Egress      string             `json:"egress"`
	Sandbox     bool               `json:"sandbox"`
	Attached    bool               `json:"attached,omitempty"` // its interface is in a netns the caller made (CNI)
	Locked      bool               `json:"locked,omitempty"`
	OnDeny      string             `json:"on_deny,omitempty"`
	NameCheck   *api.NameCheckView `json:"name_check,omitempty"` // its mode and counts: no names
	Generation  uint64             `json:"generation"`
	Allow       int                `json:"allow_entries"`
	Deny        int                `json:"deny_entries"`
	LabPeers    int                `json:"lab_peers"`
	Pinned      int                `json:"pinned_names"`
	Attested    int                `json:"attested"`
	Counters    api.Counters       `json:"counters"`
	MemoryBytes int64              `json:"memory_bytes,omitempty"`
	Pids        int64              `json:"pids,omitempty"`
	CPUs        float64            `json:"cpus,omitempty"`
	Labels      map[string]string  `json:"labels"`
	Created     time.Time          `json:"created"`
}

// Sessions summarises the daemon's sessions (as list or inspect gives them).
func Sessions(list []api.SessionInfo) []SessionSummary {
	out := make([]SessionSummary, 0, len(list))
	for _, s := range list {
		sum := SessionSummary{
			Name: s.Name, Egress: s.Egress, Sandbox: s.Sandbox, Attached: s.NetnsPath != "",
			Locked: s.Policy.Locked, OnDeny: s.Policy.OnDeny, Generation: s.Policy.Generation,
			Allow: len(s.Policy.Allow), Deny: len(s.Policy.Deny), LabPeers: len(s.Policy.LabPeers),
			Pinned: len(s.Policy.Pinned), Attested: len(s.Attested), Counters: s.Counters,
			Labels: s.Labels, Created: s.Created, NameCheck: s.NameCheck,
		}
		if s.SandboxView != nil {
			sum.MemoryBytes, sum.Pids, sum.CPUs = s.MemoryBytes, s.Pids, s.CPUs
		}
		if sum.Labels == nil {
			sum.Labels = map[string]string{}
		}
		out = append(out, sum)
	}
	return out
}
