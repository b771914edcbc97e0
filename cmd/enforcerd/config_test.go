package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/internal/gctune"
	"github.com/enforcerd/enforcerd/nsmgr"

	"github.com/enforcerd/enforcerd/internal/cli"
)

func writeTOML(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "enforcerd.toml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// serveCfg runs `enforcerd serve ARGS` against the fake and returns the
// configuration it was given.
func serveConfigOf(t *testing.T, c *testCLI, args ...string) ServeConfig {
	t.Helper()
	if code := c.run(append([]string{"serve"}, args...)...); code != 0 {
		t.Fatalf("serve %v: exit %d: %s", args, code, c.errOut.String())
	}
	if c.served == nil {
		t.Fatal("serve not called")
	}
	return *c.served
}

func TestServeDefaults(t *testing.T) {
	c := newTestCLI(t)
	got := serveConfigOf(t, c)
	want := ServeConfig{
		Socket:            api.DefaultSocket,
		StateDir:          "/var/lib/enforcerd",
		NamePrefix:        "enf",
		Pool:              netip.MustParsePrefix("10.20.0.0/16"),
		Upstreams:         []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")},
		DNSMinTTL:         60 * time.Second,
		AttestMaxLifetime: time.Hour,
		LogFormat:         "text",
		MaxFlows:          defaultMaxFlows, FlowRate: defaultFlowRate, MaxAttested: defaultMaxAttest,
		EventsRetention: 24 * time.Hour, PreparedNetns: nsmgr.DefaultPrepared, HeapFloorMiB: gctune.DefaultHeapFloor >> 20,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
	// Under systemd the default log format is json.
	for _, env := range []string{"INVOCATION_ID", "JOURNAL_STREAM"} {
		c := newTestCLI(t)
		c.env[env] = "x"
		if got := serveConfigOf(t, c); got.LogFormat != "json" {
			t.Errorf("%s set: log format %q, want json", env, got.LogFormat)
		}
	}
}

// TestServeConfigPrecedence: defaults < ENFORCERD_SOCKET < config file <
// global --socket < flags; lists from flags replace lists from the file.
func TestServeConfigPrecedence(t *testing.T) {
	file := writeTOML(t, `
socket = "/file/enforcerd.sock"
socket-group = "enforcerd"
state-dir = "/file/state"
name-prefix = "fil"
pool = "10.40.0.0/16"
upstream = ["198.51.100.1", "198.51.100.2:5353", "[2001:db8::53]:53"]
public-override = ["198.18.0.0/15"]
dns-min-ttl = "5m"
attest-max-lifetime = "10m"
metrics-listen = "127.0.0.1:9323"
log-format = "json"
events-retention = "90m"
prepared-netns = 0
heap-floor-mib = 8
`)
	c := newTestCLI(t)
	c.env["ENFORCERD_SOCKET"] = "/env/enforcerd.sock"
	fromFile := serveConfigOf(t, c, "--config", file)
	want := ServeConfig{
		Socket:      "/file/enforcerd.sock",
		SocketGroup: "enforcerd",
		StateDir:    "/file/state",
		NamePrefix:  "fil",
		Pool:        netip.MustParsePrefix("10.40.0.0/16"),
		Upstreams: []netip.AddrPort{netip.MustParseAddrPort("198.51.100.1:53"),
			netip.MustParseAddrPort("198.51.100.2:5353"), netip.MustParseAddrPort("[2001:db8::53]:53")},
		PublicOverrides:   []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
		DNSMinTTL:         5 * time.Minute,
		AttestMaxLifetime: 10 * time.Minute,
		MetricsListen:     "127.0.0.1:9323",
		LogFormat:         "json",
		MaxFlows:          defaultMaxFlows, FlowRate: defaultFlowRate, MaxAttested: defaultMaxAttest,
		EventsRetention: 90 * time.Minute,
		PreparedNetns:   0, // set in the file: no pool
		HeapFloorMiB:    8,
		ConfigFile:      file,
	}
	if !reflect.DeepEqual(fromFile, want) {
		t.Fatalf("config file:\n got  %+v\nwant %+v", fromFile, want)
	}

	flags := serveConfigOf(t, c, "--config", file, "--pool", "10.50.0.0/24", "--upstream", "203.0.113.9",
		"--name-prefix", "flg", "--log-format", "text", "--dns-min-ttl", "0s", "--socket", "/flag/s.sock", "--attest-max-lifetime", "0")
	want.Pool = netip.MustParsePrefix("10.50.0.0/24")
	want.Upstreams = []netip.AddrPort{netip.MustParseAddrPort("203.0.113.9:53")}
	want.NamePrefix = "flg"
	want.LogFormat = "text"
	want.DNSMinTTL = 0
	want.AttestMaxLifetime = 0
	want.Socket = "/flag/s.sock"
	if !reflect.DeepEqual(flags, want) {
		t.Fatalf("flags over config:\n got  %+v\nwant %+v", flags, want)
	}

	// The global --socket beats the file, the serve flag beats the global.
	if got := serveConfigOf(t, c, "--config", file).Socket; got != "/file/enforcerd.sock" {
		t.Errorf("file socket: %q", got)
	}
	c.run("--socket", "/global.sock", "serve", "--config", file)
	if got := c.served.Socket; got != "/global.sock" {
		t.Errorf("global socket over file: %q", got)
	}
	c.run("--socket", "/global.sock", "serve", "--socket", "/serve.sock")
	if got := c.served.Socket; got != "/serve.sock" {
		t.Errorf("serve socket over global: %q", got)
	}
	// ENFORCERD_SOCKET applies when nothing else names a socket.
	if got := serveConfigOf(t, c).Socket; got != "/env/enforcerd.sock" {
		t.Errorf("env socket: %q", got)
	}
	// A relative path is made absolute (the daemon's cwd is not the caller's).
	wd, _ := os.Getwd()
	if got := serveConfigOf(t, c, "--state-dir", "rel/state").StateDir; got != filepath.Join(wd, "rel/state") {
		t.Errorf("relative state dir: %q", got)
	}
}

func TestServeConfigErrors(t *testing.T) {
	unknown := writeTOML(t, "pool = \"10.20.0.0/16\"\nbogus = 1\n[extra]\nx = 2\n")
	badType := writeTOML(t, "pool = 5\n")
	ttlInt := writeTOML(t, "dns-min-ttl = 5\n")
	flowsString := writeTOML(t, "max-flows = \"8192\"\n")
	upstreamInts := writeTOML(t, "upstream = [1, 2]\n")
	formatBool := writeTOML(t, "log-format = true\n")
	dirTable := writeTOML(t, "state-dir = { path = \"/x\" }\n")
	retentionFloat := writeTOML(t, "events-retention = 1.5\n")
	badSyntax := writeTOML(t, "pool = \n")
	badValue := writeTOML(t, "pool = \"10.20.0.1/16\"\n")
	noNS := writeTOML(t, "")
	smallPool6 := writeTOML(t, "pool6 = \"fd00:20::/120\"\n")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--name-prefix", "toolong"}, `--name-prefix: invalid prefix "toolong": 7 characters; want 1 to 6 characters of a-z and 0-9, starting with a letter`},
		{[]string{"--name-prefix", "1ab"}, `--name-prefix: invalid prefix "1ab": starts with '1'; want 1 to 6 characters of a-z and 0-9, starting with a letter`},
		{[]string{"--name-prefix", "a-b"}, `--name-prefix: invalid prefix "a-b": character '-' not allowed; want 1 to 6 characters of a-z and 0-9, starting with a letter`},
		{[]string{"--name-prefix", ""}, `--name-prefix: invalid prefix "": empty; want 1 to 6 characters of a-z and 0-9, starting with a letter`},
		{[]string{"--pool", "10.20.0.1/16"}, `--pool: invalid pool 10.20.0.1/16: host bits set (did you mean 10.20.0.0/16?); want an IPv4 prefix between /8 and /28`},
		{[]string{"--pool", "fd00::/64"}, `--pool: invalid pool fd00::/64: IPv6 is not supported; want an IPv4 prefix between /8 and /28`},
		{[]string{"--pool", "10.20.0.0/31"}, `--pool: invalid pool 10.20.0.0/31: smaller than /28, the smallest pool (3 session /30s beside the reserved DNS /30); want an IPv4 prefix between /8 and /28`},
		{[]string{"--pool", "10.0.0.0/29"}, `--pool: invalid pool 10.0.0.0/29: smaller than /28, the smallest pool (3 session /30s beside the reserved DNS /30); want an IPv4 prefix between /8 and /28`},
		{[]string{"--pool", "10.0.0.0/7"}, `--pool: invalid pool 10.0.0.0/7: larger than /8, the largest pool (4194303 session slots); want an IPv4 prefix between /8 and /28`},
		{[]string{"--pool", "ten"}, `--pool "ten": want an IPv4 CIDR such as 10.20.0.0/16`},
		{[]string{"--upstream", "192.0.2.1", "--upstream", "dns.google"}, `--upstream "dns.google": want IP or IP:PORT such as 192.0.2.53 or 192.0.2.53:5353`},
		{[]string{"--upstream", "192.0.2.1:0"}, `--upstream "192.0.2.1:0": want IP or IP:PORT such as 192.0.2.53 or 192.0.2.53:5353`},
		{[]string{"--public-override", "198.18.0.1/15"}, `--public-override "198.18.0.1/15": want a network CIDR such as 198.18.0.0/15`},
		{[]string{"--dns-min-ttl", "-1s"}, `--dns-min-ttl "-1s": want a non-negative duration such as 60s or 5m`},
		{[]string{"--dns-min-ttl", "60"}, `--dns-min-ttl "60": want a non-negative duration such as 60s or 5m`},
		{[]string{"--attest-max-lifetime", "25h"}, `--attest-max-lifetime "25h": want a duration from 0 (no refresh) to 24h, such as 1h or 10m`},
		{[]string{"--attest-max-lifetime", "-1m"}, `--attest-max-lifetime "-1m": want a duration from 0 (no refresh) to 24h, such as 1h or 10m`},
		{[]string{"--events-retention", "1d"}, `--events-retention "1d": want a non-negative duration such as 24h or 30m`},
		{[]string{"--heap-floor-mib", "32MiB"}, `--heap-floor-mib "32MiB": want a whole number of MiB from 0 (none) to 4096`},
		{[]string{"--heap-floor-mib", "5000"}, `--heap-floor-mib "5000": want a whole number of MiB from 0 (none) to 4096`},
		{[]string{"--metrics-listen", "9323"}, `--metrics-listen "9323": want host:port such as 127.0.0.1:9323 or :9323`},
		{[]string{"--metrics-listen", "localhost:http"}, `--metrics-listen "localhost:http": want a numeric port 0-65535`},
		{[]string{"--log-format", "xml"}, `--log-format "xml": want text or json`},
		{[]string{"--socket-group", "a b"}, `--socket-group "a b": want a group name or numeric gid`},
		{[]string{"--socket", ""}, ""}, // empty flag value: falls back (not an error)
		{[]string{"--config", "/nonexistent/enforcerd.toml"}, "read config: open /nonexistent/enforcerd.toml: no such file or directory"},
		{[]string{"--config", unknown}, "config " + unknown + `: unknown key "bogus", "extra", "extra.x" (keys are the serve option names, e.g. state-dir)`},
		{[]string{"--config", badType}, "config " + badType + `: pool: want a CIDR string such as "10.20.0.0/16", got integer 5`},
		{[]string{"--config", ttlInt}, "config " + ttlInt + `: dns-min-ttl: want a duration such as "60s", got integer 5`},
		{[]string{"--config", flowsString}, "config " + flowsString + `: max-flows: want a whole number such as 8192, got string "8192"`},
		{[]string{"--config", upstreamInts}, "config " + upstreamInts + `: upstream: want a list of addresses such as ["192.0.2.53", "192.0.2.54:5353"], got an array holding integer 1`},
		{[]string{"--config", formatBool}, "config " + formatBool + `: log-format: want "text" or "json", got boolean true`},
		{[]string{"--config", dirTable}, "config " + dirTable + `: state-dir: want a path string such as "/var/lib/enforcerd", got a table`},
		{[]string{"--config", retentionFloat}, "config " + retentionFloat + `: events-retention: want a duration such as "60s", got float 1.5`},
		{[]string{"--config", badSyntax}, "config " + badSyntax + `: toml: line 1 (last key "pool"): expected value but found '\n' instead`},
		{[]string{"--config", badValue}, badValue + `: pool: invalid pool 10.20.0.1/16: host bits set (did you mean 10.20.0.0/16?); want an IPv4 prefix between /8 and /28`},
		{[]string{"--config", noNS}, ""},
		{[]string{"--pool6", "10.30.0.0/16"}, `--pool6: invalid pool6 10.30.0.0/16: not IPv6; want a masked IPv6 prefix such as fd00:20::/112`},
		{[]string{"--pool6", "::ffff:10.30.0.0/112"}, `--pool6: invalid pool6 ::ffff:10.30.0.0/112: not IPv6; want a masked IPv6 prefix such as fd00:20::/112`},
		{[]string{"--pool6", "fd00:20::1/112"}, `--pool6: invalid pool6 fd00:20::1/112: host bits set (did you mean fd00:20::/112?); want a masked IPv6 prefix such as fd00:20::/112`},
		{[]string{"--pool6", "fd00:20::/113"}, `--pool6: invalid pool6 fd00:20::/113: too small for the /126s of the 16383 slots of pool 10.20.0.0/16; want /112 or wider`},
		{[]string{"--pool6", "fe80::/64"}, `--pool6: invalid pool6 fe80::/64: not a unicast range a host can route; want a masked IPv6 prefix such as fd00:20::/112`},
		{[]string{"--pool6", "fd00:20::"}, `--pool6 "fd00:20::": want an IPv6 CIDR such as fd00:20::/112`},
		{[]string{"--pool6", "fd00:20::/112", "--public-override", "fd00::/16"}, `--pool6 fd00:20::/112: overlaps the public override fd00::/16; want a pool apart from every public override`},
		{[]string{"--config", smallPool6}, smallPool6 + `: pool6: invalid pool6 fd00:20::/120: too small for the /126s of the 16383 slots of pool 10.20.0.0/16; want /112 or wider`},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			c := newTestCLI(t)
			code := c.run(append([]string{"serve"}, tc.args...)...)
			if tc.want == "" {
				if code != 0 {
					t.Fatalf("exit %d: %s", code, c.errOut.String())
				}
				return
			}
			if code != cli.ExitUsage {
				t.Errorf("exit %d, want 2", code)
			}
			if got, want := c.errOut.String(), "enforcerd serve: "+tc.want+"\n"; got != want {
				t.Errorf("stderr\n got %q\nwant %q", got, want)
			}
		})
	}
}

