package eventlog

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// encodingJSON is what the event writer wrote before appendEventJSON, and
// still writes for what appendEventJSON declines.
func encodingJSON(t testing.TB, ev api.Event) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(ev); err != nil {
		t.Fatalf("encoding/json: %v", err)
	}
	return buf.Bytes()
}

func checkEventJSON(t testing.TB, ev api.Event) {
	got, ok := appendEventJSON([]byte("prefix"), &ev)
	if !ok {
		if string(got) != "prefix" {
			t.Fatalf("declined, but appended %q", got)
		}
		return
	}
	if want := encodingJSON(t, ev); !bytes.Equal(got[len("prefix"):], want) {
		t.Fatalf("appendEventJSON(%#v)\n got  %s\nwant %s", ev, got[len("prefix"):], want)
	}
}

// TestEventJSONMatches: the events the daemon records (a DNS answer, a
// filtered one, an API call with its caller, a flow drop) and awkward
// strings encode exactly as encoding/json encodes them; what it does not
// know it declines (and appends nothing).
func TestEventJSONMatches(t *testing.T) {
	at := time.Date(2026, 12, 1, 18, 58, 13, 123456789, time.UTC)
	cases := []api.Event{
		{Time: at, Session: "agent", Kind: api.EventKindDNS, Action: "allowed", Detail: map[string]any{
			"name": "h1.allowed.test.", "type": "A", "addrs": []string{"198.18.1.10", "198.18.2.10"},
			"upstream": "198.18.0.53:53", "upstream_ms": 0.25}},
		{Time: at, Session: "agent", Kind: api.EventKindDNS, Action: api.DNSActionFiltered, Detail: map[string]any{
			"name": "meta.test.", "type": "A", "dropped": []string{"169.254.169.254"}, "upstream_ms": 12.0}},
		{Time: at.Add(time.Nanosecond * 7), Session: "ci-1", Kind: api.EventKindLifecycle, Action: "created",
			Caller: &api.Caller{UID: 1000, GID: 1000, PID: 4242}, Detail: map[string]any{"egress": "allowlist", "pinned": true, "n": 3, "big": int64(1 << 40), "u": uint64(1<<63 + 5)}},
		{Time: at, Session: "s", Kind: api.EventKindFlow, Action: "dropped", Detail: map[string]any{"proto": "tcp", "dport": 443, "reason": "not-allowed"}},
		{Time: time.Time{}, Session: "", Kind: "", Detail: map[string]any{}},
		{Time: at, Session: "q\"uote\\back\nline\ttab\b\f\r\x00\x1f\x7f", Kind: "<html>&</html>", Action: "\u2028\u2029é€😀",
			Detail: map[string]any{"bad utf8": "a\xffb\xc3", "\u00e9key": nil, "empty": []string{}, "nil list": []string(nil), "": ""}},
		{Time: at, Session: "f", Kind: "k", Detail: map[string]any{"tiny": 1e-7, "huge": 1e21, "neg": -0.000001, "zero": 0.0, "e": 123456789e-20, "third": 1.0 / 3}},
		{Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)), Session: "zone", Kind: "k"},
	}
	for _, ev := range cases {
		checkEventJSON(t, ev)
	}
	for _, ev := range []api.Event{
		{Time: at, Detail: map[string]any{"ips": []int{1}}},
		{Time: at, Detail: map[string]any{"nan": math.NaN()}},
		{Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		if got, ok := appendEventJSON(nil, &ev); ok {
			t.Errorf("appendEventJSON(%#v) = %s, want it declined", ev, got)
		}
	}
}

// FuzzEventJSON: any strings, numbers and times encode as encoding/json
// encodes them.
func FuzzEventJSON(f *testing.F) {
	f.Add("agent", "dns", "allowed", "h1.allowed.test.", "198.18.1.10", 0.25, int64(1764615493123456789), uint32(0), 7)
	f.Add("q\"\\\n", "\u2028", "\xff", "é€", "", -1e-7, int64(0), uint32(1000), -1)
	f.Fuzz(func(t *testing.T, session, kind, action, name, addr string, ms float64, unixNano int64, uid uint32, n int) {
		ev := api.Event{Time: time.Unix(0, unixNano).UTC(), Session: session, Kind: kind, Action: action,
			Detail: map[string]any{"name": name, "addrs": []string{addr, name}, "upstream_ms": ms, "n": n, name: addr}}
		if uid != 0 {
			ev.Caller = &api.Caller{UID: uid, GID: uid / 2, PID: int32(n)}
		}
		checkEventJSON(t, ev)
	})
}

// BenchmarkEventJSON: a DNS answer's event, encoded by appendEventJSON
// and by encoding/json.
func BenchmarkEventJSON(b *testing.B) {
	ev := api.Event{Time: time.Now().UTC(), Session: "dnsperf", Kind: api.EventKindDNS, Action: "allowed", Detail: map[string]any{
		"name": "h17.allowed.test.", "type": "A", "addrs": []string{"198.18.3.17"}, "upstream": "198.18.0.53:5353", "upstream_ms": 1.234}}
	b.Run("append", func(b *testing.B) {
		var buf []byte
		for range b.N {
			buf, _ = appendEventJSON(buf[:0], &ev)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		for range b.N {
			buf.Reset()
			_ = enc.Encode(ev)
		}
	})
}
