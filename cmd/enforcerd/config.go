package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/spf13/pflag"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/daemon"
	"github.com/enforcerd/enforcerd/doctor"
	"github.com/enforcerd/enforcerd/internal/gctune"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// ServeConfig is the validated configuration of `enforcerd serve`.
// Invariants after buildServeConfig: Socket and StateDir are absolute paths;
// NamePrefix is 1-6 of [a-z0-9] starting with a letter; Pool is a masked IPv4
// prefix of /30 or wider; Upstreams is non-empty; PublicOverrides are masked;
// DNSMinTTL >= 0; LogFormat is "text" or "json".
type ServeConfig struct {
	Socket          string           // unix socket of the API
	SocketGroup     string           // group name or gid allowed on the socket; "" = root only (mode 0600)
	StateDir        string           // holds sessions/<name>.json
	NamePrefix      string           // tags every kernel object
	Pool            netip.Prefix     // the /30s of the sessions come from here
	Pool6           netip.Prefix     // the sessions' /126s (dual-stack); invalid: IPv4-only
	Upstreams       []netip.AddrPort // DNS resolvers the proxy forwards to
	PublicOverrides []netip.Prefix   // special-purpose ranges treated as public (labs, tests)
	DNSMinTTL       time.Duration    // floor of an attested address's lifetime
	// AttestMaxLifetime bounds the refresh of attested addresses by new
	// connections (0: no refresh; at most 24h).
	AttestMaxLifetime time.Duration
	MetricsListen     string        // host:port of the Prometheus endpoint; "" = off
	LogFormat         string        // "text" or "json"
	ConfigFile        string        // the --config file, "" if none (for the start-up log)
	ImagesDirs        []string      // the only directories a sandbox rootfs may come from (absolute, cleaned)
	MaxFlows          int           // per-session cap on concurrent tracked flows (> 0)
	FlowRate          int           // per-session new flows per second (> 0); the burst is twice this
	MaxAttested       int           // per-session cap on live DNS-attested elements (> 0)
	EventsRetention   time.Duration // how long a removed session's events are kept (>= 0)
	PreparedNetns     int           // session netns kept made ahead of demand (0: none)
	HeapFloorMiB      int           // the collector's heap floor (gctune.SetHeapFloor; 0: none)
}

// daemonConfig is the part of the configuration the session lifecycle uses.
func (c ServeConfig) daemonConfig() daemon.Config {
	return daemon.Config{
		StateDir: c.StateDir, NamePrefix: c.NamePrefix, Pool: c.Pool, Pool6: c.Pool6,
		Upstreams: c.Upstreams, PublicOverrides: c.PublicOverrides, DNSMinTTL: c.DNSMinTTL,
		AttestMaxLifetime: c.AttestMaxLifetime,
		ImagesDirs:        c.ImagesDirs, MaxFlows: c.MaxFlows, FlowRate: c.FlowRate, MaxAttested: c.MaxAttested,
		EventsRetention: c.EventsRetention, PreparedNetns: c.PreparedNetns,
	}
}

// doctorConfig is the part of the configuration the doctor's checks read.
func (c ServeConfig) doctorConfig() doctor.Config {
	return doctor.Config{
		StateDir: c.StateDir, NamePrefix: c.NamePrefix, Pool: c.Pool, Pool6: c.Pool6, Upstreams: c.Upstreams, PublicOverrides: c.PublicOverrides,
		MaxFlows: c.MaxFlows, FlowRate: c.FlowRate, MaxAttested: c.MaxAttested,
	}
}

// Defaults of the serve options.
const (
	defaultStateDir   = "/var/lib/enforcerd"
	defaultNamePrefix = "enf"
	defaultPool       = "10.20.0.0/16"
	defaultDNSMinTTL  = "60s"
	defaultAttestLife = "1h"
	defaultMaxFlows   = 8192
	defaultFlowRate   = 2000
	defaultMaxAttest  = 4096
	defaultRetention  = "24h"
)

