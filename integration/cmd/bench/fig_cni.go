package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"
)

// enfCNI runs the enforcerd-cni plugin as a runtime does: one exec per
// command, the network config on stdin, the CNI_* environment, into a
// named netns made beforehand. The plugin is a client of the daemon: ADD
// is one create over the socket (attach mode: the veth made in that
// netns), DEL an inspect and a remove.
type enfCNI struct {
	cniExec
	socket string
}

// conf is the network config: the same policy createNet gives a session.
func (p *enfCNI) conf() []byte {
	return fmt.Appendf(nil, `{"cniVersion":"1.1.0","name":"%s-enf","type":"enforcerd-cni","socket":%q,`+
		`"policy":{"egress":"allowlist","allow":["api.bench.test"]}}`, p.prefix, p.socket)
}

// Add runs ADD for attachment i and returns how long the exec took.
func (p *enfCNI) Add(i int) (time.Duration, error) { return p.add(i, p.conf()) }

// Del runs DEL for attachment i, as the ptp peer gets it.
func (p *enfCNI) Del(i int) (time.Duration, error) { return p.del(i, p.conf()) }

// Version runs VERSION: the plugin's exec with no call to the daemon.
func (p *enfCNI) Version() (time.Duration, error) {
	_, took, err := p.exec("VERSION", 0, []byte(`{"cniVersion":"1.1.0"}`))
	return took, err
}

// daemonCreateTook collects the took= of every "created" line of the
// daemon's log (the time the daemon spent inside a create).
func daemonCreateTook(log string) Samples { return daemonCreateTookOf(log, "") }

// daemonCreateTookOf is daemonCreateTook for the sessions whose name starts
// with prefix.
func daemonCreateTookOf(log, prefix string) Samples {
	var s Samples
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "action=created") || !strings.Contains(line, " session="+prefix) {
			continue
		}
		_, v, ok := strings.Cut(line, " took=")
		if !ok {
			continue
		}
		v, _, _ = strings.Cut(v, " ")
		if d, err := time.ParseDuration(v); err == nil {
			s = append(s, d)
		}
	}
	return s
}

// Close removes every netns made for the plugin.
func (p *enfCNI) Close() { p.removeNetns() }

// figCNI is figure 9: the enforcerd-cni plugin's ADD and DEL (one exec
// each, through the daemon) against the ptp plugin's (host-local IPAM),
// interleaved one for one in the same run, each into a netns made
// beforehand and untimed; the spawn floor (a bare fork+exec of /bin/true)
// is sampled beside them.
func figCNI(ctx context.Context, cfg *config, rep *Report) error {
	section("9. CNI: enforcerd-cni ADD and DEL through the daemon vs the ptp plugin's")
	if fi, err := os.Stat(cfg.cniBin); cfg.cniBin == "" || err != nil || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("no enforcerd-cni plugin at %q (make build builds it; or set ENFORCERD_CNI_BIN)", cfg.cniBin)
	}
	de, err := startDaemonEnv(cfg, "cni")
	if err != nil {
		return err
	}
	defer de.Close()
	peer, err := newPtpPeer(de.w.Host, "pc"+de.w.ID, cfg.tmp)
	if err != nil {
		return err
	}
	defer peer.Close()
	ours := &enfCNI{cniExec: newCNIExec("enforcerd-cni", cfg.cniBin, de.w.Host, "ec"+de.w.ID, "e"), socket: de.d.Socket}
	defer ours.Close()
	if err := figCNIIn(ctx, cfg, rep, de, ours, peer); err != nil {
		return fmt.Errorf("%w\ndaemon log tail:\n%s", err, de.logTail())
	}
	return nil
}

