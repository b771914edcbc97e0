package main

import (
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// sessionNameRule is nsmgr's rule for session names (not imported: the
// plugin links no netlink code, its tests neither).
var sessionNameRule = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

func TestBuildPolicyLayers(t *testing.T) {
	conf, err := parseConf([]byte(`{"cniVersion": "1.1.0", "name": "n", "type": "enforcerd-cni",
		"podMayWiden": ["egress", "allow", "lab_peers"],
		"policy": {"egress": "allowlist", "allow": ["a.example:443"], "scope": ["https://s.example"], "labels": {"team": "x"}},
		"runtimeConfig": {"enforcerd.io/policy": {"allow": ["b.example"], "pin": true},
			"io.kubernetes.cri.pod-annotations": {"enforcerd.io/allow": "c.example:443, *.cdn.example", "enforcerd.io/lab-peers": "t1", "other.io/x": "y"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if conf.Socket != DefaultSocket {
		t.Errorf("socket %q, want the default", conf.Socket)
	}
	p, peers, err := buildPolicy(conf, "IgnoreUnknown=1;K8S_POD_NAME=p;ENFORCERD_EGRESS=public")
	if err != nil {
		t.Fatal(err)
	}
	if want := []podPeer{{"t1", "pod annotation enforcerd.io/lab-peers"}}; !reflect.DeepEqual(peers, want) {
		t.Errorf("pod peers = %+v, want %+v", peers, want)
	}
	want := policy{Egress: "public", Allow: []string{"c.example:443", "*.cdn.example"}, Scope: []string{"https://s.example"},
		Pin: true, LabPeers: []string{"t1"}, Labels: map[string]string{"team": "x"}}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("policy = %+v\nwant %+v", p, want)
	}
}

func TestBuildPolicyErrors(t *testing.T) {
	for _, c := range []struct{ conf, args, want string }{
		{`{"policy": {"alow": ["x"]}}`, "", `policy: unknown field "alow"; want egress, allow, scope, pin, lab, lab_peers, on_deny, labels`},
		{`{"podMayWiden": ["everything"]}`, "", `podMayWiden: unknown field "everything"; want some of egress, allow, scope, pin, lab, lab_peers, on_deny`},
		{`{"policy": {"memory_bytes": 1}}`, "", `policy: unknown field "memory_bytes"`},
		{`{"policy": {"allow": "x"}}`, "", "policy: field allow: a JSON string where a list of strings is wanted"},
		{`{"policy": {"pin": "yes"}}`, "", "policy: field pin: a JSON string where a boolean is wanted"},
		{`{"runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"enforcerd.io/pin": "sure"}}}`, "", `pod annotation enforcerd.io/pin: "sure" is not a boolean; want true or false`},
		{`{"runtimeConfig": {"io.kubernetes.cri.pod-annotations": {"enforcerd.io/alow": "x"}}}`, "", "pod annotation enforcerd.io/alow: unknown setting"},
		{`{}`, "ENFORCERD_ALOW=x", "CNI_ARGS ENFORCERD_alow: unknown setting"},
		{`{}`, "novalue", `CNI_ARGS: "novalue" is not KEY=VALUE`},
	} {
		conf, err := parseConf([]byte(c.conf))
		if err == nil {
			_, _, err = buildPolicy(conf, c.args)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: error %v, want %q", c.conf, c.args, err, c.want)
		}
	}
}

func TestSessionName(t *testing.T) {
	id := "3f2a9c1d0e7b4a5f6c8d9e0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e"
	seen := map[string]bool{}
	for _, c := range [][3]string{
		{"n", id, "eth0"}, {"n", id, "net1"}, {"m", id, "eth0"}, {"n", "ABC_def.1", "eth0"},
		{"n", "---", "eth0"}, {"n", "", "eth0"}, {"n", "a-", "eth0"},
	} {
		name := sessionName(c[0], c[1], c[2])
		if !sessionNameRule.MatchString(name) {
			t.Errorf("sessionName%v = %q, not a session name", c, name)
		}
		if seen[name] {
			t.Errorf("sessionName%v = %q, a name already given", c, name)
		}
		seen[name] = true
		if again := sessionName(c[0], c[1], c[2]); again != name {
			t.Errorf("sessionName%v not deterministic: %q, %q", c, name, again)
		}
	}
	if got := sessionName("n", id, "eth0"); !strings.HasPrefix(got, id[:19]+"-") || len(got) != 32 {
		t.Errorf("sessionName of a 64-hex id = %q, want the id's first 19 characters and a 12-digit hash", got)
	}
}
