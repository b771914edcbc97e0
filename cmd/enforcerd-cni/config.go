package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/enforcerd/enforcerd/api"
)

// DefaultSocket is the daemon's socket when the network config names none.
const DefaultSocket = api.DefaultSocket

// Where a policy can come from, lowest precedence first: the network
// config's "policy", runtimeConfig's "enforcerd.io/policy" (a runtime
// passes it with that capability), the pod annotations containerd passes
// with the io.kubernetes.cri.pod-annotations capability, and CNI_ARGS. A
// field given by a later source replaces the earlier one (lists as a
// whole; labels are merged). The network config is the operator's and
// the ceiling: the later sources are the pod's, and may only narrow it
// (narrow.go) unless the config's "podMayWiden" names the field.
const (
	capPolicy      = "enforcerd.io/policy"
	capAnnotations = "io.kubernetes.cri.pod-annotations"
	annotationNS   = "enforcerd.io/" // annotation keys: enforcerd.io/allow, ...
	argPrefix      = "ENFORCERD_"    // CNI_ARGS keys: ENFORCERD_ALLOW, ...
	labelNetwork   = "enforcerd.io/cni-network"
)

// netConf is the plugin's network configuration.
type netConf struct {
	types.PluginConf
	Socket string          `json:"socket,omitempty"`
	Policy json.RawMessage `json:"policy,omitempty"`
	// PodMayWiden names the policy fields a pod's sources (runtimeConfig,
	// annotations, CNI_ARGS) may set wider than Policy; every other field
	// they may only narrow.
	PodMayWiden   []string `json:"podMayWiden,omitempty"`
	RuntimeConfig struct {
		Policy      json.RawMessage   `json:"enforcerd.io/policy,omitempty"`
		Annotations map[string]string `json:"io.kubernetes.cri.pod-annotations,omitempty"`
	} `json:"runtimeConfig,omitempty"`
	// InboundFromHost are the ports the node may open connections to in
	// every pod of this network (a kubelet's HTTP and TCP probes), as
	// api.CreateRequest.InboundFromHost. The operator's alone: it sits
	// outside "policy", so no annotation, runtimeConfig or CNI_ARGS sets it.
	InboundFromHost []string `json:"inboundFromHost,omitempty"`
}