// TestConfigLenientTypes: a numeric socket-group is a gid, and one upstream
// may be given as a string instead of a list of one.
func TestConfigLenientTypes(t *testing.T) {
	c := newTestCLI(t)
	got := serveConfigOf(t, c, "--config", writeTOML(t, "socket-group = 1001\nupstream = \"192.0.2.1\"\n"))
	if got.SocketGroup != "1001" || len(got.Upstreams) != 1 || got.Upstreams[0].String() != "192.0.2.1:53" {
		t.Fatalf("socket group %q, upstreams %v", got.SocketGroup, got.Upstreams)
	}
}

func TestDefaultUpstreams(t *testing.T) {
	c := newTestCLI(t)
	rc := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(rc, []byte("nameserver 127.0.0.53\nnameserver 2001:db8::1\nnameserver 127.0.0.53\nnameserver bogus\noptions edns0\n"), 0o644)
	c.resolvConf = rc
	got := serveConfigOf(t, c).Upstreams
	want := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.53:53"), netip.MustParseAddrPort("[2001:db8::1]:53")}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}

	os.WriteFile(rc, []byte("search example\n"), 0o644)
	if code := c.run("serve"); code != cli.ExitUsage || c.errOut.String() != "enforcerd serve: default upstream: "+rc+" lists no nameserver (set --upstream)\n" {
		t.Fatalf("exit %d, stderr %q", code, c.errOut.String())
	}
	// An explicit upstream does not need resolv.conf at all.
	c.resolvConf = "/nonexistent"
	if got := serveConfigOf(t, c, "--upstream", "192.0.2.1:5353").Upstreams; len(got) != 1 {
		t.Fatalf("upstreams %v", got)
	}
}