// The option names, shared by the flags and the TOML keys.
const (
	optConfig         = "config"
	optSocket         = "socket"
	optSocketGroup    = "socket-group"
	optStateDir       = "state-dir"
	optNamePrefix     = "name-prefix"
	optPool           = "pool"
	optPool6          = "pool6"
	optUpstream       = "upstream"
	optPublicOverride = "public-override"
	optDNSMinTTL      = "dns-min-ttl"
	optAttestLife     = "attest-max-lifetime"
	optMetricsListen  = "metrics-listen"
	optLogFormat      = "log-format"
	optImagesDir      = "images-dir"
	optMaxFlows       = "max-flows"
	optFlowRate       = "flow-rate"
	optMaxAttested    = "max-attested"
	optRetention      = "events-retention"
	optPreparedNetns  = "prepared-netns"
	optHeapFloor      = "heap-floor-mib"
)

// fileKinds are the keys of the TOML configuration file (the flag names)
// and the kind of value each takes. A value of another TOML type is an
// error naming the key, what it wants and what it got.
var fileKinds = map[string]valueKind{
	optSocket:         kindPath,
	optSocketGroup:    kindGroup,
	optStateDir:       kindPath,
	optNamePrefix:     kindName,
	optPool:           kindCIDR,
	optPool6:          kindCIDR,
	optUpstream:       kindAddrList,
	optPublicOverride: kindCIDRList,
	optDNSMinTTL:      kindDuration,
	optAttestLife:     kindDuration,
	optMetricsListen:  kindHostPort,
	optLogFormat:      kindLogFormat,
	optImagesDir:      kindPathList,
	optMaxFlows:       kindInt,
	optFlowRate:       kindInt,
	optMaxAttested:    kindInt,
	optRetention:      kindDuration,
	optPreparedNetns:  kindInt,
	optHeapFloor:      kindInt,
}

// valueKind is what a configuration key takes: its TOML type and the
// "want" of its type error.
type valueKind struct {
	list bool   // an array of strings (a single string is taken as one)
	num  bool   // an integer
	gid  bool   // a string, or an integer taken as a gid
	want string // "want ..." of a value of another type
}

var (
	kindPath      = valueKind{want: `a path string such as "/var/lib/enforcerd"`}
	kindGroup     = valueKind{gid: true, want: `a group name such as "enforcerd" or a numeric gid`}
	kindName      = valueKind{want: `a string such as "enf"`}
	kindCIDR      = valueKind{want: `a CIDR string such as "10.20.0.0/16"`}
	kindAddrList  = valueKind{list: true, want: `a list of addresses such as ["192.0.2.53", "192.0.2.54:5353"]`}
	kindCIDRList  = valueKind{list: true, want: `a list of CIDRs such as ["198.18.0.0/15"]`}
	kindDuration  = valueKind{want: `a duration such as "60s"`}
	kindHostPort  = valueKind{want: `a host:port string such as "127.0.0.1:9323"`}
	kindLogFormat = valueKind{want: `"text" or "json"`}
	kindPathList  = valueKind{list: true, want: `a list of directories such as ["/var/lib/enforcerd/images"]`}
	kindInt       = valueKind{num: true, want: "a whole number such as 8192"}
)

// values converts a decoded TOML value of the key's kind to the option's
// strings; ok is false for a value of another type.
func (k valueKind) values(v any) ([]string, bool) {
	switch v := v.(type) {
	case string:
		return []string{v}, !k.num
	case int64:
		return []string{strconv.FormatInt(v, 10)}, k.num || k.gid
	case []any:
		if !k.list {
			return nil, false
		}
		out := make([]string, 0, len(v))
		for _, e := range v {
			s, ok := e.(string)
			if !ok {
				return nil, false
			}
			out = append(out, s)
		}
		return out, true
	}
	return nil, false
}

