package integration

// --pin fails closed: a host without a public IPv4 address fails the
// create with one line naming the host, and leaves nothing behind.

import (
	"slices"
	"strings"
	"testing"

	"github.com/enforcerd/enforcerd/api"
)

func TestE2EPinFailsClosed(t *testing.T) {
	e := newE2E(t)
	e.create("control", "--allow", "api.e2e.test") // objects that must stay as they are
	before := e.expectConsistent("before the refused creates")

	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--scope", "https://nov4.e2e.test/login", "--pin"},
			"enforcerd session create: --pin: host nov4.e2e.test has no public IPv4 address; refusing to create the session"},
		{[]string{"--allow", "api.e2e.test", "--allow", "nov4.e2e.test", "--pin"},
			"enforcerd session create: --pin: host nov4.e2e.test has no public IPv4 address; refusing to create the session"},
		{[]string{"--allow", "meta.e2e.test", "--pin"}, // only a special-purpose address
			"enforcerd session create: --pin: host meta.e2e.test has no public IPv4 address; refusing to create the session"},
		{[]string{"--allow", "missing.e2e.test", "--pin"},
			"enforcerd session create: --pin: host missing.e2e.test: no such name (NXDOMAIN)"},
	} {
		for _, mode := range [][]string{{"--rootfs", e.rootfs}, {"--network-only"}} {
			args := append(append([]string{"session", "create", "pinned"}, mode...), tc.args...)
			if msg := e.expectFail(1, args...); msg != tc.msg {
				t.Errorf("enforcerd %s:\n got  %q\n want %q", strings.Join(args, " "), msg, tc.msg)
			}
			if got := e.list(); !slices.EqualFunc(got, before, func(a, b api.SessionInfo) bool { return a.Name == b.Name }) {
				t.Errorf("after a refused --pin create the daemon lists %v", e2eNames(got))
			}
			e.expectObjects(t, "after a refused --pin create", e.expected(before))
		}
	}
	if !e.w.DNS.QueriedName("nov4.e2e.test") {
		t.Error("the pinned host was never resolved upstream")
	}

	// The name is free: the same create with a resolvable host succeeds.
	info := e.create("pinned", "--scope", "https://api.e2e.test/", "--pin")
	if got := info.Policy.Pinned["api.e2e.test"]; !slices.Equal(got, []string{"198.18.1.10"}) {
		t.Errorf("pinned: %v", info.Policy.Pinned)
	}
	e2eExpect(t, e2eHTTP(e.nsPath("pinned"), "198.18.1.10", e2eReach))
	e.expectConsistent("after the pinned create")
}