// policy is every create option that makes sense for an interface, spelled
// as api.CreateRequest spells it in JSON; the sandbox's options are not
// here, so they are refused by name.
type policy struct {
	Egress   string            `json:"egress,omitempty"`
	Allow    []string          `json:"allow,omitempty"`
	Scope    []string          `json:"scope,omitempty"`
	Pin      bool              `json:"pin,omitempty"`
	Lab      bool              `json:"lab,omitempty"`
	LabPeers []string          `json:"lab_peers,omitempty"`
	OnDeny   string            `json:"on_deny,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
}

const policyFields = "egress, allow, scope, pin, lab, lab_peers, on_deny, labels"

func parseConf(stdin []byte) (*netConf, error) {
	conf := &netConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, fmt.Errorf("network config: %w", err)
	}
	if conf.Socket == "" {
		conf.Socket = DefaultSocket
	}
	return conf, nil
}

// buildPolicy layers the policy sources (see above) for one attachment:
// the network config's policy, then each pod source, refused when it
// widens the config's (narrow.go). It returns the pod's lab peers that
// the config did not name, which must be sessions of the same network
// (checkLabPeers).
func buildPolicy(conf *netConf, cniArgs string) (policy, []podPeer, error) {
	var base policy
	if err := decodePolicy(&base, conf.Policy, "policy"); err != nil {
		return base, nil, err
	}
	widen, err := parseWiden(conf.PodMayWiden)
	if err != nil {
		return base, nil, err
	}
	p := base
	var peers []podPeer
	apply := func(frag policy, set []string, name func(field string) string) error {
		for _, f := range set {
			if err := narrows(base, frag, f, widen); err != nil {
				return fmt.Errorf("%s: %w", name(f), err)
			}
			if f == "lab_peers" {
				for _, peer := range frag.LabPeers {
					if !slices.Contains(base.LabPeers, peer) {
						peers = append(peers, podPeer{name: peer, where: name(f)})
					}
				}
			}
		}
		mergeFields(&p, frag, set)
		return nil
	}
	rc := "runtimeConfig " + capPolicy
	var frag policy
	if err := decodePolicy(&frag, conf.RuntimeConfig.Policy, rc); err != nil {
		return p, nil, err
	}
	if err := apply(frag, jsonFields(conf.RuntimeConfig.Policy), func(f string) string { return rc + " field " + f }); err != nil {
		return p, nil, err
	}
	ann := annotations(conf.RuntimeConfig.Annotations)
	frag = policy{}
	if err := overlay(&frag, ann, "pod annotation "+annotationNS, ","); err != nil {
		return p, nil, err
	}
	if err := apply(frag, settingFields(ann), func(f string) string { return "pod annotation " + annotationNS + settingKey(ann, f) }); err != nil {
		return p, nil, err
	}
	args, err := argsOf(cniArgs)
	if err != nil {
		return p, nil, err
	}
	frag = policy{}
	if err := overlay(&frag, args, "CNI_ARGS "+argPrefix, ","); err != nil {
		return p, nil, err
	}
	if err := apply(frag, settingFields(args), func(f string) string { return "CNI_ARGS " + argPrefix + strings.ToUpper(settingKey(args, f)) }); err != nil {
		return p, nil, err
	}
	return p, peers, nil
}

// decodePolicy decodes one JSON policy over p, strictly: a field the
// plugin does not know is named in the error, with the ones it knows.
func decodePolicy(p *policy, raw json.RawMessage, where string) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(p)
	if err == nil {
		if _, eof := dec.Token(); eof != io.EOF {
			return fmt.Errorf("%s: trailing data after the object", where)
		}
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("%s: field %s: a JSON %s where %s is wanted", where, te.Field, te.Value, kindOf(te.Field))
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return fmt.Errorf("%s: unknown field %s; want %s (the sandbox's options have no meaning for an interface)", where, f, policyFields)
	}
	return fmt.Errorf("%s: %w", where, err)
}

func kindOf(field string) string {
	switch field {
	case "egress":
		return "a string"
	case "pin", "lab":
		return "a boolean"
	case "labels":
		return "an object of strings"
	}
	return "a list of strings"
}

// annotations keeps the pod annotations of enforcerd's namespace, by their
// short key ("allow" for enforcerd.io/allow).
func annotations(all map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range all {
		if short, ok := strings.CutPrefix(k, annotationNS); ok {
			out[short] = v
		}
	}
	return out
}

// argsOf keeps the CNI_ARGS ("K=V;K2=V2") of enforcerd's prefix, by their
// short key ("allow" for ENFORCERD_ALLOW). Other keys are the runtime's
// (K8S_POD_NAME, IgnoreUnknown, ...) and left alone.
func argsOf(cniArgs string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(cniArgs, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("CNI_ARGS: %q is not KEY=VALUE", kv)
		}
		if short, ok := strings.CutPrefix(k, argPrefix); ok {
			out[strings.ToLower(short)] = v
		}
	}
	return out, nil
}

// overlay applies string-valued settings (annotations, CNI_ARGS) over p;
// lists are split at sep. An unknown key or a bad boolean is named.
func overlay(p *policy, kv map[string]string, where, sep string) error {
	for _, k := range slices.Sorted(maps.Keys(kv)) {
		v := kv[k]
		switch strings.ReplaceAll(k, "-", "_") {
		case "egress":
			p.Egress = v
		case "allow":
			p.Allow = splitList(v, sep)
		case "scope":
			p.Scope = splitList(v, sep)
		case "lab_peers":
			p.LabPeers = splitList(v, sep)
		case "on_deny":
			p.OnDeny = v
		case "pin", "lab":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("%s%s: %q is not a boolean; want true or false", where, k, v)
			}
			if k == "pin" {
				p.Pin = b
			} else {
				p.Lab = b
			}
		default:
			return fmt.Errorf("%s%s: unknown setting; want egress, allow, scope, pin, lab, lab-peers or on-deny", where, k)
		}
	}
	return nil
}

func splitList(v, sep string) []string {
	out := []string{}
	for _, s := range strings.Split(v, sep) {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// sessionName derives an attachment's session name from what identifies
// it to the runtime (network, container id, interface): the id's head as
// far as it fits the name rules, for the operator's eye, and 12 hex digits
// of a SHA-256 of all three, so two attachments never share a name (a
// collision, at 48 bits, fails the ADD as a taken name; it never joins
// two containers). Deterministic, so DEL and CHECK find the session.
func sessionName(network, containerID, ifname string) string {
	sum := sha256.Sum256([]byte(network + "\x00" + containerID + "\x00" + ifname))
	var head strings.Builder
	for _, r := range strings.ToLower(containerID) {
		if head.Len() == 19 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' && head.Len() > 0 {
			head.WriteRune(r)
		}
	}
	h := strings.TrimRight(head.String(), "-")
	if h == "" {
		h = "c"
	}
	return h + "-" + hex.EncodeToString(sum[:6])
}

// createRequest is the daemon request of one ADD.
func createRequest(conf *netConf, p policy, containerID, netns, ifname string) api.CreateRequest {
	labels := maps.Clone(p.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[labelNetwork] = conf.Name
	return api.CreateRequest{
		Name:        sessionName(conf.Name, containerID, ifname),
		NetworkOnly: true,
		NetnsPath:   netns,
		IfName:      ifname,
		ContainerID: containerID,
		Egress:      p.Egress,
		Allow:       p.Allow,
		Scope:       p.Scope,
		Pin:         p.Pin,
		Lab:         p.Lab,
		LabPeers:    p.LabPeers,
		OnDeny:      p.OnDeny,
		Labels:      labels,

		InboundFromHost: conf.InboundFromHost,
	}
}
