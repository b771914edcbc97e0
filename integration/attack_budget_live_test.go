package integration

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
)

// atkBudgetEnv is an npEnv whose firewall enforces the given per-session
// flow budgets: the table newNPEnv made is deleted and a firewall opened
// with the budgets ensures it again, before any session exists.
func atkBudgetEnv(t *testing.T, maxFlows, rate int) *npEnv {
	t.Helper()
	e := newNPEnv(t, time.Second)
	if err := e.fw.DeleteTable(); err != nil {
		t.Fatal(err)
	}
	e.cfg.MaxFlows = maxFlows
	e.cfg.FlowRate = rate
	e.reopenFirewall(t)
	return e
}

// TestAttackFlowBudget: a session may not fill the
// shared conntrack table. With MaxFlows 40, 60 concurrent TCP connections
// from one session: at least 15 fail by timeout (their SYNs dropped), and
// the drops are counted as limited; another session connects meanwhile
// (control). With FlowRate 50 (burst 100), 400 new UDP flows within half a
// second: far fewer than 400 are echoed; a new flow 2 s later works
// (control).
func TestAttackFlowBudget(t *testing.T) {
	t.Run("concurrent", func(t *testing.T) {
		e := atkBudgetEnv(t, 40, 1000)
		w := e.w
		dst := netip.AddrPortFrom(w.Web[0], 7)
		a := atkSession(t, e, "a", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(w.Web[0])})
		b := atkSession(t, e, "b", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(w.Web[0])})

		const n = 60
		conns := make([]net.Conn, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conns[i], errs[i] = world.DialTCP(a.NetnsPath, dst, 2*time.Second)
			}()
		}
		wg.Wait()
		defer func() {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
		}()
		ok, timedOut := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case world.IsTimeout(err):
				timedOut++
			default:
				t.Errorf("connection failed without a timeout: %v", err)
			}
		}
		// Control: another session is not affected while A holds its flows.
		if err := world.TCPEcho(b.NetnsPath, dst, world.ReachTimeout); err != nil {
			t.Errorf("control: session B while A is at its cap: %v", err)
		}
		if ok < 30 {
			t.Errorf("control: only %d of %d connections of A succeeded; the cap is 40", ok, n)
		}
		if timedOut < 15 {
			t.Errorf("session A opened %d of %d concurrent connections with MaxFlows 40 (%d timed out): no per-session flow cap", ok, n, timedOut)
		}
		c, err := e.fw.Counters(a.Guest)
		if err != nil {
			t.Fatal(err)
		}
		if c.LimitedPackets == 0 {
			t.Errorf("counters of A show no limited packets: %+v", c)
		}
	})

	t.Run("rate", func(t *testing.T) {
		e := atkBudgetEnv(t, 0, 50)
		w := e.w
		dst := netip.AddrPortFrom(w.Web[0], 7)
		a := atkSession(t, e, "a", netpolicy.ModeAllowlist, []netpolicy.Target{staticHost(w.Web[0])})

		const n = 400
		socks := make([]*net.UDPConn, 0, n)
		err := world.DoPath(a.NetnsPath, func() error {
			for range n {
				c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(dst))
				if err != nil {
					return err
				}
				socks = append(socks, c)
			}
			return nil
		})
		defer func() {
			for _, c := range socks {
				c.Close()
			}
		}()
		if err != nil {
			t.Fatalf("open %d udp sockets: %v", n, err)
		}
		// Paced (20 every 25 ms) so that the echo server's socket buffer
		// never overflows: without a limit, every flow is echoed.
		start := time.Now()
		for i, c := range socks {
			if _, err := c.Write([]byte("flow")); err != nil {
				t.Fatal(err)
			}
			if i%20 == 19 {
				time.Sleep(25 * time.Millisecond)
			}
		}
		if d := time.Since(start); d > 700*time.Millisecond {
			t.Logf("sending %d new flows took %s (wanted under 0.5 s)", n, d)
		}
		var echoed sync.WaitGroup
		var mu sync.Mutex
		got := 0
		deadline := time.Now().Add(1500 * time.Millisecond)
		for _, c := range socks {
			echoed.Add(1)
			go func() {
				defer echoed.Done()
				c.SetReadDeadline(deadline)
				if _, err := c.Read(make([]byte, 16)); err == nil {
					mu.Lock()
					got++
					mu.Unlock()
				}
			}()
		}
		echoed.Wait()
		if got == 0 {
			t.Fatalf("control: none of %d new flows was echoed", n)
		}
		if got >= 250 {
			t.Errorf("%d of %d new flows opened within half a second with FlowRate 50 (burst 100) were echoed: no new-flow rate limit", got, n)
		}
		time.Sleep(2 * time.Second)
		if err := world.UDPEcho(a.NetnsPath, dst, world.ReachTimeout); err != nil {
			t.Errorf("control: a new flow 2 s after the burst: %v", err)
		}
		c, err := e.fw.Counters(a.Guest)
		if err != nil {
			t.Fatal(err)
		}
		if c.LimitedPackets == 0 {
			t.Errorf("counters of A show no limited packets: %+v", c)
		}
	})
}