func figCNIIn(ctx context.Context, cfg *config, rep *Report, de *daemonEnv, ours *enfCNI, peer *ptpPeer) error {
	const warm = 2
	n := cfg.cniN + warm
	var oa, od, pa, pd, floor, version, background Samples
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := ours.NewNetns(ctx, i); err != nil {
			return err
		}
		if err := peer.NewNetns(ctx, i); err != nil {
			return err
		}
		d, err := ours.Add(i)
		if err != nil {
			return err
		}
		dp, err := peer.Add(i)
		if err != nil {
			return err
		}
		if i == warm {
			if err := peer.Check(i); err != nil {
				return err
			}
		}
		if i >= warm {
			oa, pa = append(oa, d), append(pa, dp)
			floor = append(floor, spawnFloor(de.w.Host))
			v, err := ours.Version()
			if err != nil {
				return err
			}
			version = append(version, v)
		}
	}
	// Every ADD made a session of the daemon's, attached in its netns.
	if list, err := de.d.Client().List(ctx, "enforcerd.io/cni-network", ours.prefix+"-enf"); err != nil || len(list) != n {
		return fmt.Errorf("after %d ADDs the daemon lists %d sessions of the network (%v)", n, len(list), err)
	}
	for i := 0; i < n; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		hostIface, err := ours.hostIface(i)
		if err != nil {
			return err
		}
		d, err := ours.Del(i)
		if err != nil {
			return err
		}
		// Our DEL leaves the veth's delete to the background: it ends
		// before the peer's DEL is timed, so the peer never pays for it.
		bg, err := ours.waitGone(hostIface, 10*time.Second)
		if err != nil {
			return err
		}
		if i >= warm {
			background = append(background, bg)
		}
		dp, err := peer.Del(i)
		if err != nil {
			return err
		}
		if i >= warm {
			od, pd = append(od, d), append(pd, dp)
		}
		if err := ours.DelNetns(i); err != nil {
			return err
		}
		if err := peer.DelNetns(i); err != nil {
			return err
		}
	}
	if list, err := de.d.Client().List(ctx, "", ""); err != nil || len(list) != 0 {
		return fmt.Errorf("after every DEL the daemon lists %d sessions (%v)", len(list), err)
	}
	note := "CNI ptp ADD/DEL (host-local), one exec each, interleaved"
	// Where an exec's time goes: the plugin's VERSION (no daemon call: the
	// binary's start and skel alone), and the daemon's own create time
	// (its log's took=, attach mode).
	created := daemonCreateTook(de.d.Log())
	extra := []string{fmt.Sprintf("n=%d", len(oa)), fmt.Sprintf("spawn_floor_p50_ms=%.3f", floor.Pct(50)),
		fmt.Sprintf("plugin_version_exec_p50_ms=%.3f", version.Pct(50)), fmt.Sprintf("daemon_create_took_p50_ms=%.3f", created.Pct(50)),
		// How long after our DEL returned its veth was gone (the
		// background delete; untimed, waited for before the peer's DEL).
		fmt.Sprintf("ours_del_background_p50_ms=%.3f", background.Pct(50))}
	for _, x := range []struct {
		op         string
		ours, peer Samples
		p, target  float64
	}{{"add", oa, pa, 50, 0.5}, {"add", oa, pa, 99, 0}, {"del", od, pd, 50, 0.5}, {"del", od, pd, 99, 0}} {
		note := note
		if x.target == 0 {
			note += "; no target"
		}
		rep.Add(Result{Name: fmt.Sprintf("cni-%s-p%g", x.op, x.p), Unit: "ms", Ours: x.ours.Pct(x.p), Peer: x.peer.Pct(x.p),
			Goal: AtMost, Target: x.target, Note: note, Floor: floor.Pct(x.p), FloorIs: "fork-exec-true-in-host", Extra: extra})
	}
	logf("enforcerd-cni ADD p50 %.2f ms, DEL p50 %.2f ms; ptp ADD p50 %.2f ms, DEL p50 %.2f ms; spawn floor p50 %.2f ms; enforcerd-cni VERSION exec p50 %.2f ms; daemon's create took p50 %.2f ms",
		oa.Pct(50), od.Pct(50), pa.Pct(50), pd.Pct(50), floor.Pct(50), version.Pct(50), created.Pct(50))
	return nil
}
