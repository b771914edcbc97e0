package main

import (
	"context"
	"fmt"
)

// figSessionNet is figure 1: a session network's create (nsmgr.Create +
// Firewall.AddSession) and delete (RemoveSession + nsmgr.Delete), in-process
// against the simulated host, against the CNI ptp plugin's ADD and DEL into
// fresh named netns, interleaved one for one in the same simulated host.
func figSessionNet(ctx context.Context, cfg *config, rep *Report) error {
	section("1. session network create/delete: nsmgr+netpolicy in-process vs CNI ptp ADD/DEL")
	e, err := newNetEnv("a")
	if err != nil {
		return err
	}
	defer e.Close()
	peer, err := newPtpPeer(e.w.Host, "pa"+e.w.ID, cfg.tmp)
	if err != nil {
		return err
	}
	defer peer.Close()

	n := cfg.netN
	const warm = 3
	var oc, od splits
	var pc, pd, floor Samples
	for i := 0; i < n+warm; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := peer.NewNetns(ctx, i); err != nil {
			return err
		}
		_, dOurs, err := e.create(fmt.Sprintf("s%d", i))
		if err != nil {
			return err
		}
		dPeer, err := peer.Add(i)
		if err != nil {
			return err
		}
		if i == 0 {
			if err := peer.Check(0); err != nil {
				return err
			}
		}
		if i >= warm {
			oc.add(dOurs)
			pc = append(pc, dPeer)
			floor = append(floor, spawnFloor(e.w.Host))
		}
	}
	logf("created %d sessions each way; deleting", n+warm)
	for i := 0; i < n+warm; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		dOurs, err := e.remove(fmt.Sprintf("s%d", i))
		if err != nil {
			return err
		}
		dPeer, err := peer.Del(i)
		if err != nil {
			return err
		}
		if err := peer.DelNetns(i); err != nil {
			return err
		}
		if i >= warm {
			od.add(dOurs)
			pd = append(pd, dPeer)
		}
	}
	extra := []string{fmt.Sprintf("n=%d", n), fmt.Sprintf("spawn_floor_p50_ms=%.3f", floor.Pct(50))}
	note := "CNI ptp (host-local), plugin exec only"
	for _, f := range []struct {
		op   string
		ours *splits
		peer Samples
		p    float64
	}{
		{"create", &oc, pc, 50}, {"create", &oc, pc, 99},
		{"delete", &od, pd, 50}, {"delete", &od, pd, 99},
	} {
		rep.Add(Result{Name: fmt.Sprintf("net-%s-p%g", f.op, f.p), Unit: "ms", Ours: f.ours.total.Pct(f.p),
			Peer: f.peer.Pct(f.p), Goal: AtMost, Target: 0.1, Note: note,
			Extra: append(extra, f.ours.parts(f.op, f.p)...)})
	}
	return nil
}
