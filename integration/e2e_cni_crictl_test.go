package integration

// The kubelet's path: Debian's containerd with its CRI plugin, driven by
// crictl (the CRI's own client, what a kubelet speaks), runs pod
// sandboxes whose annotations reach enforcerd-cni through the
// io.kubernetes.cri.pod-annotations capability. containerd runs in the
// test world: its root, state, socket, CNI config and plugin directories
// are the test's (a mount namespace of its own binds the test's directory
// over /var/lib, where its libcni keeps a cache no setting moves, and
// mounts a tmpfs over /run/containerd, where its shims' sockets and runc's
// state go whatever the config says), in the world's host netns, with
// runc; the test starts it and kills it by PID. The pods' oom_score_adj is
// kept at containerd's own (restrict_oom_score_adj): a runtime nested in a
// container may not lower it, and runc's init dies at the attempt.
// The pause image is built here from the busybox rootfs and imported with
// ctr: nothing is pulled.

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/enforcerd/enforcerd/integration/world"
)

// crictlBin is crictl from ENFORCERD_CRICTL, else .cache/crictl/crictl
// (make crictl builds it). Missing fails under CI=true and skips
// elsewhere.
func crictlBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("ENFORCERD_CRICTL")
	if bin == "" {
		bin = filepath.Join("..", ".cache", "crictl", "crictl")
	}
	bin, _ = filepath.Abs(bin)
	if _, err := os.Stat(bin); err != nil {
		msg := "the kubelet-path test needs crictl at " + bin + " (make crictl)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + " (CI=true: failing instead of skipping)")
		}
		t.Skip(msg)
	}
	return bin
}

// criRuntime is one containerd with the CRI plugin, and crictl against it.
type criRuntime struct {
	t       *testing.T
	dir     string
	sock    string
	crictl  string
	confDir string
	cmd     *exec.Cmd
	log     bytes.Buffer
}

const containerdScript = `set -e
varlib=$1; shift
case "$(findmnt -n -o PROPAGATION /run/netns)" in
shared*) ;;
*) echo "/run/netns is not a shared mount: the daemon would not see containerd's netns" >&2; exit 1 ;;
esac
mount --make-private "$(findmnt -n -o TARGET --target /var/lib)"
mount --bind "$varlib" /var/lib
mkdir -p /run/containerd
mount --make-private "$(findmnt -n -o TARGET --target /run/containerd)"
mount -t tmpfs -o mode=0700 tmpfs /run/containerd
exec "$@"`

func startContainerd(t *testing.T, hostNS, pluginDir, conflist, pauseImage string) *criRuntime {
	t.Helper()
	containerd := requireTool(t, "containerd", "containerd")
	requireTool(t, "containerd-shim-runc-v2", "containerd")
	requireTool(t, "runc", "runc")
	requireTool(t, "nsenter", "util-linux")
	loopback := "/usr/lib/cni/loopback"
	if _, err := os.Stat(loopback); err != nil {
		msg := "the kubelet-path test needs " + loopback + " (Debian package containernetworking-plugins): containerd's CRI plugin adds a loopback network to every pod"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir, err := os.MkdirTemp("", "enfcri")
	if err != nil {
		t.Fatal(err)
	}
	r := &criRuntime{t: t, dir: dir, sock: filepath.Join(dir, "containerd.sock"), crictl: crictlBin(t), confDir: filepath.Join(dir, "net.d")}
	for _, d := range []string{"root", "state", "net.d", "bin", "varlib", "opt", "logs"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// The plugin directory: enforcerd-cni and Debian's loopback.
	for name, target := range map[string]string{"enforcerd-cni": filepath.Join(pluginDir, "enforcerd-cni"), "loopback": loopback} {
		if err := os.Symlink(target, filepath.Join(dir, "bin", name)); err != nil {
			t.Fatal(err)
		}
	}
	r.writeConf(conflist)
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = "%[3]s.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q
    max_conf_num = 1
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), r.sock, filepath.Join(dir, "opt"), pauseImage,
		filepath.Join(dir, "bin"), r.confDir)
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = os.Stat("/run/containerd")
	madeRunDir := os.IsNotExist(err) // (the script makes it as a mount point; removed at cleanup)
	r.cmd = exec.Command("nsenter", "--net="+hostNS, "--", "unshare", "--mount", "--propagation", "unchanged", "--",
		"sh", "-c", containerdScript, "sh", filepath.Join(dir, "varlib"), containerd, "--config", filepath.Join(dir, "config.toml"))
	r.cmd.Stdout, r.cmd.Stderr = &r.log, &r.log
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// Every pod of this containerd (their shims and netns go with
		// them), then containerd itself, by PID, then what it mounted
		// under its directories.
		if out, err := r.run("rmp", "--force", "--all"); err != nil {
			t.Errorf("cleanup: crictl rmp: %v\n%s", err, out)
		}
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = r.cmd.Process.Kill()
			<-exited
		}
		unmountUnder(t, dir)
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if madeRunDir {
			if err := os.Remove("/run/containerd"); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		if t.Failed() {
			t.Logf("containerd's log:\n%s", r.log.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := r.run("version"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not answer at %s within 30 s:\n%s", r.sock, r.log.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	return r
}

// writeConf writes the CNI network config containerd reads, in place:
// containerd 1.6 reloads its config directory on a write event and
// ignores a create (so a file renamed into place goes unseen).
func (r *criRuntime) writeConf(conflist string) {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(r.confDir, "10-enforcerd.conflist"), []byte(conflist), 0o600); err != nil {
		r.t.Fatal(err)
	}
}

// run runs crictl against this containerd.
func (r *criRuntime) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), e2eCommandTimeout)
	defer cancel()
	argv := append([]string{"--runtime-endpoint", "unix://" + r.sock, "--image-endpoint", "unix://" + r.sock, "--timeout", "60s"}, args...)
	cmd := exec.CommandContext(ctx, r.crictl, argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		// (crictl quotes the runtime's error: unquote it for the reader)
		return strings.ReplaceAll(strings.TrimSpace(stdout.String()+stderr.String()), `\"`, `"`), err
	}
	return strings.TrimSpace(stdout.String()), nil
}

