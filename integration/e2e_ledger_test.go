package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// report runs `session report NAME --json` and returns the report and
// the exit status (1: the chain is broken).
func (e *e2eEnv) report(name string) (api.LedgerReport, int, string) {
	e.t.Helper()
	out, errOut, code := e.run("session", "report", name, "--json")
	var rep api.LedgerReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		e.t.Fatalf("session report %s --json: exit %d: %v\nstdout: %s\nstderr: %s", name, code, err, out, errOut)
	}
	return rep, code, errOut
}

// ledgerDests sums a report's rows per destination address.
func ledgerDests(rep api.LedgerReport) map[string]api.LedgerDestination {
	out := map[string]api.LedgerDestination{}
	for _, d := range rep.Destinations {
		s := out[d.Dest]
		s.Dest, s.Port, s.Via, s.Entry, s.Generation = d.Dest, d.Port, d.Via, d.Entry, d.Generation
		s.Connections += d.Connections
		s.BytesOut += d.BytesOut
		s.BytesIn += d.BytesIn
		out[d.Dest] = s
	}
	return out
}

// TestE2ELedger: a scripted session reaches two allowed destinations and
// fails a third; its report lists exactly the two, under their static
// entries, across a restart and a kill -9 (the chain continues and
// verifies), and, once the session is removed (its flows flushed: the
// kernel's DESTROY events carry the bytes), with bytes each way. Then the
// ledger file is tampered with: one record edited, one deleted, each
// detected (exit 1, the line named); the control, the untouched file,
// verifies.
func TestE2ELedger(t *testing.T) {
	e := prepareE2E(t, "")
	e.start()
	const allowedA, allowedB, refused = "198.18.1.10", "198.18.1.11", "198.18.2.10"
	e.create("lg", "--allow", allowedA, "--allow", allowedB)

	// The script: two allowed destinations (the controls), one refused.
	if !e.wget("lg", allowedA) || !e.wget("lg", allowedB) {
		t.Fatalf("control: an allowed destination is unreachable")
	}
	if e.wget("lg", refused) {
		t.Fatalf("%s is reachable: want refused", refused)
	}
	expect := func(when string, conns uint64, wantBytes bool) api.LedgerReport {
		t.Helper()
		var rep api.LedgerReport
		var got map[string]api.LedgerDestination
		deadline := time.Now().Add(15 * time.Second)
		for {
			var code int
			var errOut string
			rep, code, errOut = e.report("lg")
			if code != 0 || !rep.Verified {
				t.Fatalf("%s: report exit %d, verified %v (%s): %s", when, code, rep.Verified, rep.Broken, errOut)
			}
			got = ledgerDests(rep)
			ok := len(got) == 2
			for _, a := range []string{allowedA, allowedB} {
				d := got[a]
				ok = ok && d.Connections == conns && (!wantBytes || d.BytesOut > 0 && d.BytesIn > 0)
			}
			if ok || time.Now().After(deadline) {
				break
			}
			time.Sleep(300 * time.Millisecond)
		}
		if _, ok := got[refused]; ok {
			t.Errorf("%s: the report lists %s, which the table refused: %+v", when, refused, rep.Destinations)
		}
		if len(got) != 2 || len(rep.Destinations) != 2 {
			t.Fatalf("%s: report destinations %+v, want exactly %s and %s", when, rep.Destinations, allowedA, allowedB)
		}
		for _, a := range []string{allowedA, allowedB} {
			d := got[a]
			if d.Connections != conns || d.Port != 80 || d.Via != "static" || d.Entry != a || d.Generation != 1 {
				t.Errorf("%s: %s: %+v, want %d connections to port 80 under the static entry %s, generation 1", when, a, d, conns, a)
			}
			if wantBytes && (d.BytesOut == 0 || d.BytesIn == 0) {
				t.Errorf("%s: %s: %d bytes out, %d in: want both > 0", when, a, d.BytesOut, d.BytesIn)
			}
		}
		return rep
	}
	expect("live", 1, false)

	// Across a restart and a kill -9 the chain continues and verifies.
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if err := e.d.Signal(sig); err != nil {
			t.Fatalf("%s: %v", sig, err)
		}
		e.start()
		if !e.wget("lg", allowedA) || !e.wget("lg", allowedB) {
			t.Fatalf("after %s: an allowed destination is unreachable", sig)
		}
		expect("after "+sig.String(), uint64(i+2), false)
	}
	if e.wget("lg", refused) {
		t.Fatalf("%s is reachable after the restarts: want refused", refused)
	}

	// Removed: its flows are flushed, their DESTROY events carry the bytes;
	// the report stays (--events-retention).
	e.cli("session", "rm", "lg")
	rep := expect("removed", 3, true)
	t.Logf("ledger: %d records, head %s\n%s", rep.Records, rep.Head, e.cli("session", "report", "lg"))

	// Tampering. Wait until the removed session's ledger is closed (no
	// writer: the daemon's grace for late DESTROY events).
	path := filepath.Join(e.d.StateDir, "events", "operator", "lg.ledger.ndjson")
	time.Sleep(12 * time.Second)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(orig), "\n")
	lines = lines[:len(lines)-1] // the empty tail after the last newline
	closeLine := -1
	for i, l := range lines {
		if strings.Contains(l, `"kind":"close"`) && strings.Contains(l, `"bytes_out":`) {
			closeLine = i
			break
		}
	}
	if closeLine < 1 || len(lines) < 4 {
		t.Fatalf("ledger has %d lines and its first close with bytes at %d: want a close after an open\n%s", len(lines), closeLine, orig)
	}
	write := func(ls []string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(strings.Join(ls, "")), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	edited := append([]string(nil), lines...)
	edited[closeLine] = regexp.MustCompile(`"bytes_out":\d+`).ReplaceAllString(edited[closeLine], `"bytes_out":1`)
	if edited[closeLine] == lines[closeLine] {
		t.Fatalf("the edit changed nothing: %s", lines[closeLine])
	}
	deleted := append(append([]string(nil), lines[:1]...), lines[2:]...)
	for _, tc := range []struct {
		name  string
		lines []string
		want  string // in the error line; "" = verifies
	}{
		{"untouched", lines, ""},
		{"one record edited", edited, "was changed"},
		{"one record deleted", deleted, "missing"},
		{"untouched again", lines, ""},
	} {
		write(tc.lines)
		rep, code, errOut := e.report("lg")
		switch {
		case tc.want == "" && (code != 0 || !rep.Verified):
			t.Errorf("%s: exit %d, verified %v (%s): want verified", tc.name, code, rep.Verified, rep.Broken)
		case tc.want != "" && (code != 1 || rep.Verified || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "line ")):
			t.Errorf("%s: exit %d, verified %v, stderr %q: want exit 1 naming the line and %q", tc.name, code, rep.Verified, errOut, tc.want)
		}
	}
}
