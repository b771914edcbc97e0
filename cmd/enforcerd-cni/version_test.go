package main

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/enforcerd/enforcerd/api"
)

// TestMain runs the plugin's main when the test binary is exec'd as the
// plugin (see runPlugin), so the tests drive the real VERSION handling.
func TestMain(m *testing.M) {
	if os.Getenv("ENFORCERD_CNI_TEST_AS_PLUGIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runPlugin execs this test binary as the plugin with CNI's environment
// and returns its stdout.
func runPlugin(t *testing.T, command, stdin string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{"ENFORCERD_CNI_TEST_AS_PLUGIN=1", "CNI_COMMAND=" + command,
		"CNI_CONTAINERID=ctr-v", "CNI_NETNS=/run/netns/enforcerd-cni-version-test", "CNI_IFNAME=eth0", "CNI_PATH=/nonexistent"}
	cmd.Stdin = strings.NewReader(stdin)
	var out bytes.Buffer
	cmd.Stdout = &out
	err := cmd.Run()
	return out.Bytes(), err
}

// The plugin answers VERSION with every spec version the CNI library can
// give its result in, 1.0.0 (podman 4.3) and the 0.3/0.4 ones included.
func TestVersionListsEverySpecVersion(t *testing.T) {
	out, err := runPlugin(t, "VERSION", `{"cniVersion": "1.0.0"}`)
	if err != nil {
		t.Fatalf("VERSION: %v\n%s", err, out)
	}
	var got struct {
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("VERSION answer %s: %v", out, err)
	}
	want := []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}
	if !slices.Equal(got.SupportedVersions, want) {
		t.Errorf("VERSION lists %v, want %v", got.SupportedVersions, want)
	}
}

// A network config of every supported version gets past the version
// check to the daemon call (here: no daemon, so try again later, code
// 11), where an unsupported one is refused as incompatible (code 1).
func TestAddAcceptsEverySupportedVersion(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	for _, v := range append(supportedVersions.SupportedVersions(), "9.9.9") {
		conf := `{"cniVersion": "` + v + `", "name": "n", "type": "enforcerd-cni", "socket": "` + sock + `"}`
		out, err := runPlugin(t, "ADD", conf)
		if err == nil {
			t.Errorf("ADD %s with no daemon succeeded: %s", v, out)
			continue
		}
		var ce types.Error
		if jerr := json.Unmarshal(out, &ce); jerr != nil {
			t.Errorf("ADD %s: answer %s: %v", v, out, jerr)
			continue
		}
		want := uint(types.ErrTryAgainLater)
		if v == "9.9.9" {
			want = types.ErrIncompatibleCNIVersion
		}
		if ce.Code != want {
			t.Errorf("ADD with cniVersion %s: code %d (%s), want %d", v, ce.Code, ce.Msg, want)
		}
	}
}

// The result converts to every supported version and parses back there,
// keeping the address, the gateway and the nameserver.
func TestResultInEverySupportedVersion(t *testing.T) {
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	info := api.SessionInfo{Name: "s", GuestIP: "10.200.0.2", GatewayIP: "10.200.0.1", HostVeth: "h", DNS: "10.20.255.254"}
	res, err := result(info, "eth0", "/run/netns/x", mac)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range supportedVersions.SupportedVersions() {
		conv, err := res.GetAsVersion(v)
		if err != nil {
			t.Errorf("result as %s: %v", v, err)
			continue
		}
		var buf bytes.Buffer
		if err := conv.PrintTo(&buf); err != nil {
			t.Errorf("print as %s: %v", v, err)
			continue
		}
		back, err := version.NewResult(v, buf.Bytes())
		if err != nil {
			t.Errorf("parse %s result %s: %v", v, buf.String(), err)
			continue
		}
		if back.Version() != v {
			t.Errorf("%s result parses as %s", v, back.Version())
		}
		text := buf.String()
		for _, want := range []string{`"cniVersion": "` + v + `"`, "10.200.0.2/30", "10.200.0.1", "10.20.255.254"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s result lacks %s: %s", v, want, text)
			}
		}
	}
}
