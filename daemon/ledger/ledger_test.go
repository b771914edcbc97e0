package ledger

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)

// script writes n flows round-robin to dests through w: each opens and,
// a second later, closes with 100*i bytes out and 1000*i in.
func script(t *testing.T, w *Writer, n int, dests ...string) {
	t.Helper()
	for i := 1; i <= n; i++ {
		dst := netip.MustParseAddr(dests[i%len(dests)])
		fl := Flow{Time: t0.Add(time.Duration(i) * time.Second), CtID: uint32(i), Proto: 6,
			Src: netip.MustParseAddr("10.20.0.2"), Dst: dst, Sport: uint16(40000 + i), Dport: 443,
			Dest: Dest{Via: "static", Entry: dst.String() + ":443", Generation: 1}}
		if err := w.Opened(fl); err != nil {
			t.Fatal(err)
		}
		fl.Time = fl.Time.Add(time.Second)
		fl.Dest = Dest{} // the writer closes it under what opened it
		fl.Counts = Counts{BytesOut: uint64(100 * i), BytesIn: uint64(1000 * i), PacketsOut: 1, PacketsIn: 2}
		if err := w.Closed(fl); err != nil {
			t.Fatal(err)
		}
	}
}

func writeLedger(t *testing.T, budget, n int, dests ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "s"+FileExt)
	w, err := Open("s", p, budget)
	if err != nil {
		t.Fatal(err)
	}
	script(t, w, n, dests...)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

func lines(t *testing.T, p string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
}

func TestLedgerChainVerifiesAndSums(t *testing.T) {
	p := writeLedger(t, 0, 4, "198.18.2.10", "198.18.3.10")
	rep, err := Read("s", p, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Verified || rep.Records != 8 {
		t.Fatalf("report = %+v, want verified, 8 records", rep)
	}
	if len(rep.Destinations) != 2 {
		t.Fatalf("destinations = %+v, want 2", rep.Destinations)
	}
	// flows 2 and 4 went to .2.10 (i%2 == 0), 1 and 3 to .3.10
	d := rep.Destinations[0]
	if d.Dest != "198.18.2.10" || d.Connections != 2 || d.BytesOut != 600 || d.BytesIn != 6000 || d.Via != "static" || d.Generation != 1 {
		t.Fatalf("first destination = %+v, want 198.18.2.10: 2 connections, 600 out, 6000 in", d)
	}
	if !d.First.Equal(t0.Add(2*time.Second)) || !d.Last.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("first destination spans %s..%s, want %s..%s", d.First, d.Last, t0.Add(2*time.Second), t0.Add(5*time.Second))
	}
}

func TestLedgerDetectsTampering(t *testing.T) {
	p := writeLedger(t, 0, 4, "198.18.2.10", "198.18.3.10")
	ls := lines(t, p)
	for _, tc := range []struct {
		name   string
		change func([][]byte) [][]byte
		want   string // in Broken; "" = verifies
	}{
		{"untouched", func(l [][]byte) [][]byte { return l }, ""},
		{"one record edited", func(l [][]byte) [][]byte {
			l = append([][]byte(nil), l...)
			l[3] = bytes.Replace(l[3], []byte(`"bytes_out":200`), []byte(`"bytes_out":2`), 1)
			return l
		}, "was changed"},
		{"one record deleted", func(l [][]byte) [][]byte {
			return append(append([][]byte(nil), l[:2]...), l[3:]...)
		}, "missing"},
		{"a field added", func(l [][]byte) [][]byte {
			l = append([][]byte(nil), l...)
			l[1] = bytes.Replace(l[1], []byte(`{`), []byte(`{"note":"x",`), 1)
			return l
		}, "not a ledger record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := filepath.Join(t.TempDir(), "s"+FileExt)
			if err := os.WriteFile(q, append(bytes.Join(tc.change(ls), []byte("\n")), '\n'), 0o600); err != nil {
				t.Fatal(err)
			}
			rep, err := Read("s", q, 0, "")
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" && (!rep.Verified || rep.Broken != "") {
				t.Fatalf("untouched ledger: %+v, want verified", rep)
			}
			if tc.want != "" && (rep.Verified || !strings.Contains(rep.Broken, tc.want)) {
				t.Fatalf("%s: verified %v, broken %q; want broken with %q", tc.name, rep.Verified, rep.Broken, tc.want)
			}
		})
	}
	// The whole file under another session's name: its first link is not
	// that session's.
	if rep, _ := Read("t", p, 0, ""); rep.Verified || !strings.Contains(rep.Broken, "line 1:") {
		t.Fatalf("s's ledger read as t's: %+v, want broken at line 1", rep)
	}
	// The last record removed: the file alone still chains; the head the
	// daemon wrote does not match.
	seq, head := uint64(len(ls)), ""
	rep0, _ := Read("s", p, 0, "")
	head = rep0.Head
	q := filepath.Join(t.TempDir(), "s"+FileExt)
	os.WriteFile(q, append(bytes.Join(ls[:len(ls)-1], []byte("\n")), '\n'), 0o600)
	if rep, _ := Read("s", q, seq, head); rep.Verified || !strings.Contains(rep.Broken, "the daemon wrote up to") {
		t.Fatalf("truncated ledger against the daemon's head: %+v, want broken", rep)
	}
	if rep, _ := Read("s", p, seq, head); !rep.Verified {
		t.Fatalf("whole ledger against the daemon's head: %+v, want verified", rep)
	}
}

