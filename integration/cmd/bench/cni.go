package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// cniDir is where Debian's containernetworking-plugins installs the plugins.
const cniDir = "/usr/lib/cni"

// ptpPeer is the peer of a session network: the CNI ptp plugin with
// host-local IPAM, one /30 per session from peerPool, doing ADD and DEL into
// fresh named netns made beforehand with `ip netns add` (as a runtime would).
// The plugin is started from a thread inside the simulated host, so its
// host-side veth and routes land there, never in the real root netns.
type ptpPeer struct {
	cniExec
	ipamDir string
}

// peerPool is the peer's address pool: apart from enforcerd's 10.20.0.0/16,
// so both can live in one simulated host.
var peerPool = netip.MustParsePrefix("10.21.0.0/16")

func newPtpPeer(host netns.NsHandle, prefix, tmp string) (*ptpPeer, error) {
	if _, err := os.Stat(filepath.Join(cniDir, "ptp")); err != nil {
		return nil, fmt.Errorf("cni ptp plugin: %w (install containernetworking-plugins)", err)
	}
	dir := filepath.Join(tmp, prefix+"-ipam")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &ptpPeer{cniExec: newCNIExec("ptp", filepath.Join(cniDir, "ptp"), host, prefix, "p"), ipamDir: dir}, nil
}

func (p *ptpPeer) conf(i int) []byte {
	base := peerPool.Addr().As4()
	off := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	off += uint32(4 * i)
	subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(off >> 24), byte(off >> 16), byte(off >> 8), byte(off)}), 30)
	return fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":"%s-ptp","type":"ptp","ipMasq":false,"mtu":1500,`+
		`"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"%s"}]],"routes":[{"dst":"0.0.0.0/0"}]}}`,
		p.prefix, p.ipamDir, subnet)
}

// Add runs ptp ADD for session i and returns how long the plugin took.
func (p *ptpPeer) Add(i int) (time.Duration, error) { return p.add(i, p.conf(i)) }

// Del runs ptp DEL for session i.
func (p *ptpPeer) Del(i int) (time.Duration, error) { return p.del(i, p.conf(i)) }

// Check verifies, after Add(i), that the host side of session i is in the
// simulated host and not in the machine's root netns, and that the session
// got its address.
func (p *ptpPeer) Check(i int) error {
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	p.mu.Lock()
	raw := p.prev[i]
	p.mu.Unlock()
	if err := json.Unmarshal(raw, &res); err != nil {
		return fmt.Errorf("ptp ADD result: %w: %s", err, raw)
	}
	if len(res.IPs) == 0 || !strings.HasPrefix(res.IPs[0].Address, "10.21.") {
		return fmt.Errorf("ptp ADD result has no 10.21 address: %s", raw)
	}
	name, err := p.hostIface(i)
	if err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(p.host)
	if err != nil {
		return err
	}
	_, inHost := h.LinkByName(name)
	h.Close()
	if inHost != nil {
		return fmt.Errorf("ptp host veth %s is not in the simulated host: %v", name, inHost)
	}
	if _, err := netlink.LinkByName(name); err == nil {
		return fmt.Errorf("ptp host veth %s appeared in the real root netns", name)
	}
	return nil
}

// Close removes every netns the peer made and its IPAM state.
func (p *ptpPeer) Close() {
	p.removeNetns()
	os.RemoveAll(p.ipamDir)
}

// spawnFloor is one bare fork+exec of /bin/true from inside the simulated
// host: the machine's process-spawn cost at that moment, which every plugin
// exec pays at least once (in-process netlink does not).
func spawnFloor(host netns.NsHandle) time.Duration {
	d, _ := forkIn(host, exec.Command("/bin/true"))
	return d
}