// describeTOML names a decoded TOML value's type and shows it, for "got
// ..." in a type error: integer 5, string "5", boolean true, an array [1 2].
func describeTOML(v any) string {
	switch v := v.(type) {
	case string:
		return "string " + strconv.Quote(v)
	case int64:
		return fmt.Sprintf("integer %d", v)
	case float64:
		return fmt.Sprintf("float %v", v)
	case bool:
		return fmt.Sprintf("boolean %v", v)
	case time.Time:
		return "datetime " + v.Format(time.RFC3339)
	case []any:
		for _, e := range v {
			if _, ok := e.(string); !ok {
				return fmt.Sprintf("an array holding %s", describeTOML(e))
			}
		}
		return "an array"
	case map[string]any:
		return "a table"
	}
	return fmt.Sprintf("%T", v)
}

// rawOption is one option's unvalidated values and where they came from:
// origin prefixes its error messages ("--pool" or "/etc/enforcerd.toml: pool").
type rawOption struct {
	values []string
	origin string
}

// serveOptions are the raw options by name, before defaults and validation.
type serveOptions struct {
	opts       map[string]rawOption
	configFile string
}

func (o serveOptions) get(name string) (rawOption, bool) {
	r, ok := o.opts[name]
	return r, ok
}

// serveFlags holds the flag variables of serve and reap.
type serveFlags struct {
	config string
	force  bool // reap only
	single map[string]*string
	lists  map[string]*[]string
}

func defineServeFlags(fs *pflag.FlagSet) *serveFlags {
	f := &serveFlags{single: map[string]*string{}, lists: map[string]*[]string{}}
	fs.StringVar(&f.config, optConfig, "", "read options from the TOML `FILE` (flags win)")
	f.single[optSocketGroup] = fs.String(optSocketGroup, "", "`GROUP` allowed on the socket besides root (default: root only, mode 0600)")
	f.single[optStateDir] = fs.String(optStateDir, "", "state `DIR` (default "+defaultStateDir+")")
	f.single[optNamePrefix] = fs.String(optNamePrefix, "", "prefix `P` of every kernel object, 1-6 of [a-z0-9] (default "+defaultNamePrefix+")")
	f.single[optPool] = fs.String(optPool, "", "address pool `CIDR` of the sessions' /30s (default "+defaultPool+")")
	f.single[optPool6] = fs.String(optPool6, "", "IPv6 pool `CIDR` of the sessions' /126s: dual-stack sessions (default none: IPv6 closed)")
	f.lists[optUpstream] = fs.StringArray(optUpstream, nil, "upstream DNS resolver `IP[:PORT]`, repeatable (default: /etc/resolv.conf nameservers)")
	f.lists[optPublicOverride] = fs.StringArray(optPublicOverride, nil, "treat the special-purpose `CIDR` as public (labs, tests), repeatable")
	f.single[optDNSMinTTL] = fs.String(optDNSMinTTL, "", "minimum lifetime `DURATION` of an attested address (default "+defaultDNSMinTTL+")")
	f.single[optAttestLife] = fs.String(optAttestLife, "", "longest `DURATION` new connections keep an attested address allowed after its DNS answer; 0 = no refresh (default "+defaultAttestLife+")")
	f.single[optMetricsListen] = fs.String(optMetricsListen, "", "serve Prometheus metrics on `ADDR` (host:port; default off)")
	f.single[optLogFormat] = fs.String(optLogFormat, "", "log `FORMAT`: text or json (default json under systemd, else text)")
	f.lists[optImagesDir] = fs.StringArray(optImagesDir, nil, "a further root-owned `DIR` sandbox rootfs directories may come from, besides the image store <state-dir>/images, repeatable (default: none)")
	f.single[optMaxFlows] = fs.String(optMaxFlows, "", "per-session cap on concurrent tracked flows `N` (default "+strconv.Itoa(defaultMaxFlows)+")")
	f.single[optFlowRate] = fs.String(optFlowRate, "", "per-session new flows per second `N`, burst twice that (default "+strconv.Itoa(defaultFlowRate)+")")
	f.single[optMaxAttested] = fs.String(optMaxAttested, "", "per-session cap on live DNS-attested addresses `N` (default "+strconv.Itoa(defaultMaxAttest)+")")
	f.single[optRetention] = fs.String(optRetention, "", "keep a removed session's events for `DURATION` (0: remove them with it; default "+defaultRetention+")")
	f.single[optPreparedNetns] = fs.String(optPreparedNetns, "", "keep `N` session netns made ahead of demand, off the create path (0: none; default "+strconv.Itoa(nsmgr.DefaultPrepared)+")")
	f.single[optHeapFloor] = fs.String(optHeapFloor, "", "let the Go heap gather `MIB` MiB of garbage before each collection: fewer collections under a DNS flood, for up to that much more resident memory (0: none; default "+strconv.Itoa(gctune.DefaultHeapFloor>>20)+")")
	return f
}

