package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/internal/nfnetlink"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// figLimits is issue 24's performance figure: what the ledger of
// admissions (conntrack events with accounting, read as the daemon reads
// them) and the counted limits (every session with an egress budget, the
// measured one also with an entry budget and a connection grant on its
// destination) cost, side by side with both off, on the same table of
// cfg.dpSessions sessions: single-stream TCP throughput (iperf3, as figure
// 3) and the new-connection rate of one session (sequential TCP connects
// to the echo server). The table's flow-rate cap is raised out of the way
// (the daemon's default, 2000 new flows a second per session, would be
// what the rate measures). Off and on alternate, the table rebuilt for each.
func figLimits(ctx context.Context, cfg *config, rep *Report) error {
	section(fmt.Sprintf("11. the ledger's conntrack events and the counted limits, on vs off, table with %d sessions", cfg.dpSessions))
	e, err := newNetEnv("l")
	if err != nil {
		return err
	}
	defer e.Close()
	// The same table with the flow-rate cap out of the way.
	e.fw.Close()
	if e.fw, err = nft.OpenFirewall(nft.FirewallConfig{NetNS: e.w.Host, Prefix: e.prefix, Pool: nsmgr.DefaultPool, DNSAddr: e.m.DNSAddr(),
		Guard: e.guard, AttestFloor: time.Minute, FlowRate: 1 << 20, MaxFlows: 1 << 20}); err != nil {
		return err
	}
	client, _, err := e.create("lim", netip.PrefixFrom(iperfTarget, 32))
	if err != nil {
		return err
	}
	if err := addReturnRoute(e.w); err != nil {
		return fmt.Errorf("route the pool back from the simulated internet: %w", err)
	}
	defer removeReturnRoute(e.w)
	server, err := startProc("iperf3 server", filepath.Join(cfg.tmp, "iperf3-limits.log"),
		inNS(e.w.NetPath, "taskset", "-c", "1", "iperf3", "-s", "-B", iperfTarget.String(), "-p", "5201")...)
	if err != nil {
		return err
	}
	defer server.stop(5 * time.Second)
	time.Sleep(300 * time.Millisecond)
	if server.exited() {
		return fmt.Errorf("iperf3 server exited: %s", server.tail(5))
	}

	const huge = 1 << 50 // a budget never spent here
	limits := func(r nft.SessionRules, measured bool) nft.SessionRules {
		r.Limits = nft.SessionLimits{EgressBudget: huge}
		if measured {
			r.Limits.Entries = []nft.EntryLimit{{ID: "bench", Targets: r.Static, Budget: huge, Connections: 1 << 24, Grant: "0"}}
		}
		return r
	}
	load := func(on bool) error {
		if err := e.fw.DeleteTable(); err != nil {
			return err
		}
		if err := e.fw.Ensure(); err != nil {
			return err
		}
		r := e.rules(client, netip.PrefixFrom(iperfTarget, 32))
		if on {
			r = limits(r, true)
		}
		if err := e.fw.AddSession(r); err != nil {
			return err
		}
		for slot, added := 0, 1; added < cfg.dpSessions; slot++ {
			if slot == client.Slot {
				continue
			}
			s := e.synthetic(slot)
			if on {
				s = limits(s, false)
			}
			if err := e.fw.AddSession(s); err != nil {
				return err
			}
			added++
		}
		return nil
	}
	// The ledger: conntrack events with accounting, drained as the daemon
	// drains them (it also writes them to its files, on its own CPU).
	ledger := func(on bool) (stop func(), err error) {
		v := "0"
		if on {
			v = "1"
		}
		if _, err := run(ctx, 10*time.Second, inNS(e.w.HostPath, "sysctl", "-q", "-w",
			"net.netfilter.nf_conntrack_acct="+v, "net.netfilter.nf_conntrack_events="+v)...); err != nil {
			return nil, err
		}
		if !on {
			return func() {}, nil
		}
		ev, err := nfnetlink.SubscribeFlowEvents(int(e.w.Host), 8<<20)
		if err != nil {
			return nil, err
		}
		go func() {
			for {
				if _, err := ev.Receive(); err != nil && err != nfnetlink.ErrEventsLost {
					return
				}
			}
		}()
		return func() { ev.Close() }, nil
	}
	iperf := func() (float64, error) {
		out, err := run(ctx, cfg.iperfDuration+30*time.Second, inNS(client.NetnsPath, "taskset", "-c", "1",
			"iperf3", "-c", iperfTarget.String(), "-p", "5201", "-t", fmt.Sprint(int(cfg.iperfDuration/time.Second)), "-J")...)
		if err != nil {
			return 0, err
		}
		var res struct {
			End struct {
				Received struct {
					BPS float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			return 0, fmt.Errorf("iperf3 json: %w: %s", err, lastLines(out, 5))
		}
		return res.End.Received.BPS / 1e9, nil
	}
	// connRate opens and resets TCP connections to the echo server, one
	// after another, for cfg.iperfDuration: connections a second.
	echo := netip.AddrPortFrom(iperfTarget, 7)
	connRate := func() (float64, error) {
		n, start := 0, time.Now()
		for time.Since(start) < cfg.iperfDuration {
			c, err := world.DialTCP(client.NetnsPath, echo, world.ReachTimeout)
			if err != nil {
				return 0, fmt.Errorf("connection %d: %w", n+1, err)
			}
			c.(*net.TCPConn).SetLinger(0) // no TIME_WAIT: the ports stay free
			c.Close()
			n++
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}

	var tpOff, tpOn, crOff, crOn []float64
	for r := 0; r < cfg.iperfReps; r++ {
		for _, on := range []bool{false, true} {
			if err := load(on); err != nil {
				return fmt.Errorf("load %d sessions (limits %t): %w", cfg.dpSessions, on, err)
			}
			stop, err := ledger(on)
			if err != nil {
				return fmt.Errorf("ledger %t: %w", on, err)
			}
			g, err := iperf()
			if err == nil {
				var cr float64
				if cr, err = connRate(); err == nil && on {
					tpOn, crOn = append(tpOn, g), append(crOn, cr)
				} else if err == nil {
					tpOff, crOff = append(tpOff, g), append(crOff, cr)
				}
				logf("rep %d/%d, ledger and limits %t: %.2f Gbit/s, %.0f connections/s", r+1, cfg.iperfReps, on, g, cr)
			}
			stop()
			if err != nil {
				return err
			}
		}
	}
	if on, err := e.fw.LimitUsage(client.Guest, limits(e.rules(client, netip.PrefixFrom(iperfTarget, 32)), true).Limits); err != nil {
		return err
	} else if u := on.Entries["bench"]; u.Used == 0 || on.EgressSpent == 0 {
		return fmt.Errorf("the limits were not on the measured path: %+v", on)
	}
	extra := []string{fmt.Sprintf("reps=%d", cfg.iperfReps), fmt.Sprintf("duration_s=%d", int(cfg.iperfDuration/time.Second)),
		fmt.Sprintf("sessions=%d", cfg.dpSessions), "limits=egress budget on every session; entry budget and connection grant on the measured one",
		"ledger=conntrack events with accounting, drained (not written)"}
	rep.Add(Result{Name: "tcp-throughput-ledger-limits", Unit: "Gbit/s", Ours: median(tpOn), Peer: median(tpOff), Goal: AtLeast, Target: 0.97,
		Note: "peer = the same table without limits and without conntrack events", Extra: append(extra, "ours_all="+joinFloats(tpOn), "peer_all="+joinFloats(tpOff))})
	rep.Add(Result{Name: "new-connection-rate-ledger-limits", Unit: "conn/s", Ours: median(crOn), Peer: median(crOff), Goal: AtLeast, Target: 0.90,
		Note: "one session, sequential connects; peer = the same table without limits and without conntrack events", Extra: append(extra, "ours_all="+joinFloats(crOn), "peer_all="+joinFloats(crOff))})
	return nil
}
