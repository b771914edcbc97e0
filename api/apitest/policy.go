package apitest

import (
	"context"
	"fmt"
	"slices"

	"github.com/enforcerd/enforcerd/api"
)

// UpdatePolicy changes a recorded session's allow list: a generation other
// than the current one is refused (409), as is a session named "locked-*".
func (f *Engine) UpdatePolicy(ctx context.Context, name string, u api.PolicyUpdate, replace bool) (api.SessionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sessions[name]
	if !ok {
		return s, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	gen := max(s.Policy.Generation, 1)
	switch {
	case len(name) > 7 && name[:7] == "locked-":
		return api.SessionInfo{}, fmt.Errorf("session %q was created with --locked: its policy never changes: %w", name, api.ErrLocked)
	case u.Generation != 0 && u.Generation != gen:
		return api.SessionInfo{}, fmt.Errorf("session %q: policy generation %d is stale (the current one is %d): %w", name, u.Generation, gen, api.ErrStaleGeneration)
	}
	allow := slices.Clone(u.Allow)
	if !replace {
		allow = append(slices.Clone(s.Policy.Allow), u.Allow...)
		allow = slices.DeleteFunc(allow, func(a string) bool { return slices.Contains(u.Revoke, a) })
	}
	deny := slices.Clone(u.Deny)
	if !replace {
		deny = append(slices.Clone(s.Policy.Deny), u.Deny...)
		deny = slices.DeleteFunc(deny, func(a string) bool { return slices.Contains(u.RevokeDeny, a) })
	}
	switch {
	case u.OnDeny != "":
		s.Policy.OnDeny = u.OnDeny
	case replace:
		s.Policy.OnDeny = "reject"
	}
	if u.NameCheck != "" {
		s.Policy.NameCheck = u.NameCheck
	}
	if u.QUIC != "" {
		s.Policy.QUIC = u.QUIC
	}
	s.Policy.Allow, s.Policy.Deny = allow, deny
	s.Policy.Generation = gen + 1
	f.sessions[name] = s
	return s, nil
}