// runPod runs a pod sandbox with the annotations and returns its id.
func (r *criRuntime) runPod(name string, annotations map[string]string) (string, error) {
	r.t.Helper()
	pod := map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": "default", "uid": name + "-uid", "attempt": 1},
		"annotations":   annotations,
		"log_directory": filepath.Join(r.dir, "logs"),
		"linux":         map[string]any{},
	}
	b, _ := json.Marshal(pod)
	p := filepath.Join(r.dir, name+".json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		r.t.Fatal(err)
	}
	out, err := r.run("runp", p)
	if err != nil {
		return "", fmt.Errorf("%w: %s", err, out)
	}
	lines := strings.Split(out, "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}

// netnsOf is the netns path of a pod sandbox, from crictl inspectp.
func (r *criRuntime) netnsOf(id string) string {
	r.t.Helper()
	out, err := r.run("inspectp", "-o", "json", id)
	if err != nil {
		r.t.Fatalf("crictl inspectp %s: %v\n%s", id, err, out)
	}
	var v struct {
		Info struct {
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct{ Type, Path string } `json:"namespaces"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		r.t.Fatalf("crictl inspectp %s: %v\n%s", id, err, out)
	}
	for _, ns := range v.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			return ns.Path
		}
	}
	r.t.Fatalf("pod %s has no network namespace path:\n%s", id, out)
	return ""
}

// importPause builds a one-layer OCI image from rootfs whose entrypoint
// sleeps, and imports it into containerd's k8s.io namespace as name.
func (r *criRuntime) importPause(rootfs, name string) {
	r.t.Helper()
	ctr := requireTool(r.t, "ctr", "containerd")
	archive := ociArchive(r.t, rootfs, name)
	cmd := exec.Command(ctr, "--address", r.sock, "--namespace", "k8s.io", "images", "import", "--snapshotter", "native", "-")
	cmd.Stdin = bytes.NewReader(archive)
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("ctr images import: %v\n%s", err, out)
	}
}

// ociArchive is an OCI image layout tar of one uncompressed layer.
func ociArchive(t *testing.T, rootfs, name string) []byte {
	t.Helper()
	layer, err := exec.Command("tar", "-C", rootfs, "-c", ".").Output()
	if err != nil {
		t.Fatalf("tar %s: %v", rootfs, err)
	}
	digest := func(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }
	config, _ := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux",
		"config": map[string]any{"Entrypoint": []string{"/bin/sleep", "2147483647"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{digest(layer)}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest(layer), "size": len(layer)}},
	})
	tag := name[strings.LastIndexByte(name, ':')+1:]
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"manifests": []any{map[string]any{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest(manifest), "size": len(manifest),
			"annotations": map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag}}},
	})
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, b []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	add("index.json", index)
	for _, b := range [][]byte{layer, config, manifest} {
		add("blobs/sha256/"+strings.TrimPrefix(digest(b), "sha256:"), b)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	var mounts []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mounts = append(mounts, f[4])
		}
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		if err := unix.Unmount(mounts[i], unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			t.Errorf("cleanup: unmount %s: %v", mounts[i], err)
		}
	}
}

// TestE2ECNICrictl: the kubelet's path. A pod sandbox run by containerd's
// CRI plugin gets its session through the plugin with the pod's
// annotations; under a network config of allowlist with no entries, an
// annotation of egress public is refused naming the annotation (and no
// sandbox runs), a narrowing pod runs and reaches nothing, and once the
// config lets pods widen egress the same annotation runs and reaches the
// simulated internet.
func TestE2ECNICrictl(t *testing.T) {
	pluginDir := e2eCNIPlugin(t)
	crictlBin(t)
	e := newE2E(t)
	sharedNetnsDir(t, e.w.ID)
	network := "cri" + e.w.ID
	public := netip.MustParseAddrPort("198.18.1.10:7")
	pause := "localhost/enftest-pause:" + e.w.ID
	closed := strings.Replace(cniConflist(network, e.d.Socket, `{"egress": "allowlist"}`), `"1.1.0"`, `"1.0.0"`, 1)
	r := startContainerd(t, e.w.HostPath, pluginDir, closed, pause)
	r.importPause(e.rootfs, pause)

	// Refused: the annotation widens the config's egress.
	_, err := r.runPod("wide-"+e.w.ID, map[string]string{"enforcerd.io/egress": "public"})
	if want := `pod annotation enforcerd.io/egress: egress "public" is wider than the network config's "allowlist"`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("runp with egress public under an empty allowlist: %v, want an error holding %q", err, want)
	}
	if out, _ := r.run("pods", "-q", "--state", "ready"); out != "" {
		t.Errorf("a refused pod runs: %s", out)
	}

	// A narrowing pod runs, through the plugin, and reaches nothing.
	id, err := r.runPod("narrow-"+e.w.ID, map[string]string{"enforcerd.io/egress": "allowlist"})
	if err != nil {
		t.Fatalf("runp with egress allowlist under allowlist: %v", err)
	}
	info, ok := e.sessionOf(id)
	if !ok || info.Egress != "allowlist" || info.Labels["enforcerd.io/cni-network"] != network {
		t.Fatalf("the narrowing pod's session: %+v (found %v)", info, ok)
	}
	ns := r.netnsOf(id)
	if info.NetnsPath != ns {
		t.Errorf("the session's netns %s, the pod's %s", info.NetnsPath, ns)
	}
	if err := world.TCPEcho(ns, public, time.Second); err == nil {
		t.Errorf("%s reachable from a pod of an empty allowlist", public)
	}

	// The config lets pods widen egress: the same annotation runs, and
	// its pod reaches the simulated internet (containerd reloads the
	// config directory; retried while it has not yet).
	r.writeConf(strings.Replace(cniConflistWiden(network, e.d.Socket, `{"egress": "allowlist"}`, `["egress"]`), `"1.1.0"`, `"1.0.0"`, 1))
	var wide string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if wide, err = r.runPod("wide-"+e.w.ID, map[string]string{"enforcerd.io/egress": "public"}); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("runp with egress public, the config letting pods widen egress: %v", err)
	}
	if s, ok := e.sessionOf(wide); !ok || s.Egress != "public" {
		t.Errorf("the widened pod's session: %+v", s)
	}
	if err := world.TCPEcho(r.netnsOf(wide), public, 3*time.Second); err != nil {
		t.Errorf("%s unreachable from a pod its config let widen to public: %v", public, err)
	}

	// Stopping and removing the pods removes their sessions.
	for _, p := range []string{id, wide} {
		if out, err := r.run("stopp", p); err != nil {
			t.Errorf("crictl stopp %s: %v\n%s", p, err, out)
		}
		if out, err := r.run("rmp", p); err != nil {
			t.Errorf("crictl rmp %s: %v\n%s", p, err, out)
		}
		if _, ok := e.sessionOf(p); ok {
			t.Errorf("pod %s removed, its session stays", p)
		}
	}
}