func defineReapFlags(fs *pflag.FlagSet) *serveFlags {
	f := &serveFlags{single: map[string]*string{}, lists: map[string]*[]string{}}
	fs.StringVar(&f.config, optConfig, "", "read options from the TOML `FILE` (flags win)")
	f.single[optNamePrefix] = fs.String(optNamePrefix, "", "prefix `P` of the objects to remove (default "+defaultNamePrefix+")")
	f.single[optStateDir] = fs.String(optStateDir, "", "state `DIR` (default "+defaultStateDir+")")
	f.single[optPool] = fs.String(optPool, "", "address pool `CIDR` (default "+defaultPool+")")
	fs.BoolVar(&f.force, "force", false, "remove everything even while a daemon serves the prefix or the state dir")
	return f
}

// collectServeOptions merges the config file and the flags that were given
// (later wins). The socket of serve is the global --socket: the caller puts
// it into f.single.
func collectServeOptions(fs *pflag.FlagSet, f *serveFlags) (serveOptions, error) {
	o := serveOptions{opts: map[string]rawOption{}}
	if f.config != "" {
		fileOpts, err := loadConfigFile(f.config)
		if err != nil {
			return o, err
		}
		o.opts = fileOpts
		o.configFile = f.config
	}
	fs.Visit(func(fl *pflag.Flag) {
		if p, ok := f.single[fl.Name]; ok {
			o.opts[fl.Name] = rawOption{values: []string{*p}, origin: "--" + fl.Name}
		}
		if l, ok := f.lists[fl.Name]; ok {
			o.opts[fl.Name] = rawOption{values: *l, origin: "--" + fl.Name}
		}
	})
	return o, nil
}

