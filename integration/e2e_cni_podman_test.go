package integration

// The CNI plugin under a real runtime: Debian's podman with its CNI
// backend runs a container from the busybox rootfs (imported as an image)
// on an enforcerd-cni network, and the container's egress is what the
// network's policy allows. Podman is pointed at the test's own directories
// through its own configuration (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF,
// CONTAINERS_REGISTRIES_CONF): the network config and plugin directories,
// the image store, its run and tmp directories and the event log are all
// under the test's temporary directory, never /etc/cni, /etc/containers or
// /var/lib/containers. Podman and everything it starts run in the world's
// host netns (nsenter --net), where the daemon makes the host side of each
// veth; the container's netns is podman's own. The OCI runtime is named,
// Debian's runc (make deps installs it): podman picks crun when it finds
// one, and crun refuses to run on a host with hybrid cgroups ("cgroups in
// hybrid mode not supported"), which Debian 12 with cgroup v1 is.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// podman runs Debian's podman with the test's configuration.
type podman struct {
	t      *testing.T
	bin    string
	runc   string // the OCI runtime podman is told to use
	hostNS string // the world's host netns path
	varLib string // the test's /var/lib for podman (see podmanScript)
	env    []string
}

// requireTool finds a program in PATH. Missing fails under CI=true (make
// deps installs it) and skips elsewhere.
func requireTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	msg := fmt.Sprintf("the test needs %s (Debian package %s; make deps installs it)", name, pkg)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + " (CI=true: failing instead of skipping)")
	}
	t.Skip(msg)
	return ""
}

