package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/opencontainers/runc/libcontainer/logs"
	"github.com/sirupsen/logrus"
)

// libcontainer's lines, its own (logrus' standard logger) and those its init process forwards
// (logs.ForwardLogs), come out as the daemon's JSON records, level and message kept.
func TestLogrusRoutedToSlog(t *testing.T) {
	var out bytes.Buffer
	routeLogrus(slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})))
	t.Cleanup(func() {
		logrus.SetOutput(io.Discard) // no later test writes text through it
		logrus.StandardLogger().ReplaceHooks(logrus.LevelHooks{})
	})

	logrus.WithField("pid", 42).Warnf("KeyctlJoinSessionKeyring: %s", "operation not permitted")
	logrus.Debug("not at info")
	r, w := io.Pipe()
	done := logs.ForwardLogs(r)
	io.WriteString(w, `{"level":"error","msg":"from the init"}`+"\n"+`{"level":"debug","msg":"nsexec: not at info"}`+"\n")
	w.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	var got []map[string]any
	s := bufio.NewScanner(&out)
	for s.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(s.Bytes(), &rec); err != nil {
			t.Fatalf("not JSON: %q", s.Text())
		}
		delete(rec, "time")
		got = append(got, rec)
	}
	want := []map[string]any{
		{"level": "WARN", "msg": "KeyctlJoinSessionKeyring: operation not permitted", "source": "libcontainer", "pid": float64(42)},
		{"level": "ERROR", "msg": "from the init", "source": "libcontainer"},
	}
	if len(got) != len(want) {
		t.Fatalf("records %v, want %v", got, want)
	}
	for i := range want {
		if g, _ := json.Marshal(got[i]); string(g) != mustJSON(want[i]) {
			t.Errorf("record %d: %s, want %s", i, g, mustJSON(want[i]))
		}
	}
	if strings.Contains(out.String(), "not at info") {
		t.Errorf("debug lines passed an info logger:\n%s", out.String())
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
