package main

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/api"
)

// TestPodSourcesOnlyNarrow: runtimeConfig, annotations and CNI_ARGS may
// only narrow the network config's policy; a widening is refused naming
// the source's field, unless podMayWiden names it (then the same setting
// is taken). Each refusal stands next to its allowed narrowing.
func TestPodSourcesOnlyNarrow(t *testing.T) {
	const empty = `"policy": {"egress": "allowlist"}`
	const some = `"policy": {"egress": "allowlist", "allow": ["a.example:443", "b.example"], "scope": ["https://s.example"], "pin": true, "lab_peers": ["t1", "t2"], "on_deny": "drop"}`
	ann := func(kv string) string { return `"runtimeConfig": {"io.kubernetes.cri.pod-annotations": {` + kv + `}}` }
	rc := func(obj string) string { return `"runtimeConfig": {"enforcerd.io/policy": ` + obj + `}` }
	for _, c := range []struct {
		name, conf, args string
		widen            string // the podMayWiden field that lets it through; "" = a narrowing, always taken
		want             string // the refusal without podMayWiden
	}{
		{"egress public over an empty allowlist", empty + `, ` + ann(`"enforcerd.io/egress": "public"`), "", "egress",
			`pod annotation enforcerd.io/egress: egress "public" is wider than the network config's "allowlist"; the network config is the ceiling (name "egress" in its podMayWiden to let pods widen it)`},
		{"egress public over no policy", `"policy": {}, ` + ann(`"enforcerd.io/egress": "public"`), "", "egress",
			`pod annotation enforcerd.io/egress: egress "public" is wider than the network config's "allowlist"`},
		{"egress public by CNI_ARGS", empty, "ENFORCERD_EGRESS=public", "egress", `CNI_ARGS ENFORCERD_EGRESS: egress "public" is wider`},
		{"egress public by runtimeConfig", empty + `, ` + rc(`{"egress": "public"}`), "", "egress", `runtimeConfig enforcerd.io/policy field egress: egress "public" is wider`},
		{"egress allowlist under public", `"policy": {"egress": "public"}, ` + ann(`"enforcerd.io/egress": "allowlist"`), "", "", ""},
		{"an allow entry the config lacks", some + `, ` + ann(`"enforcerd.io/allow": "a.example:443,evil.example"`), "", "allow",
			`pod annotation enforcerd.io/allow: ["evil.example"] is not in the network config's allow ["a.example:443" "b.example"]`},
		{"an allow entry into an empty allowlist", empty, "ENFORCERD_ALLOW=evil.example", "allow", `CNI_ARGS ENFORCERD_ALLOW: ["evil.example"] is not in the network config's allow []`},
		{"fewer allow entries", some + `, ` + ann(`"enforcerd.io/allow": "b.example"`), "", "", ""},
		{"no allow entries", some, "ENFORCERD_ALLOW=", "", ""},
		{"a scope the config lacks", some + `, ` + rc(`{"scope": ["https://t.example"]}`), "", "scope", `runtimeConfig enforcerd.io/policy field scope: ["https://t.example"] is not in the network config's scope`},
		{"the config's scope", some + `, ` + rc(`{"scope": ["https://s.example"]}`), "", "", ""},
		{"unpin", some + `, ` + ann(`"enforcerd.io/pin": "false"`), "", "pin", `pod annotation enforcerd.io/pin: pin false unpins what the network config pins`},
		{"pin", empty + `, ` + ann(`"enforcerd.io/pin": "true"`), "", "", ""},
		{"lab target", empty + `, ` + ann(`"enforcerd.io/lab": "true"`), "", "lab", `pod annotation enforcerd.io/lab: lab true makes the pod a lab target`},
		{"not a lab target", empty + `, ` + ann(`"enforcerd.io/lab": "false"`), "", "", ""},
		{"a lab peer the config lacks", some + `, ` + ann(`"enforcerd.io/lab-peers": "t3"`), "", "lab_peers", `pod annotation enforcerd.io/lab-peers: lab peers ["t3"] are not in the network config's lab_peers ["t1" "t2"]`},
		{"lab peers into none", empty + `, ` + ann(`"enforcerd.io/lab-peers": "t1"`), "", "lab_peers", `pod annotation enforcerd.io/lab-peers: lab peers ["t1"] are not in the network config's lab_peers []`},
		{"fewer lab peers", some + `, ` + ann(`"enforcerd.io/lab-peers": "t2"`), "", "", ""},
		{"on_deny changed", some + `, ` + ann(`"enforcerd.io/on-deny": "reject"`), "", "on_deny", `pod annotation enforcerd.io/on-deny: on_deny "reject" differs from the network config's "drop"`},
		{"on_deny changed from the default", empty, "ENFORCERD_ON_DENY=drop", "on_deny", `CNI_ARGS ENFORCERD_ON_DENY: on_deny "drop" differs from the network config's ""`},
		{"on_deny as the config says", some + `, ` + ann(`"enforcerd.io/on-deny": "drop"`), "", "", ""},
		{"labels", empty + `, ` + rc(`{"labels": {"team": "x"}}`), "", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			build := func(widen string) (policy, error) {
				conf, err := parseConf([]byte(`{"name": "n", ` + widen + c.conf + `}`))
				if err != nil {
					t.Fatal(err)
				}
				p, _, err := buildPolicy(conf, c.args)
				return p, err
			}
			p, err := build("")
			if c.widen == "" {
				if err != nil {
					t.Fatalf("a narrowing refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q (policy %+v)", err, c.want, p)
			}
			wide, err := build(`"podMayWiden": ["` + c.widen + `"], `)
			if err != nil {
				t.Fatalf("with podMayWiden [%s]: %v", c.widen, err)
			}
			if reflect.DeepEqual(wide, policy{}) {
				t.Fatalf("with podMayWiden [%s]: an empty policy", c.widen)
			}
		})
	}
}

