package container

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"testing"
)

func TestValidateConfig(t *testing.T) {
	ok := Config{StateDir: "/s", LayerDir: "/l", Prefix: "enf"}
	tests := []struct {
		mod  func(*Config)
		want string
	}{
		{func(*Config) {}, ""},
		{func(c *Config) { c.InitPath = "/proc/self/exe"; c.InitArgs = []string{"init"} }, ""},
		{func(c *Config) { c.StateDir = "rel" }, `state dir "rel": not an absolute path; want an absolute directory`},
		{func(c *Config) { c.LayerDir = "" }, `layer dir "": not an absolute path; want an absolute directory`},
		{func(c *Config) { c.Prefix = "Enf" }, `prefix "Enf": use 1 to 16 lower-case letters and digits`},
		{func(c *Config) { c.Prefix = "e-f" }, `prefix "e-f": use 1 to 16 lower-case letters and digits`},
		{func(c *Config) { c.Prefix = "" }, `prefix "": use 1 to 16 lower-case letters and digits`},
		{func(c *Config) { c.InitPath = "/usr/bin/enforcerd" }, `init path "/usr/bin/enforcerd": libcontainer always re-executes /proc/self/exe; leave it empty`},
		{func(c *Config) { c.InitArgs = []string{"boot"} }, `init args ["boot"]: libcontainer always passes "init"; leave them empty`},
	}
	for i, tt := range tests {
		c := ok
		tt.mod(&c)
		if got := errString(validateConfig(c)); got != tt.want {
			t.Errorf("%d: got %q, want %q", i, got, tt.want)
		}
	}
}

func TestValidateSpec(t *testing.T) {
	ok := Spec{Name: "s1", Rootfs: "/img"}
	tests := []struct {
		mod  func(*Spec)
		want string
	}{
		{func(*Spec) {}, ""},
		{func(s *Spec) { s.Name = "-x" }, `sandbox name "-x": use 1 to 32 of [a-z0-9-], starting with a letter or digit`},
		{func(s *Spec) { s.Name = "S1" }, `sandbox name "S1": use 1 to 32 of [a-z0-9-], starting with a letter or digit`},
		{func(s *Spec) { s.Name = strings.Repeat("a", 33) }, `sandbox name "` + strings.Repeat("a", 33) + `": use 1 to 32 of [a-z0-9-], starting with a letter or digit`},
		{func(s *Spec) { s.Rootfs = "img" }, `rootfs "img": not an absolute path; want the image directory's absolute path`},
		{func(s *Spec) { s.NetnsPath = "enf-s1" }, `netns path "enf-s1": not an absolute path; want e.g. /run/netns/NAME`},
		{func(s *Spec) { s.MemoryBytes = 1 << 20 }, `memory 1048576 bytes: want at least 4 MiB (4194304 bytes); leave it out for the default 512 MiB`},
		{func(s *Spec) { s.CPUs = -2 }, fmt.Sprintf("cpus -2: want 0.01 to %d (the CPUs of this machine); leave it out for the default 1", runtime.NumCPU())},
		{func(s *Spec) { s.PidsMax = 2 }, `pids 2: want at least 4; leave it out for the default 1024`},
		{func(s *Spec) { s.Hostname = "a b" }, `hostname "a b": use at most 64 letters, digits, '-', '_' and dots`},
		{func(s *Spec) { s.DNS = netip.MustParseAddr("fe80::1%eth0") }, `dns address fe80::1%eth0: zoned addresses are not accepted`},
		{func(s *Spec) { s.ExtraCaps = []string{"nope"} }, `capability "nope": unknown; use a Linux capability name such as CAP_NET_RAW`},
		{func(s *Spec) { s.Hosts = map[string][]netip.Addr{"a b": nil} }, `pinned host "a b": not a DNS name; use letters, digits, '-', '_' and dots`},
	}
	for i, tt := range tests {
		s := ok
		tt.mod(&s)
		if got := errString(validateSpec(s)); got != tt.want {
			t.Errorf("%d: got %q, want %q", i, got, tt.want)
		}
	}
}

func TestParseUser(t *testing.T) {
	tests := []struct {
		in       string
		uid, gid int
		err      string
	}{
		{"", 0, 0, ""},
		{"0", 0, 0, ""},
		{"1000", 1000, 1000, ""},
		{"1000:50", 1000, 50, ""},
		{"root", 0, 0, `user "root": use numeric uid[:gid]`},
		{"1:", 0, 0, `user "1:": use numeric uid[:gid]`},
		{"-1", 0, 0, `user "-1": use numeric uid[:gid]`},
		{"1:2:3", 0, 0, `user "1:2:3": use numeric uid[:gid]`},
	}
	for _, tt := range tests {
		uid, gid, err := parseUser(tt.in)
		if errString(err) != tt.err || (err == nil && (uid != tt.uid || gid != tt.gid)) {
			t.Errorf("parseUser(%q) = %d, %d, %v; want %d, %d, %q", tt.in, uid, gid, err, tt.uid, tt.gid, tt.err)
		}
	}
}

func TestExecEnv(t *testing.T) {
	got, err := execEnv([]string{"A=1", "PATH=/bin"}, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"A=1", "PATH=/bin", "HOME=/root", "TERM=xterm", "LANG=C.UTF-8"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	got, _ = execEnv(nil, 1000, false)
	if want := []string{"PATH=" + defaultPath, "HOME=/tmp", "TERM=xterm", "LANG=C.UTF-8"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	// A read-only root whose image has no /root: the tmpfs.
	got, _ = execEnv(nil, 0, true)
	if want := []string{"PATH=" + defaultPath, "HOME=/tmp", "TERM=xterm", "LANG=C.UTF-8"}; !slices.Equal(got, want) {
		t.Errorf("no root home: got %v, want %v", got, want)
	}
	for _, bad := range []string{"NOVALUE", "=x", "A=\x00"} {
		if _, err := execEnv([]string{bad}, 0, false); errString(err) != fmt.Sprintf("env %q: use KEY=VALUE", bad) {
			t.Errorf("execEnv(%q): %v", bad, err)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
