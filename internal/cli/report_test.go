package cli

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// TestEndToEndSessionReport: a verified ledger prints its destinations
// and exits 0; a broken one prints the same and exits 1 naming the break,
// with --json too; a session without a report is refused.
func TestEndToEndSessionReport(t *testing.T) {
	f, c, _ := startAPI(t)
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	rep := api.LedgerReport{Session: "s1", Verified: true, Records: 4, Head: "ab12",
		Destinations: []api.LedgerDestination{{Dest: "198.18.2.10", Port: 443, Proto: "tcp", Via: "static",
			Entry: "198.18.2.10:443", Generation: 1, Connections: 2, BytesOut: 300, BytesIn: 9000, First: t0, Last: t0.Add(time.Minute)}}}
	f.SetReport("s1", rep)
	out, _ := c.expect(t, 0, "session", "report", "s1")
	for _, want := range []string{"4 records, chain verified", "198.18.2.10:443/tcp", "static", "198.18.2.10:443", "9000"} {
		if !strings.Contains(out, want) {
			t.Errorf("report output lacks %q:\n%s", want, out)
		}
	}

	broken := rep
	broken.Session, broken.Verified, broken.Broken = "s2", false, "line 3: record 3's hash does not match its content: the record was changed"
	f.SetReport("s2", broken)
	out, errOut := c.expect(t, 1, "session", "report", "s2", "--json")
	var got api.LedgerReport
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Verified || got.Broken != broken.Broken {
		t.Fatalf("--json of a broken ledger: %q (%v), want the report with verified false", out, err)
	}
	if !strings.Contains(errOut, `session "s2": the ledger's chain is broken: line 3`) {
		t.Errorf("stderr %q, want the break named", errOut)
	}

	if _, errOut := c.expect(t, 1, "session", "report", "nosuch"); !strings.Contains(errOut, `"nosuch"`) {
		t.Errorf("stderr %q, want the missing session named", errOut)
	}
	c.expect(t, 2, "session", "report")
}
