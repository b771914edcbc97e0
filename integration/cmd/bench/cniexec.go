package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// cniExec runs one CNI plugin binary as a runtime does (libcni): one exec
// per command from a thread in the simulated host, the network config on
// stdin, the CNI_* environment, into a named netns made beforehand; DEL
// gets the ADD result as prevResult. Both figure 9's plugin and every
// ptp peer are one.
type cniExec struct {
	label   string // "ptp", "enforcerd-cni": for errors
	bin     string
	cniPath string
	host    netns.NsHandle
	prefix  string // of the netns names, unique per run
	tag     string // between prefix and index: "p" (ptp), "e" (ours)

	mu   sync.Mutex
	prev map[int][]byte // ADD result per session, passed to DEL as prevResult
	made map[int]bool   // netns made and not yet removed
}

func newCNIExec(label, bin string, host netns.NsHandle, prefix, tag string) cniExec {
	return cniExec{label: label, bin: bin, cniPath: filepath.Dir(bin), host: host, prefix: prefix, tag: tag,
		prev: map[int][]byte{}, made: map[int]bool{}}
}

func (p *cniExec) nsName(i int) string { return fmt.Sprintf("%s-%s%d", p.prefix, p.tag, i) }

// hostIface returns the host-side interface the ADD result of session i
// names (the one without a sandbox).
func (p *cniExec) hostIface(i int) (string, error) {
	var res struct {
		Interfaces []struct {
			Name    string `json:"name"`
			Sandbox string `json:"sandbox"`
		} `json:"interfaces"`
	}
	p.mu.Lock()
	raw := p.prev[i]
	p.mu.Unlock()
	if err := json.Unmarshal(raw, &res); err != nil {
		return "", fmt.Errorf("%s ADD result: %w: %s", p.label, err, raw)
	}
	for _, itf := range res.Interfaces {
		if itf.Sandbox == "" {
			return itf.Name, nil
		}
	}
	return "", fmt.Errorf("%s ADD result names no host interface: %s", p.label, raw)
}

// waitGone waits (untimed by the caller's figure) until the host
// interface name (hostIface's, read before the DEL) is gone from the
// simulated host, and returns how long that took: a plugin whose DEL
// deletes the veth in the background so finishes that work before the
// next timed command starts.
func (p *cniExec) waitGone(name string, limit time.Duration) (time.Duration, error) {
	h, err := netlink.NewHandleAt(p.host)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	start := time.Now()
	for {
		if _, err := h.LinkByName(name); err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return time.Since(start), nil
			}
			return 0, fmt.Errorf("%s: look up %s: %w", p.label, name, err)
		}
		if time.Since(start) > limit {
			return 0, fmt.Errorf("%s: host interface %s still there %s after DEL", p.label, name, limit)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// NewNetns makes the session's named netns (untimed, as in the peer's own
// measurement: a runtime makes it before calling the plugin).
func (p *cniExec) NewNetns(ctx context.Context, i int) error {
	if _, err := run(ctx, 20*time.Second, "ip", "netns", "add", p.nsName(i)); err != nil {
		return err
	}
	p.markNetns(i)
	return nil
}

// markNetns records that session i's netns exists (made by the caller),
// so Close removes it; unmarkNetns that it was removed.
func (p *cniExec) markNetns(i int) {
	p.mu.Lock()
	p.made[i] = true
	p.mu.Unlock()
}

func (p *cniExec) unmarkNetns(i int) {
	p.mu.Lock()
	delete(p.made, i)
	p.mu.Unlock()
}

// DelNetns removes the session's named netns by exact name.
func (p *cniExec) DelNetns(i int) error {
	p.unmarkNetns(i)
	return removeNetnsFile(filepath.Join(world.NetnsDir, p.nsName(i)))
}

// removeNetns removes every netns made and not yet removed.
func (p *cniExec) removeNetns() {
	p.mu.Lock()
	var left []int
	for i := range p.made {
		left = append(left, i)
	}
	p.mu.Unlock()
	for _, i := range left {
		if err := p.DelNetns(i); err != nil {
			logf("cleanup: remove netns %s: %v", p.nsName(i), err)
		}
	}
}

// exec runs command for session i with conf on stdin and returns its
// stdout and how long the exec took.
func (p *cniExec) exec(command string, i int, conf []byte) ([]byte, time.Duration, error) {
	cmd := exec.Command(p.bin)
	cmd.Env = []string{
		"CNI_COMMAND=" + command,
		"CNI_CONTAINERID=" + p.nsName(i),
		"CNI_NETNS=" + filepath.Join(world.NetnsDir, p.nsName(i)),
		"CNI_IFNAME=eth0",
		"CNI_PATH=" + p.cniPath,
		"PATH=" + os.Getenv("PATH"),
	}
	cmd.Stdin = bytes.NewReader(conf)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	took, err := forkIn(p.host, cmd)
	if err != nil {
		return nil, 0, fmt.Errorf("%s %s %s: %w: %s %s", p.label, command, p.nsName(i), err, out.String(), errOut.String())
	}
	return out.Bytes(), took, nil
}

// add runs ADD for session i and keeps its result for DEL.
func (p *cniExec) add(i int, conf []byte) (time.Duration, error) {
	out, took, err := p.exec("ADD", i, conf)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	p.prev[i] = out
	p.mu.Unlock()
	return took, nil
}

// del runs DEL for session i with the ADD result as prevResult, as libcni
// passes it.
func (p *cniExec) del(i int, conf []byte) (time.Duration, error) {
	p.mu.Lock()
	prev := p.prev[i]
	delete(p.prev, i)
	p.mu.Unlock()
	if len(prev) > 0 {
		conf = append(conf[:len(conf)-1], `,"prevResult":`...)
		conf = append(append(conf, bytes.TrimSpace(prev)...), '}')
	}
	_, took, err := p.exec("DEL", i, conf)
	return took, err
}