// TestPodPolicyTaken: what a pod narrows is what the daemon is asked for,
// and podMayWiden lets exactly the named field widen.
func TestPodPolicyTaken(t *testing.T) {
	conf, err := parseConf([]byte(`{"name": "n", "podMayWiden": ["egress"],
		"policy": {"allow": ["a.example:443", "b.example"]},
		"runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"enforcerd.io/egress": "public", "enforcerd.io/allow": "b.example"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := buildPolicy(conf, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := (policy{Egress: "public", Allow: []string{"b.example"}}); !reflect.DeepEqual(p, want) {
		t.Errorf("policy %+v, want %+v", p, want)
	}
	_, _, err = buildPolicy(conf, "ENFORCERD_ALLOW=c.example")
	if want := `CNI_ARGS ENFORCERD_ALLOW: ["c.example"] is not in the network config's allow`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("podMayWiden [egress] with a wider allow: error %v, want %q", err, want)
	}
}

type fakeInspector map[string]api.SessionInfo

func (f fakeInspector) Inspect(_ context.Context, name string) (api.SessionInfo, error) {
	if info, ok := f[name]; ok {
		return info, nil
	}
	return api.SessionInfo{}, api.ErrNotFound
}

// TestLabPeersOfTheSameNetwork: a lab peer a pod names must be a session
// attached through the same network config.
func TestLabPeersOfTheSameNetwork(t *testing.T) {
	sessions := fakeInspector{
		"same":    {Name: "same", NetnsPath: "/run/netns/x", Labels: map[string]string{labelNetwork: "n"}},
		"other":   {Name: "other", NetnsPath: "/run/netns/y", Labels: map[string]string{labelNetwork: "m"}},
		"outside": {Name: "outside", Labels: map[string]string{"team": "b"}},
		"posing":  {Name: "posing", Labels: map[string]string{labelNetwork: "n"}},
	}
	where := "pod annotation enforcerd.io/lab-peers"
	for peer, want := range map[string]string{
		"same":    "",
		"other":   where + `: lab peer "other" is not a session of network "n" (its enforcerd.io/cni-network label is "m")`,
		"outside": where + `: lab peer "outside" is not a session of network "n" (its enforcerd.io/cni-network label is "")`,
		"posing":  where + `: lab peer "posing" is not a session of network "n"`,
		"gone":    where + `: lab peer "gone" is no session; a pod may name only sessions of network "n"`,
	} {
		refused, err := checkLabPeers(context.Background(), sessions, "n", []podPeer{{peer, where}})
		if err != nil {
			t.Fatal(err)
		}
		if want == "" && refused != nil {
			t.Errorf("%s: refused: %v", peer, refused)
		}
		if want != "" && (refused == nil || !strings.Contains(refused.Error(), want)) {
			t.Errorf("%s: %v, want %q", peer, refused, want)
		}
	}
}
