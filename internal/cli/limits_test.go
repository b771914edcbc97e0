package cli

import (
	"path/filepath"
	"testing"
)

func TestParseByteSize(t *testing.T) {
	ok := map[string]uint64{
		"1": 1, "1048576": 1 << 20, "100B": 100, "100b": 100,
		"50MB": 50_000_000, "50M": 50_000_000, "50mb": 50_000_000, "50 MB": 50_000_000,
		"50MiB": 50 << 20, "50Mi": 50 << 20, "50mib": 50 << 20,
		"512k": 512_000, "512KB": 512_000, "512KiB": 512 << 10,
		"2G": 2_000_000_000, "2GiB": 2 << 30, "1T": 1_000_000_000_000, "1TiB": 1 << 40,
	}
	for in, want := range ok {
		got, err := parseByteSize(in)
		if err != nil || got != want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "0MB", "MB", "-1", "1.5G", "12X", "5PB", "10iB", "1Mx", "99999999999999999999", "20000000TiB"} {
		if _, err := parseByteSize(in); err == nil || err.Error() != errByteSize.Error() {
			t.Errorf("parseByteSize(%q): %v, want %v", in, err, errByteSize)
		}
	}
}

// TestCLILimitFlags: the flags' errors are one line naming the bad value,
// on create and on update.
func TestCLILimitFlags(t *testing.T) {
	const sizeWant = "want a whole number of bytes, at least 1, with an optional unit: 50MB (50,000,000), 50MiB (52,428,800), 2G, 512k or 1048576"
	const connWant = "want a whole number of connections from 1 to 16777216"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"session", "create", "s1", "--network-only", "--allow", "192.0.2.1", "--connections", "0"}, `enforcerd session create: invalid value "0" for flag --connections: ` + connWant},
		{[]string{"session", "create", "s1", "--network-only", "--allow", "192.0.2.1", "--connections", "three"}, `enforcerd session create: invalid value "three" for flag --connections: ` + connWant},
		{[]string{"session", "create", "s1", "--network-only", "--allow", "192.0.2.1", "--connections", "16777217"}, `enforcerd session create: --connections 16777217: ` + connWant},
		{[]string{"session", "create", "s1", "--network-only", "--allow", "192.0.2.1", "--budget", "50XB"}, `enforcerd session create: invalid value "50XB" for flag --budget: ` + sizeWant},
		{[]string{"session", "create", "s1", "--network-only", "--egress-budget", "0"}, `enforcerd session create: invalid value "0" for flag --egress-budget: ` + sizeWant},
		{[]string{"session", "update", "s1", "--allow", "192.0.2.1", "--connections", "-1"}, `enforcerd session update: invalid value "-1" for flag --connections: ` + connWant},
		{[]string{"session", "update", "s1", "--egress-budget", "1.5GB"}, `enforcerd session update: invalid value "1.5GB" for flag --egress-budget: ` + sizeWant},
	} {
		c := newTestCLI(t)
		c.env["ENFORCERD_SOCKET"] = filepath.Join(t.TempDir(), "nobody.sock")
		if code := c.run(tc.args...); code != ExitUsage {
			t.Errorf("enforcerd %v: exit %d, want 2 (stderr %q)", tc.args, code, c.errOut.String())
		}
		if got := c.errOut.String(); got != tc.want+"\n" {
			t.Errorf("enforcerd %v:\n got  %q\n want %q", tc.args, got, tc.want+"\n")
		}
	}
}