// loadConfigFile reads a TOML config; an unknown key, or a value of
// another type than its key takes, is an error naming it.
func loadConfigFile(path string) (map[string]rawOption, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var file map[string]any
	md, err := toml.Decode(string(data), &file)
	if err != nil {
		return nil, fmt.Errorf("config %s: %v", path, err)
	}
	var unknown []string
	for _, k := range md.Keys() {
		if _, ok := fileKinds[k[0]]; !ok { // a table under a known key is that key's type error
			unknown = append(unknown, strconv.Quote(k.String()))
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("config %s: unknown key %s (keys are the serve option names, e.g. state-dir)", path, strings.Join(unknown, ", "))
	}
	out := map[string]rawOption{}
	for _, k := range md.Keys() { // in the file's order: the first bad key is named
		if len(k) > 1 {
			continue
		}
		key := k[0]
		kind := fileKinds[key]
		vals, ok := kind.values(file[key])
		if !ok {
			return nil, fmt.Errorf("config %s: %s: want %s, got %s", path, key, kind.want, describeTOML(file[key]))
		}
		out[key] = rawOption{values: vals, origin: path + ": " + key}
	}
	return out, nil
}

// single returns an option's one value, or def (with origin "default").
func (o serveOptions) single(name, def string) (string, string) {
	if r, ok := o.get(name); ok && len(r.values) > 0 {
		return r.values[0], r.origin
	}
	return def, "default " + name
}

// buildServeConfig applies defaults and validates every option. getenv
// supplies ENFORCERD_SOCKET (below the config file, above the default) and
// the systemd markers that make json the default log format; resolvConf is
// read only when no upstream is configured.
func buildServeConfig(o serveOptions, getenv func(string) string, resolvConf string) (ServeConfig, error) {
	cfg := ServeConfig{ConfigFile: o.configFile}
	var err error

	sock, origin := o.single(optSocket, "")
	if sock == "" {
		if env := getenv("ENFORCERD_SOCKET"); env != "" {
			sock, origin = env, "ENFORCERD_SOCKET"
		} else {
			sock = api.DefaultSocket
		}
	}
	if cfg.Socket, err = absPath(origin, sock); err != nil {
		return cfg, err
	}

	group, origin := o.single(optSocketGroup, "")
	if strings.ContainsAny(group, " \t\n:/") {
		return cfg, fmt.Errorf("%s %q: want a group name or numeric gid", origin, group)
	}
	cfg.SocketGroup = group

	dir, origin := o.single(optStateDir, defaultStateDir)
	if cfg.StateDir, err = absPath(origin, dir); err != nil {
		return cfg, err
	}

	prefix, origin := o.single(optNamePrefix, defaultNamePrefix)
	if cfg.NamePrefix, err = parseNamePrefix(origin, prefix); err != nil {
		return cfg, err
	}

	pool, origin := o.single(optPool, defaultPool)
	if cfg.Pool, err = parsePool(origin, pool); err != nil {
		return cfg, err
	}

	if r, ok := o.get(optUpstream); ok && len(r.values) > 0 {
		for _, v := range r.values {
			ap, err := parseUpstream(r.origin, v)
			if err != nil {
				return cfg, err
			}
			cfg.Upstreams = append(cfg.Upstreams, ap)
		}
	} else {
		if cfg.Upstreams, err = resolvConfNameservers(resolvConf); err != nil {
			return cfg, err
		}
	}

	if r, ok := o.get(optPublicOverride); ok {
		for _, v := range r.values {
			p, err := netip.ParsePrefix(v)
			if err != nil || p != p.Masked() {
				return cfg, fmt.Errorf("%s %q: want a network CIDR such as 198.18.0.0/15", r.origin, v)
			}
			cfg.PublicOverrides = append(cfg.PublicOverrides, p)
		}
	}

	if pool6, origin := o.single(optPool6, ""); pool6 != "" {
		if cfg.Pool6, err = parsePool6(origin, pool6, cfg.Pool); err != nil {
			return cfg, err
		}
		for _, p := range cfg.PublicOverrides {
			if p.Overlaps(cfg.Pool6) {
				return cfg, fmt.Errorf("%s %s: overlaps the public override %s; want a pool apart from every public override", origin, cfg.Pool6, p)
			}
		}
	}

	ttl, origin := o.single(optDNSMinTTL, defaultDNSMinTTL)
	d, err := time.ParseDuration(ttl)
	if err != nil || d < 0 {
		return cfg, fmt.Errorf("%s %q: want a non-negative duration such as 60s or 5m", origin, ttl)
	}
	cfg.DNSMinTTL = d

	life, origin := o.single(optAttestLife, defaultAttestLife)
	if d, err = time.ParseDuration(life); err != nil || d < 0 || d > 24*time.Hour {
		return cfg, fmt.Errorf("%s %q: want a duration from 0 (no refresh) to 24h, such as 1h or 10m", origin, life)
	}
	cfg.AttestMaxLifetime = d

	pn, origin := o.single(optPreparedNetns, strconv.Itoa(nsmgr.DefaultPrepared))
	if cfg.PreparedNetns, err = strconv.Atoi(pn); err != nil || cfg.PreparedNetns < 0 || cfg.PreparedNetns > 1024 {
		return cfg, fmt.Errorf("%s %q: want a whole number from 0 (none) to 1024", origin, pn)
	}

	hf, origin := o.single(optHeapFloor, strconv.Itoa(gctune.DefaultHeapFloor>>20))
	if cfg.HeapFloorMiB, err = strconv.Atoi(hf); err != nil || cfg.HeapFloorMiB < 0 || cfg.HeapFloorMiB > 4096 {
		return cfg, fmt.Errorf("%s %q: want a whole number of MiB from 0 (none) to 4096", origin, hf)
	}

	ret, origin := o.single(optRetention, defaultRetention)
	if cfg.EventsRetention, err = time.ParseDuration(ret); err != nil || cfg.EventsRetention < 0 {
		return cfg, fmt.Errorf("%s %q: want a non-negative duration such as 24h or 30m", origin, ret)
	}

	ml, origin := o.single(optMetricsListen, "")
	if ml != "" {
		if err := checkListenAddr(ml); err != nil {
			return cfg, fmt.Errorf("%s %q: %v", origin, ml, err)
		}
	}
	cfg.MetricsListen = ml

	lf, origin := o.single(optLogFormat, "")
	switch lf {
	case "":
		lf = "text"
		if getenv("INVOCATION_ID") != "" || getenv("JOURNAL_STREAM") != "" {
			lf = "json"
		}
	case "text", "json":
	default:
		return cfg, fmt.Errorf("%s %q: want text or json", origin, lf)
	}
	cfg.LogFormat = lf

	if r, ok := o.get(optImagesDir); ok {
		for _, v := range r.values {
			if !filepath.IsAbs(v) || filepath.Clean(v) == "/" {
				return cfg, fmt.Errorf("%s %q: want an absolute directory other than /", r.origin, v)
			}
			cfg.ImagesDirs = append(cfg.ImagesDirs, filepath.Clean(v))
		}
	}
	for _, n := range []struct {
		name string
		def  int
		max  int
		dst  *int
	}{
		{optMaxFlows, defaultMaxFlows, 1 << 20, &cfg.MaxFlows},
		{optFlowRate, defaultFlowRate, 1 << 20, &cfg.FlowRate},
		{optMaxAttested, defaultMaxAttest, 1 << 16, &cfg.MaxAttested},
	} {
		v, origin := o.single(n.name, strconv.Itoa(n.def))
		i, err := strconv.Atoi(v)
		if err != nil || i < 1 || i > n.max {
			return cfg, fmt.Errorf("%s %q: want a whole number from 1 to %d", origin, v, n.max)
		}
		*n.dst = i
	}
	return cfg, nil
}

// buildReapConfig validates the three options of reap.
func buildReapConfig(o serveOptions) (prefix, stateDir string, pool netip.Prefix, err error) {
	p, origin := o.single(optNamePrefix, defaultNamePrefix)
	if prefix, err = parseNamePrefix(origin, p); err != nil {
		return
	}
	d, origin := o.single(optStateDir, defaultStateDir)
	if stateDir, err = absPath(origin, d); err != nil {
		return
	}
	c, origin := o.single(optPool, defaultPool)
	pool, err = parsePool(origin, c)
	return
}

func absPath(origin, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%s: empty path", origin)
	}
	a, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s %q: %v", origin, p, err)
	}
	return a, nil
}