func newPodman(t *testing.T, hostNS, pluginDir, network, conflist string) *podman {
	t.Helper()
	bin := requireTool(t, "podman", "podman")
	runc := requireTool(t, "runc", "runc")
	requireTool(t, "nsenter", "util-linux")
	requireTool(t, "unshare", "util-linux")
	requireTool(t, "findmnt", "util-linux")
	dir := t.TempDir()
	for _, d := range []string{"net", "root", "run", "tmp", "varlib"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// The limits: podman's default nofile and nproc (2^20 and more) are
	// above what an unprivileged container of a CI runner may set; runc
	// fails with "error setting rlimits" there.
	files := map[string]string{
		"containers.conf": fmt.Sprintf(`[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %[1]q
tmp_dir = %[2]q
runtime = "runc"

[engine.runtimes]
runc = [%[6]q]

[network]
network_backend = "cni"
cni_plugin_dirs = [%[3]q]
network_config_dir = %[4]q
default_network = %[5]q
`, filepath.Join(dir, "events.log"), filepath.Join(dir, "tmp"), pluginDir, filepath.Join(dir, "net"), network, runc),
		"storage.conf": fmt.Sprintf("[storage]\ndriver = \"vfs\"\ngraphroot = %q\nrunroot = %q\n",
			filepath.Join(dir, "root"), filepath.Join(dir, "run")),
		"registries.conf":              "unqualified-search-registries = []\n",
		"net/" + network + ".conflist": conflist,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := &podman{t: t, bin: bin, runc: runc, hostNS: hostNS, varLib: filepath.Join(dir, "varlib"), env: append(os.Environ(),
		"CONTAINERS_CONF="+filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF="+filepath.Join(dir, "storage.conf"),
		"CONTAINERS_REGISTRIES_CONF="+filepath.Join(dir, "registries.conf"),
	)}
	t.Cleanup(func() {
		// (a failed test may leave a container running: its conmon and
		// netns go with it)
		if out, err := p.run("rm", "--force", "--all", "--time", "0"); err != nil {
			t.Errorf("cleanup: podman rm: %v\n%s", err, out)
		}
	})
	return p
}

// podmanScript runs podman ("$@") in a mount namespace of its own whose
// /var/lib is the test's directory ($1): containers/image keeps a blob-info
// cache at /var/lib/containers/cache and podman 4.3's libcni its cache at
// /var/lib/cni, both fixed for root (no setting moves them). The mount
// that holds /var/lib is made private in that namespace first, so the bind
// mount stays in it; /run/netns stays shared with the machine's, so the
// netns podman mounts there is the one the daemon opens.
const podmanScript = `set -e
varlib=$1; shift
case "$(findmnt -n -o PROPAGATION /run/netns)" in
shared*) ;;
*) echo "/run/netns is not a shared mount: the daemon would not see podman's netns" >&2; exit 1 ;;
esac
mount --make-private "$(findmnt -n -o TARGET --target /var/lib)"
mount --bind "$varlib" /var/lib
exec "$@"`

// run runs podman in the world's host netns and returns its output.
func (p *podman) run(args ...string) (string, error) {
	return p.runIn(nil, args...)
}

func (p *podman) runIn(stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	argv := append([]string{"--net=" + p.hostNS, "--", "unshare", "--mount", "--propagation", "unchanged", "--",
		"sh", "-c", podmanScript, "sh", p.varLib, p.bin}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", argv...)
	cmd.Env = p.env
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// importRootfs imports a rootfs directory as an image.
func (p *podman) importRootfs(rootfs, image string) {
	p.t.Helper()
	tar, err := exec.Command("tar", "-C", rootfs, "-c", ".").Output()
	if err != nil {
		p.t.Fatalf("tar %s: %v", rootfs, err)
	}
	if out, err := p.runIn(tar, "import", "-", image); err != nil {
		p.t.Fatalf("podman import %s: %v\n%s", rootfs, err, out)
	}
}

// sharedNetnsDir makes /run/netns a shared mount point as iproute2 does
// (ip netns add makes it one on first use, and keeps it): a netns that
// podman mounts there from its own mount namespace then shows in the
// daemon's. The throwaway netns is deleted at once.
func sharedNetnsDir(t *testing.T, id string) {
	t.Helper()
	name := "enftest-pm" + id
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v\n%s", name, err, out)
	}
	if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns delete %s: %v\n%s", name, err, out)
	}
}

// machineResidue lists what a runtime run on this machine could leave
// outside the test: the root netns's links and the directories a runtime
// writes by default.
func machineResidue(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatalf("ip link in the root netns: %v", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			fmt.Fprintf(&b, "link %s\n", strings.TrimSuffix(f[1], ":"))
		}
	}
	for _, d := range []string{"/etc/cni/net.d", "/etc/containers", "/var/lib/containers", "/var/lib/cni", "/run/containers", "/run/libpod", "/run/netns", "/etc/netns"} {
		ents, err := os.ReadDir(d)
		if err != nil {
			fmt.Fprintf(&b, "%s absent\n", d)
			continue
		}
		for _, e := range ents {
			if (d == "/run/netns" || d == "/etc/netns") && !strings.HasPrefix(e.Name(), "netns-") {
				continue // (not podman's: the world's and other tests' netns come and go)
			}
			fmt.Fprintf(&b, "%s/%s\n", d, e.Name())
		}
	}
	return b.String()
}

// readmeCNIExample is the network config the README's CNI section shows
// (its first json block), as the README has it.
func readmeCNIExample(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Container runtimes: the CNI plugin")
	if !ok {
		t.Fatal("README.md has no section \"Container runtimes: the CNI plugin\"")
	}
	_, block, ok := strings.Cut(section, "\n```json\n")
	if !ok {
		t.Fatal("README.md's CNI section has no json block")
	}
	block, _, ok = strings.Cut(block, "\n```")
	if !ok {
		t.Fatal("README.md's CNI json block does not end")
	}
	return block
}

func TestE2ECNIPodman(t *testing.T) {
	pluginDir := e2eCNIPlugin(t)
	e := newE2E(t)
	// The README's network config, word for word but for the socket (the
	// test's daemon listens in the test's directory): its cniVersion is
	// one podman 4.3's libcni accepts, and its policy is what the
	// container gets. The test world serves the README's names.
	example := readmeCNIExample(t)
	const readmeSocket = `"socket": "` + api.DefaultSocket + `"`
	if strings.Count(example, readmeSocket) != 1 {
		t.Fatalf("the README's CNI example does not name the default socket as %s:\n%s", readmeSocket, example)
	}
	conflist := strings.Replace(example, readmeSocket, fmt.Sprintf(`"socket": %q`, e.d.Socket), 1)
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
	}
	if err := json.Unmarshal([]byte(conflist), &conf); err != nil {
		t.Fatalf("the README's CNI example: %v\n%s", err, example)
	}
	e.w.DNS.AddRR("api.example.com. 300 IN A 198.18.1.10")
	e.w.DNS.AddRR("img.cdn.example.net. 300 IN A 198.18.2.10")
	e2eServeTCPEcho(t, e.w.NetPath, netip.MustParseAddrPort("198.18.1.10:443"))

	sharedNetnsDir(t, e.w.ID)
	p := newPodman(t, e.w.HostPath, pluginDir, conf.Name, conflist)
	before := machineResidue(t)

	image := "localhost/enftest-busybox:" + e.w.ID
	p.importRootfs(e.rootfs, image)
	id, err := p.run("run", "--detach", "--network", conf.Name, "--name", "enftest-"+e.w.ID, image, "sleep", "120")
	if err != nil {
		t.Fatalf("podman run (the README's network config, cniVersion %s): %v\n%s", conf.CNIVersion, err, id)
	}
	if i := strings.LastIndexByte(id, '\n'); i >= 0 {
		id = id[i+1:] // (the id is the last line; warnings come first)
	}
	// The container runs under the runtime the test named.
	if out, err := p.run("inspect", "--format", "{{.OCIRuntime}}", id); err != nil || out != "runc" {
		t.Errorf("podman inspect: the container's OCI runtime is %q (%v), want runc (%s)", out, err, p.runc)
	}

	// The daemon made the container's session, in the netns podman made.
	info, ok := e.sessionOf(id)
	if !ok {
		t.Fatalf("no session carries podman's container %s: %v", id, e.list())
	}
	if !strings.HasPrefix(info.NetnsPath, "/run/netns/") || info.IfName != "eth0" || info.Labels["enforcerd.io/cni-network"] != conf.Name {
		t.Errorf("session of the podman container: %+v", info)
	}
	if _, err := hostHandle(t, e.w).LinkByName(info.HostVeth); err != nil {
		t.Errorf("host veth %s not in the world's host netns: %v", info.HostVeth, err)
	}

	inside := func(script string) (string, error) {
		return p.run("exec", "enftest-"+e.w.ID, "sh", "-c", script)
	}
	// Inside the container: its address, and a resolv.conf that names the
	// session's resolver (the anycast address) and nothing else: not the
	// host's nameservers (which the sandbox cannot reach: every fallback
	// query would time out), no search domain, no options.
	out, err := inside("ip -4 -o addr show eth0")
	if err != nil || !strings.Contains(out, "inet "+info.GuestIP+"/30") {
		t.Errorf("the container's eth0: %v\n%s", err, out)
	}
	resolv, err := inside("cat /etc/resolv.conf")
	if err != nil {
		t.Fatalf("the container's resolv.conf: %v\n%s", err, resolv)
	}
	var servers, other []string
	for _, l := range strings.Split(resolv, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case f[0] == "nameserver" && len(f) == 2:
			servers = append(servers, f[1])
		default:
			other = append(other, l)
		}
	}
	if dns := e2eAnycastDNS.Addr().String(); len(servers) == 0 || slices.ContainsFunc(servers, func(s string) bool { return s != dns }) || len(other) > 0 {
		t.Errorf("the container's resolv.conf names %v and %q, want only nameserver %s:\n%s", servers, other, dns, resolv)
	}
	// Allowed: the policy's names, resolved through the daemon, and their
	// addresses: api.example.com on 443 only, any port of *.cdn.example.net.
	// (Debian's static busybox resolves with its own resolver in
	// nslookup; its wget, and nc given a name, crash in the static libc's
	// getaddrinfo, so connections go to the address nslookup printed.)
	for name, addr := range map[string]string{"api.example.com": "198.18.1.10", "img.cdn.example.net": "198.18.2.10"} {
		out, err = inside("nslookup " + name)
		if err != nil || !strings.Contains(out, addr) {
			t.Errorf("nslookup %s in the container: %v\n%s", name, err, out)
		}
	}
	for _, dst := range []string{"198.18.1.10 443", "198.18.2.10 7"} {
		out, err = inside("echo enforcerd | nc -w 3 " + dst)
		if err != nil || out != "enforcerd" {
			t.Errorf("allowed %s from the container: %v\n%s", dst, err, out)
		}
	}
	// Blocked: another port of the allowed address, another address of
	// the same network, the metadata address, and a name the policy does
	// not allow (the resolver refuses it). The session's --on-deny is the
	// default, reject: nc fails at once with "No route to host".
	for _, dst := range []string{"198.18.1.10 7", "198.18.1.11 7", "169.254.169.254 80"} {
		out, err := inside("echo enforcerd | nc -w 2 " + dst)
		if err == nil || !strings.Contains(out, "No route to host") {
			t.Errorf("blocked %s from the container: %v (want No route to host: rejected)\n%s", dst, err, out)
		}
	}
	if out, err := inside("nslookup docs.e2e.test"); err == nil || strings.Contains(out, "198.18.1.11") {
		t.Errorf("nslookup docs.e2e.test in the container resolved: %v\n%s", err, out)
	}
	if c := e.inspect(info.Name).Counters; c.DroppedPackets == 0 {
		t.Errorf("the session counted no dropped packet: %+v", c)
	}

	// podman rm: podman's CNI DEL removes the session and its veth, and
	// podman its netns.
	if out, err := p.run("rm", "--force", "--time", "0", "enftest-"+e.w.ID); err != nil {
		t.Fatalf("podman rm: %v\n%s", err, out)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := e.sessionOf(id); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("podman rm left the session of %s", id)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := hostHandle(t, e.w).LinkByName(info.HostVeth); err == nil {
		t.Errorf("podman rm left the host veth %s", info.HostVeth)
	}
	if isNetnsFile(info.NetnsPath) {
		t.Errorf("podman rm left its netns %s", info.NetnsPath)
	}
	if out, err := p.run("rmi", image); err != nil {
		t.Errorf("podman rmi: %v\n%s", err, out)
	}

	// Nothing of it landed on the machine.
	if after := machineResidue(t); after != before {
		t.Errorf("podman left things outside the test:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if list := e.list(); slices.ContainsFunc(list, func(s api.SessionInfo) bool { return s.ContainerID != "" }) {
		t.Errorf("sessions left: %v", list)
	}
}