// TestLedgerAggregatesPastBudget: past the budget a session's flows leave
// no lines, and the report's sums are those of an unbounded ledger.
func TestLedgerAggregatesPastBudget(t *testing.T) {
	dests := []string{"198.18.2.10", "198.18.3.10", "198.18.4.10"}
	full := writeLedger(t, 0, 300, dests...)
	bounded := writeLedger(t, 20, 300, dests...)
	want, err := Read("s", full, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Read("s", bounded, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if !got.Verified {
		t.Fatalf("bounded ledger: %s", got.Broken)
	}
	if n := len(lines(t, bounded)); n != 20+len(dests) {
		t.Fatalf("bounded ledger has %d lines, want the budget 20 and %d aggregates", n, len(dests))
	}
	if got.Aggregated == 0 {
		t.Fatalf("bounded ledger: nothing aggregated")
	}
	if !reflect.DeepEqual(got.Destinations, want.Destinations) {
		t.Fatalf("bounded sums:\n%+v\nwant the unbounded ones:\n%+v", got.Destinations, want.Destinations)
	}
}

// TestLedgerContinuesAfterReopen: a writer reopened on the file (a daemon
// restart) chains after the last record; a close whose open it never saw
// still counts the connection.
func TestLedgerContinuesAfterReopen(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s"+FileExt)
	w, err := Open("s", p, 0)
	if err != nil {
		t.Fatal(err)
	}
	script(t, w, 2, "198.18.2.10")
	open := Flow{Time: t0.Add(time.Minute), CtID: 99, Proto: 17, Src: netip.MustParseAddr("10.20.0.2"),
		Dst: netip.MustParseAddr("198.18.5.10"), Sport: 5000, Dport: 53, Dest: Dest{Via: "public", Generation: 2}}
	if err := w.Opened(open); err != nil {
		t.Fatal(err)
	}
	w.f.Close() // no Close: as a kill -9 leaves it
	w2, err := Open("s", p, 0)
	if err != nil {
		t.Fatal(err)
	}
	closed := open
	closed.Time = closed.Time.Add(time.Second)
	closed.Counts = Counts{BytesOut: 40, BytesIn: 80}
	closed.Dest = Dest{Via: "unknown"} // the new writer classifies it afresh (the session may be gone)
	if err := w2.Closed(closed); err != nil {
		t.Fatal(err)
	}
	// a flow opened while the daemon was down: only its close is seen
	unseen := Flow{Time: t0.Add(2 * time.Minute), CtID: 7, Proto: 6, Src: open.Src, Dst: netip.MustParseAddr("198.18.6.10"),
		Dport: 80, Dest: Dest{Via: "static", Entry: "198.18.6.10", Generation: 2}, Counts: Counts{BytesOut: 1}}
	if err := w2.Closed(unseen); err != nil {
		t.Fatal(err)
	}
	seq, head := w2.Head()
	w2.Close()
	rep, err := Read("s", p, seq, head)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Verified || rep.Records != 7 || len(rep.Destinations) != 3 {
		t.Fatalf("report after reopen: %+v, want verified, 7 records", rep)
	}
	for _, d := range rep.Destinations {
		if d.Connections != map[string]uint64{"198.18.2.10": 2, "198.18.5.10": 1, "198.18.6.10": 1}[d.Dest] {
			t.Fatalf("destination %+v: wrong connection count", d)
		}
		if d.Dest == "198.18.5.10" && (d.BytesOut != 40 || d.BytesIn != 80 || d.Via != "public" || d.Generation != 2) {
			t.Fatalf("destination %+v: want 40 out, 80 in, under its open's public, generation 2", d)
		}
	}
}