// parseNamePrefix accepts what nsmgr.ValidatePrefix accepts, with its text.
func parseNamePrefix(origin, p string) (string, error) {
	if err := nsmgr.ValidatePrefix(p); err != nil {
		return "", fmt.Errorf("%s: %w", origin, err)
	}
	return p, nil
}

// parsePool accepts a CIDR nsmgr.ValidatePool accepts, with its text, so a
// pool the daemon could not use fails here, before any kernel change.
func parsePool(origin, s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s %q: want an IPv4 CIDR such as %s", origin, s, defaultPool)
	}
	if err := nsmgr.ValidatePool(p); err != nil {
		return netip.Prefix{}, fmt.Errorf("%s: %w", origin, err)
	}
	return p, nil
}

// parsePool6 accepts an IPv6 CIDR nsmgr.ValidatePool6 accepts for pool.
func parsePool6(origin, s string, pool netip.Prefix) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s %q: want an IPv6 CIDR such as fd00:20::/112", origin, s)
	}
	if err := nsmgr.ValidatePool6(p, pool); err != nil {
		return netip.Prefix{}, fmt.Errorf("%s: %w", origin, err)
	}
	return p, nil
}

// parseUpstream accepts IP, IP:PORT or [IPv6]:PORT; the port defaults to 53.
func parseUpstream(origin, s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Port() != 0 {
		return ap, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a, 53), nil
	}
	return netip.AddrPort{}, fmt.Errorf("%s %q: want IP or IP:PORT such as 192.0.2.53 or 192.0.2.53:5353", origin, s)
}

