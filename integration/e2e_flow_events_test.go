package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
)

// flowEvents follows a session's events (session events --follow) and
// hands out its flow events.
type flowEvents struct {
	lines chan string
}

func (e *e2eEnv) followFlows(name string) flowEvents {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	e.t.Cleanup(cancel)
	cmd := e.d.Command(ctx, "session", "events", name, "--follow")
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	fe := flowEvents{lines: make(chan string, 4096)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			fe.lines <- sc.Text()
		}
		cmd.Wait()
	}()
	return fe
}

type e2eFlowEvent struct {
	Session string         `json:"session"`
	Kind    string         `json:"kind"`
	Action  string         `json:"action"`
	Detail  map[string]any `json:"detail"`
}

// next returns the next flow event within d (ok false if none came).
func (fe flowEvents) next(t *testing.T, d time.Duration) (e2eFlowEvent, bool) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case l := <-fe.lines:
			var ev e2eFlowEvent
			if err := json.Unmarshal([]byte(l), &ev); err != nil {
				t.Fatalf("event line %q: %v", l, err)
			}
			if ev.Kind == "flow" {
				return ev, true
			}
		case <-deadline:
			return e2eFlowEvent{}, false
		}
	}
}

// expect waits up to 3 s for a flow event whose detail holds every field
// of want (numbers as JSON decodes them) and whose action is want's
// "action", "rejected" when want has none: what the default --on-deny
// (reject) makes of a drop.
func (fe flowEvents) expect(t *testing.T, what string, want map[string]any) e2eFlowEvent {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	var seen []map[string]any
	for time.Now().Before(deadline) {
		ev, ok := fe.next(t, time.Until(deadline))
		if !ok {
			break
		}
		seen = append(seen, ev.Detail)
		action, _ := want["action"].(string)
		if action == "" {
			action = "rejected"
		}
		match := ev.Action == action
		for k, v := range want {
			match = match && (k == "action" || ev.Detail[k] == v)
		}
		if match {
			return ev
		}
	}
	t.Errorf("%s: no flow event with %v within 3s; saw %v", what, want, seen)
	return e2eFlowEvent{}
}

// quiet fails the test if a flow event arrives within d.
func (fe flowEvents) quiet(t *testing.T, what string, d time.Duration) {
	t.Helper()
	if ev, ok := fe.next(t, d); ok {
		t.Errorf("%s: unexpected flow event %+v", what, ev)
	}
}

// drain forgets the flow events of the next d (a probe's retries).
func (fe flowEvents) drain(t *testing.T, d time.Duration) {
	for {
		if _, ok := fe.next(t, d); !ok {
			return
		}
	}
}

// TestE2EFlowEvents: through the daemon, each drop the sandbox can cause
// is an event of its session with its reason, inspect counts it by reason
// and /metrics sums it by reason; allowed traffic (the control) is no
// event. (Every reason, spoofed and inbound included, is also tested at
// the table's level in TestNetpolicyDropLogReasons.)
func TestE2EFlowEvents(t *testing.T) {
	e := prepareE2E(t, "")
	l, err := world.ListenTCP(e.w.HostPath, netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := l.Addr().String()
	l.Close()
	e.d.Args = append(e.d.Args, "--metrics-listen", metricsAddr)
	e.start()
	e.create("fl", "--allow", "198.18.1.10", "--allow", "198.18.1.11:443")
	fe := e.followFlows("fl")

	// Control: an allowed connection is no event.
	if !e.wget("fl", "198.18.1.10") {
		t.Fatalf("control: the allowed address is unreachable")
	}
	fe.quiet(t, "allowed connection", 2*time.Second)

	e.sh("fl", "nc -w 1 198.18.1.20 80 </dev/null")
	fe.expect(t, "not allowed", map[string]any{"reason": "not-allowed", "proto": "tcp", "dst": "198.18.1.20", "dport": float64(80), "answer": "icmp-admin-prohibited"})
	fe.drain(t, 500*time.Millisecond)

	e.sh("fl", "nc -w 1 198.18.1.11 80 </dev/null")
	fe.expect(t, "allowed on another port", map[string]any{"reason": "port", "proto": "tcp", "dst": "198.18.1.11", "dport": float64(80)})
	fe.drain(t, 500*time.Millisecond)

	e.sh("fl", "nc -w 1 169.254.169.254 80 </dev/null")
	fe.expect(t, "metadata", map[string]any{"reason": "special-purpose", "dst": "169.254.169.254", "range": "169.254.0.0/16 (link-local)"})
	fe.drain(t, 500*time.Millisecond)

	e.sh("fl", "nslookup -timeout=1 api.e2e.test "+e.w.DNS.Addr().Addr().String())
	fe.expect(t, "direct DNS", map[string]any{"reason": "resolver", "proto": "udp", "dst": e.w.DNS.Addr().Addr().String(), "dport": float64(53)})
	fe.drain(t, 500*time.Millisecond)

	// A flood of forbidden new flows: at most the log budget of events
	// (burst 20 + 10/s) and one summary per second saying how many were
	// not logged; the daemon keeps answering meanwhile.
	start := time.Now()
	e.sh("fl", "i=0; while [ $i -lt 600 ]; do nc -w 1 198.18.1.30 $((2000+i)) </dev/null 2>/dev/null & i=$((i+1)); [ $((i % 100)) -eq 0 ] && wait; done; wait")
	took := time.Since(start)
	if _, err := e.tryList(); err != nil {
		t.Errorf("list during the flood's aftermath: %v", err)
	}
	dropped, unlogged := 0, 0.0
	deadline := time.Now().Add(took + 3*time.Second)
	for time.Now().Before(deadline) {
		ev, ok := fe.next(t, time.Until(deadline))
		if !ok {
			break
		}
		switch ev.Action {
		case "rejected", "dropped":
			dropped++
		case "unlogged":
			unlogged += ev.Detail["count"].(float64)
		}
	}
	budget := 20 + int(took.Seconds()*10) + 10
	t.Logf("flood: 600 flows in %s, %d dropped events, %v reported unlogged (budget %d)", took.Round(time.Millisecond), dropped, unlogged, budget)
	if dropped > budget || dropped == 0 {
		t.Errorf("%d dropped events for the flood, want 1 to %d", dropped, budget)
	}
	// Every flow's first SYN is an event or counted as unlogged (a SYN
	// retransmitted is new to conntrack too, and counted likewise).
	if unlogged == 0 || dropped+int(unlogged) < 600 {
		t.Errorf("summary: %v unlogged with %d events for 600 flows", unlogged, dropped)
	}

	in := e.inspect("fl")
	c := in.Counters
	for _, r := range []string{"not-allowed", "port", "special-purpose", "resolver"} {
		if c.DroppedByReason[r] == 0 {
			t.Errorf("inspect: dropped_by_reason[%s] = 0: %+v", r, c.DroppedByReason)
		}
	}
	if c.DropsNotLogged != uint64(unlogged) {
		t.Errorf("inspect: drops_not_logged %d, the summaries said %v", c.DropsNotLogged, unlogged)
	}
	body, err := world.HTTPGet(e.w.HostPath, "http://"+metricsAddr+"/metrics", 3*time.Second)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	for _, want := range []string{`enforcerd_dropped_packets_total{reason="not-allowed"}`, `enforcerd_dropped_packets_total{reason="spoofed"} 0`, "enforcerd_drops_not_logged_total "} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