func TestReapConfig(t *testing.T) {
	file := writeTOML(t, "name-prefix = \"fil\"\nstate-dir = \"/file/state\"\npool = \"10.40.0.0/16\"\nupstream = [\"192.0.2.1\"]\n")
	c := newTestCLI(t)
	if code := c.run("reap", "--config", file, "--pool", "10.41.0.0/16"); code != 0 {
		t.Fatalf("exit %d: %s", code, c.errOut.String())
	}
	if want := []string{"fil", "/file/state", "10.41.0.0/16"}; !reflect.DeepEqual(c.reaped, want) {
		t.Fatalf("reaped %v, want %v", c.reaped, want)
	}
}

// TestServeConfigPool6: --pool6 and the pool6 key set the dual-stack pool
// (flags win); without either the daemon stays IPv4-only.
func TestServeConfigPool6(t *testing.T) {
	if got := serveConfigOf(t, newTestCLI(t)).Pool6; got.IsValid() {
		t.Errorf("default pool6 = %s, want none", got)
	}
	if got := serveConfigOf(t, newTestCLI(t), "--pool6", "fd00:20::/112").Pool6; got != netip.MustParsePrefix("fd00:20::/112") {
		t.Errorf("--pool6 = %s", got)
	}
	file := writeTOML(t, "pool = \"10.40.0.0/24\"\npool6 = \"2001:db8:40::/120\"\n")
	if got := serveConfigOf(t, newTestCLI(t), "--config", file).Pool6; got != netip.MustParsePrefix("2001:db8:40::/120") {
		t.Errorf("pool6 key = %s", got)
	}
	if got := serveConfigOf(t, newTestCLI(t), "--config", file, "--pool6", "fd00:41::/64").Pool6; got != netip.MustParsePrefix("fd00:41::/64") {
		t.Errorf("--pool6 over the file = %s", got)
	}
}