// checkListenAddr accepts host:port with a numeric port (host may be empty).
func checkListenAddr(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("want host:port such as 127.0.0.1:9323 or :9323")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return errors.New("want a numeric port 0-65535")
	}
	return nil
}

// resolvConfNameservers returns the nameservers of a resolv.conf, port 53.
func resolvConfNameservers(path string) ([]netip.AddrPort, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("default upstream: %w (set --upstream)", err)
	}
	ups := parseResolvConf(bytes.NewReader(data))
	if len(ups) == 0 {
		return nil, fmt.Errorf("default upstream: %s lists no nameserver (set --upstream)", path)
	}
	return ups, nil
}

func parseResolvConf(r io.Reader) []netip.AddrPort {
	var out []netip.AddrPort
	seen := map[netip.AddrPort]bool{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil {
			continue
		}
		ap := netip.AddrPortFrom(a, 53)
		if !seen[ap] {
			seen[ap] = true
			out = append(out, ap)
		}
	}
	return out
}

// LogValue makes a ServeConfig loggable in one start-up line.
func (c ServeConfig) LogValue() slog.Value {
	ups := make([]string, len(c.Upstreams))
	for i, u := range c.Upstreams {
		ups[i] = u.String()
	}
	ovs := make([]string, len(c.PublicOverrides))
	for i, p := range c.PublicOverrides {
		ovs[i] = p.String()
	}
	sort.Strings(ovs)
	return slog.GroupValue(
		slog.String("config", c.ConfigFile),
		slog.String("socket", c.Socket),
		slog.String("socket_group", c.SocketGroup),
		slog.String("state_dir", c.StateDir),
		slog.String("name_prefix", c.NamePrefix),
		slog.String("pool", c.Pool.String()),
		slog.String("upstreams", strings.Join(ups, ",")),
		slog.String("public_overrides", strings.Join(ovs, ",")),
		slog.Duration("dns_min_ttl", c.DNSMinTTL),
		slog.Duration("attest_max_lifetime", c.AttestMaxLifetime),
		slog.String("metrics_listen", c.MetricsListen),
		slog.String("log_format", c.LogFormat),
		slog.String("images_dirs", strings.Join(c.ImagesDirs, ",")),
		slog.Int("max_flows", c.MaxFlows),
		slog.Int("flow_rate", c.FlowRate),
		slog.Int("max_attested", c.MaxAttested),
		slog.Duration("events_retention", c.EventsRetention),
		slog.Int("prepared_netns", c.PreparedNetns),
		slog.Int("heap_floor_mib", c.HeapFloorMiB),
	)
}
