package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestNetnsName(t *testing.T) {
	for path, want := range map[string]string{
		"/run/netns/netns-57e0":     "netns-57e0",
		"/var/run/netns/cni-1234":   "cni-1234",
		"/run/netns/":               "",
		"/proc/123/ns/net":          "",
		"/run/netns/sub/x":          "",
		"/var/lib/netns/netns-57e0": "",
	} {
		if got := netnsName(path); got != want {
			t.Errorf("netnsName(%q) = %q, want %q", path, got, want)
		}
	}
}

// ADD writes the netns's resolv.conf naming only the session's resolver;
// DEL removes it and its directory, twice is fine; a file the plugin did
// not write is neither overwritten nor removed.
func TestNetnsResolvConf(t *testing.T) {
	root := t.TempDir()
	const ns = "/run/netns/netns-a"
	if err := writeNetnsResolvConf(root, ns, "s1", "10.20.255.254"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "netns-a", "resolv.conf")
	b, err := os.ReadFile(path)
	want := "# enforcerd-cni session s1: the only resolver this netns can reach\nnameserver 10.20.255.254\n"
	if err != nil || string(b) != want {
		t.Fatalf("resolv.conf = %q, %v; want %q", b, err, want)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("resolv.conf mode: %v %v, want 0644", fi.Mode(), err)
	}
	// (another session's DEL leaves it)
	if err := removeNetnsResolvConf(root, ns, "s2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("another session's DEL removed the file: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := removeNetnsResolvConf(root, ns, "s1"); err != nil {
			t.Errorf("remove #%d: %v", i+1, err)
		}
	}
	if ents, err := os.ReadDir(root); err != nil || len(ents) != 0 {
		t.Errorf("left after remove: %v %v", ents, err)
	}

	// An operator's own file for the netns wins.
	own := filepath.Join(root, "netns-b", "resolv.conf")
	if err := os.MkdirAll(filepath.Dir(own), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(own, []byte("nameserver 192.0.2.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeNetnsResolvConf(root, "/run/netns/netns-b", "s3", "10.20.255.254"); err != nil {
		t.Fatal(err)
	}
	if err := removeNetnsResolvConf(root, "/run/netns/netns-b", "s3"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(own); err != nil || string(b) != "nameserver 192.0.2.1\n" {
		t.Errorf("the operator's file: %q %v", b, err)
	}

	// A netns without an "ip netns" name gets no file.
	if err := writeNetnsResolvConf(root, "/proc/1/ns/net", "s4", "10.20.255.254"); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 1 {
		t.Errorf("a netns without a name got a file: %v", ents)
	}
}
