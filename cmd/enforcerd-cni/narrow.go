package main

// The network config is the ceiling of every attachment's policy: the
// operator writes it, while runtimeConfig, the pod's annotations and
// CNI_ARGS come from whoever may create a pod. Those sources may only
// narrow the config's policy, field by field, unless the config's
// "podMayWiden" names the field:
//
//   - egress: allowlist (also what "" means for an attachment) is
//     narrower than public; a pod may not go from allowlist to public.
//   - allow, scope, lab_peers: a pod's list must hold only entries of the
//     config's list, compared as written (the plugin links no policy
//     grammar: "a.example:443" does not narrow "a.example").
//   - pin: a pod may pin (it only fixes addresses), not unpin.
//   - lab: a pod may not make itself a lab target.
//   - on_deny: a pod may not change what a denied packet gets, whichever
//     way (the daemon's modes are the daemon's to rank).
//   - labels: not policy; a pod's are merged (the network label is the
//     plugin's, whatever they say).
//
// A lab peer a pod names that the config did not must be a session made
// through the same network config (checkLabPeers): a pod never reaches a
// lab target another tenant made outside it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/enforcerd/enforcerd/api"
)

// widenable are the fields podMayWiden may name.
var widenable = []string{"egress", "allow", "scope", "pin", "lab", "lab_peers", "on_deny"}

// parseWiden checks the config's podMayWiden.
func parseWiden(names []string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, n := range names {
		if !slices.Contains(widenable, n) {
			return nil, fmt.Errorf("podMayWiden: unknown field %q; want some of %s", n, strings.Join(widenable, ", "))
		}
		out[n] = true
	}
	return out, nil
}

// narrows reports nil when frag's field is no wider than base's, or the
// config lets pods widen it; otherwise an error saying how it widens.
func narrows(base, frag policy, field string, widen map[string]bool) error {
	if widen[field] {
		return nil
	}
	refuse := func(format string, a ...any) error {
		return fmt.Errorf(format+"; the network config is the ceiling (name %q in its podMayWiden to let pods widen it)", append(a, field)...)
	}
	switch field {
	case "egress":
		if egressRank(frag.Egress) > egressRank(base.Egress) {
			return refuse("egress %q is wider than the network config's %q", frag.Egress, egressOrDefault(base.Egress))
		}
	case "allow":
		if extra := notIn(frag.Allow, base.Allow); len(extra) > 0 {
			return refuse("%q is not in the network config's allow %q", extra, nonNil(base.Allow))
		}
	case "scope":
		if extra := notIn(frag.Scope, base.Scope); len(extra) > 0 {
			return refuse("%q is not in the network config's scope %q", extra, nonNil(base.Scope))
		}
	case "lab_peers":
		if extra := notIn(frag.LabPeers, base.LabPeers); len(extra) > 0 {
			return refuse("lab peers %q are not in the network config's lab_peers %q", extra, nonNil(base.LabPeers))
		}
	case "pin":
		if base.Pin && !frag.Pin {
			return refuse("pin false unpins what the network config pins")
		}
	case "lab":
		if frag.Lab && !base.Lab {
			return refuse("lab true makes the pod a lab target, which the network config does not")
		}
	case "on_deny":
		if frag.OnDeny != base.OnDeny {
			return refuse("on_deny %q differs from the network config's %q", frag.OnDeny, base.OnDeny)
		}
	}
	return nil
}

// egressRank orders the egress modes by what they let out: "" is what an
// attachment gets without one (allowlist); an unknown mode ranks above
// every mode, so it is refused here unless widening is allowed (and then
// by the daemon, naming it).
func egressRank(mode string) int {
	switch egressOrDefault(mode) {
	case "none":
		return 0
	case "allowlist":
		return 1
	case "public":
		return 2
	}
	return 3
}

func egressOrDefault(mode string) string {
	if mode == "" {
		return "allowlist"
	}
	return mode
}

func notIn(list, ceiling []string) []string {
	var extra []string
	for _, e := range list {
		if !slices.Contains(ceiling, e) {
			extra = append(extra, e)
		}
	}
	return extra
}

func nonNil(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

// mergeFields copies frag's fields named in set over p (labels merged).
func mergeFields(p *policy, frag policy, set []string) {
	for _, f := range set {
		switch f {
		case "egress":
			p.Egress = frag.Egress
		case "allow":
			p.Allow = frag.Allow
		case "scope":
			p.Scope = frag.Scope
		case "pin":
			p.Pin = frag.Pin
		case "lab":
			p.Lab = frag.Lab
		case "lab_peers":
			p.LabPeers = frag.LabPeers
		case "on_deny":
			p.OnDeny = frag.OnDeny
		case "labels":
			if p.Labels == nil {
				p.Labels = map[string]string{}
			} else {
				p.Labels = maps.Clone(p.Labels)
			}
			maps.Copy(p.Labels, frag.Labels)
		}
	}
}

// jsonFields are the fields a JSON policy object sets (decodePolicy has
// refused unknown ones already), in order.
func jsonFields(raw json.RawMessage) []string {
	var m map[string]json.RawMessage
	if len(raw) == 0 || json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return slices.Sorted(maps.Keys(m))
}

// settingFields are the fields string settings (annotations, CNI_ARGS
// short keys) set, spelled as in JSON ("lab-peers" is lab_peers).
func settingFields(kv map[string]string) []string {
	var out []string
	for k := range kv {
		out = append(out, strings.ReplaceAll(k, "-", "_"))
	}
	slices.Sort(out)
	return out
}

// settingKey is the key as the source spelled it for a field.
func settingKey(kv map[string]string, field string) string {
	for k := range kv {
		if strings.ReplaceAll(k, "-", "_") == field {
			return k
		}
	}
	return field
}

// podPeer is a lab peer a pod source named that the config did not.
type podPeer struct{ name, where string }

// sessionInspector is the daemon call checkLabPeers needs.
type sessionInspector interface {
	Inspect(ctx context.Context, name string) (api.SessionInfo, error)
}

// checkLabPeers refuses a pod's lab peer that is not a session attached
// through the same network config: its enforcerd.io/cni-network label
// names this network and it has a netns_path. A refusal is refused; a
// failed daemon call is callErr.
func checkLabPeers(ctx context.Context, c sessionInspector, network string, peers []podPeer) (refused, callErr error) {
	for _, p := range peers {
		info, err := c.Inspect(ctx, p.name)
		if errors.Is(err, api.ErrNotFound) {
			return fmt.Errorf("%s: lab peer %q is no session; a pod may name only sessions of network %q", p.where, p.name, network), nil
		}
		if err != nil {
			return nil, err
		}
		if got := info.Labels[labelNetwork]; got != network || info.NetnsPath == "" {
			return fmt.Errorf("%s: lab peer %q is not a session of network %q (its %s label is %q); a pod may name only sessions made through the same network config",
				p.where, p.name, network, labelNetwork, got), nil
		}
	}
	return nil, nil
}
