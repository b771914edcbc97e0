package daemon

import (
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// Every example docs/kubernetes.md gives works: its network configs'
// policy and inboundFromHost pass create's validation, and so does every
// value its annotation table shows; the value it calls bad is refused. (Its
// annotation example once named 10.0.0.0/8, which every pod copying it
// failed on: private ranges are refused.)
func TestKubernetesDocExamples(t *testing.T) {
	doc, err := os.ReadFile("../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	guard, err := netpolicy.NewGuard(nsmgr.DefaultPool, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := New(Config{Pool: nsmgr.DefaultPool}, Parts{Guard: guard})

	blocks := regexp.MustCompile("(?s)```json\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) == 0 {
		t.Fatal("no network config in docs/kubernetes.md")
	}
	for _, b := range blocks {
		var conf struct {
			Plugins []struct {
				Type            string            `json:"type"`
				Policy          api.CreateRequest `json:"policy"`
				InboundFromHost []string          `json:"inboundFromHost"`
			} `json:"plugins"`
		}
		dec := json.NewDecoder(strings.NewReader(string(b[1])))
		if err := dec.Decode(&conf); err != nil || len(conf.Plugins) == 0 {
			t.Errorf("network config in docs/kubernetes.md: %v\n%s", err, b[1])
			continue
		}
		for _, p := range conf.Plugins {
			req := p.Policy
			req.Name, req.NetnsPath, req.InboundFromHost = "docs", "/run/netns/x", p.InboundFromHost
			if _, err := d.buildPolicy(req); err != nil {
				t.Errorf("network config in docs/kubernetes.md: %v\n%s", err, b[1])
			}
		}
	}

	rows := regexp.MustCompile("(?m)^\\| `enforcerd\\.io/([a-z-]+)` \\| (.*) \\|$").FindAllSubmatch(doc, -1)
	checked := map[string]int{}
	for _, r := range rows {
		key := string(r[1])
		for _, v := range regexp.MustCompile("`([^`]*)`").FindAllSubmatch(r[2], -1) {
			val := strings.Trim(string(v[1]), `"`)
			var err error
			switch key {
			case "allow":
				for _, ent := range strings.Split(val, ",") {
					if _, e := netpolicy.ParseEntry(strings.TrimSpace(ent), guard); e != nil {
						err = e
					}
				}
			case "scope":
				for _, u := range strings.Split(val, ",") {
					if _, e := netpolicy.ParseScope(strings.TrimSpace(u), guard); e != nil {
						err = e
					}
				}
			case "egress":
				_, err = netpolicy.ParseMode(val)
			case "pin":
				_, err = strconv.ParseBool(val)
			default:
				continue
			}
			checked[key]++
			if err != nil {
				t.Errorf("docs/kubernetes.md: annotation enforcerd.io/%s example %q: %v", key, val, err)
			}
		}
	}
	for _, k := range []string{"allow", "scope", "egress", "pin"} {
		if checked[k] == 0 {
			t.Errorf("docs/kubernetes.md: no example of enforcerd.io/%s found to check", k)
		}
	}
	if _, err := netpolicy.ParseEntry("api.example.com:99999", guard); err == nil || !strings.Contains(string(doc), "`api.example.com:99999`") {
		t.Errorf("the doc's bad value api.example.com:99999: %v, want refused and named in the doc", err)
	}
	if _, err := netpolicy.ParseEntry("10.0.0.0/8", guard); err == nil {
		t.Error("10.0.0.0/8 accepted; the doc says private ranges are refused")
	}
}
