package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/container"
)

// runcPeer runs Debian's runc on a bundle made from the busybox image with
// `runc spec`, with its own --root under the run's scratch directory.
type runcPeer struct {
	root, bundle string
	prefix       string // of container ids, unique per run

	mu   sync.Mutex
	live map[string]bool
}

// newRuncPeer writes the bundle: `runc spec`, then the image as a
// read-only root and a long sleep as the process (no terminal).
func newRuncPeer(ctx context.Context, tmp, rootfs, prefix string) (*runcPeer, error) {
	if rootfs == "" {
		return nil, fmt.Errorf("no busybox image: set ENFORCERD_ROOTFS (make bench builds it)")
	}
	p := &runcPeer{root: filepath.Join(tmp, prefix+"-root"), bundle: filepath.Join(tmp, prefix+"-bundle"),
		prefix: prefix, live: map[string]bool{}}
	if err := os.MkdirAll(p.bundle, 0o755); err != nil {
		return nil, err
	}
	if _, err := run(ctx, 30*time.Second, "runc", "spec", "--bundle", p.bundle); err != nil {
		return nil, err
	}
	path := filepath.Join(p.bundle, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, fmt.Errorf("runc spec: %w", err)
	}
	spec["root"] = map[string]any{"path": rootfs, "readonly": true}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"sleep", "1000000"}
	if raw, err = json.MarshalIndent(spec, "", "\t"); err != nil {
		return nil, err
	}
	return p, os.WriteFile(path, raw, 0o644)
}

func (p *runcPeer) cmd(args ...string) *exec.Cmd {
	// stdio stays /dev/null: a detached container keeps whatever runc is
	// given, and a pipe would never close.
	return exec.Command("runc", append([]string{"--root", p.root}, args...)...)
}

func (p *runcPeer) timed(args ...string) (time.Duration, error) {
	cmd := p.cmd(args...)
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("runc %v: %w", args, err)
	}
	return took, nil
}

// Run is `runc run -d`: create and start, returning once the process runs.
func (p *runcPeer) Run(id string) (time.Duration, error) {
	p.mu.Lock()
	p.live[id] = true
	p.mu.Unlock()
	return p.timed("run", "-d", "--bundle", p.bundle, id)
}

// Exec is the round trip of `runc exec ID true`.
func (p *runcPeer) Exec(id string) (time.Duration, error) { return p.timed("exec", id, "true") }

// Delete is `runc delete -f ID`.
func (p *runcPeer) Delete(id string) (time.Duration, error) {
	d, err := p.timed("delete", "-f", id)
	if err == nil {
		p.mu.Lock()
		delete(p.live, id)
		p.mu.Unlock()
	}
	return d, err
}

// Close removes every container it started, by id.
func (p *runcPeer) Close() {
	p.mu.Lock()
	var ids []string
	for id := range p.live {
		ids = append(ids, id)
	}
	p.mu.Unlock()
	for _, id := range ids {
		if _, err := p.Delete(id); err != nil {
			logf("cleanup: %v", err)
		}
	}
	os.RemoveAll(p.root)
	os.RemoveAll(p.bundle)
}

// rotated runs the arms in an order that turns by one each round i, so
// each arm is timed after each other one, and first after the round
// before, equally often. A create that comes after a pause costs more on
// this kind of machine (a virtual CPU woken from idle: a libcontainer
// create measured 8 ms back to back, 12-20 ms 5-40 ms after the previous
// round's last destroy); in a fixed order the first arm alone paid for
// the pause after the round's deletes (runc delete -f, about 100 ms).
func rotated(i int, arms ...func() error) error {
	for k := range arms {
		if err := arms[(i+k)%len(arms)](); err != nil {
			return err
		}
	}
	return nil
}

// figRunc is figure 5: a sandbox's create+start and an exec round trip with
// the container package (libcontainer, in-process) against `runc run -d`
// and `runc exec` on the same image, interleaved one for one, the creates
// in a rotating order (rotated).
func figRunc(ctx context.Context, cfg *config, rep *Report) error {
	section("5. sandbox create+start and exec: container (libcontainer) vs runc run -d / runc exec")
	tag := "b" + strconv.Itoa(os.Getpid())
	peer, err := newRuncPeer(ctx, cfg.tmp, cfg.rootfs, "r"+tag)
	if err != nil {
		return err
	}
	defer peer.Close()
	floor := newSandboxFloor(cfg.tmp, cfg.rootfs, "l"+tag)
	defer floor.Close()
	dir := filepath.Join(cfg.tmp, "ct")
	m, err := container.New(container.Config{StateDir: filepath.Join(dir, "state"),
		LayerDir: filepath.Join(dir, "layers"), Prefix: "c" + tag})
	if err != nil {
		return err
	}
	defer func() {
		if gone, err := m.Reap(nil); err != nil {
			logf("cleanup: reap sandboxes: %v (removed %v)", err, gone)
		}
	}()

	const warm = 1
	var oc, pc, od, pd, oe, pe, fc, fdel Samples
	perBox := max(cfg.execN/cfg.runcN, 1)
	for i := 0; i < cfg.runcN+warm; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		name, id := fmt.Sprintf("s%d", i), fmt.Sprintf("%s-%d", peer.prefix, i)
		var dOurs, dPeer, dFloor time.Duration
		err := rotated(i, func() error {
			start := time.Now()
			err := m.Create(container.Spec{Name: name, Rootfs: cfg.rootfs})
			dOurs = time.Since(start)
			return err
		}, func() (err error) {
			dPeer, err = peer.Run(id)
			return err
		}, func() (err error) {
			dFloor, err = floor.Run(name)
			return err
		})
		if err != nil {
			return err
		}
		var eo, ep Samples
		for j := 0; j < perBox; j++ {
			start := time.Now()
			code, err := m.Exec(ctx, name, container.ExecSpec{Args: []string{"true"}})
			if err != nil || code != 0 {
				return fmt.Errorf("exec true in %s: exit %d: %v", name, code, err)
			}
			eo = append(eo, time.Since(start))
			d, err := peer.Exec(id)
			if err != nil {
				return err
			}
			ep = append(ep, d)
		}
		start := time.Now()
		if err := m.Destroy(name); err != nil {
			return err
		}
		dOursDel := time.Since(start)
		dPeerDel, err := peer.Delete(id)
		if err != nil {
			return err
		}
		dFloorDel, err := floor.Destroy(name)
		if err != nil {
			return err
		}
		if i >= warm {
			fc, fdel = append(fc, dFloor), append(fdel, dFloorDel)
			oc, pc = append(oc, dOurs), append(pc, dPeer)
			od, pd = append(od, dOursDel), append(pd, dPeerDel)
			oe, pe = append(oe, eo...), append(pe, ep...)
		}
	}
	extra := []string{fmt.Sprintf("n=%d", len(oc)), fmt.Sprintf("exec_n=%d", len(oe))}
	// The floor (floor_runc.go) has no target of its own in issue 25: it
	// says what the container package adds to libcontainer.
	rep.Add(Result{Name: "sandbox-create-start-p50", Unit: "ms", Ours: oc.Pct(50), Peer: pc.Pct(50), Goal: AtMost, Target: 1.0,
		Note: "runc run -d, same image", Floor: fc.Pct(50), FloorIs: "libcontainer-create-start-runc-spec",
		Extra: append(slices.Clone(extra), fmt.Sprintf("ours_p99_ms=%.3f", oc.Pct(99)), fmt.Sprintf("peer_p99_ms=%.3f", pc.Pct(99)),
			fmt.Sprintf("floor_p99_ms=%.3f", fc.Pct(99)))})
	rep.Add(Result{Name: "sandbox-exec-p50", Unit: "ms", Ours: oe.Pct(50), Peer: pe.Pct(50), Goal: AtMost, Target: 1.0,
		Note: "runc exec ID true", Extra: append(extra, fmt.Sprintf("ours_p99_ms=%.3f", oe.Pct(99)), fmt.Sprintf("peer_p99_ms=%.3f", pe.Pct(99)))})
	rep.Add(Result{Name: "sandbox-destroy-p50", Unit: "ms", Ours: od.Pct(50), Peer: pd.Pct(50),
		Note: "runc delete -f; no target", Floor: fdel.Pct(50), FloorIs: "libcontainer-kill-destroy", Extra: extra})
	return nil
}
