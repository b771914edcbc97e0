package integration

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestE2EPreparedNetns: with --prepared-netns 3 the daemon keeps three
// netns of its own made ahead of demand; a session created from the pool
// resolves and reaches what its policy allows and nothing else, a claimed
// netns leaves the pool, which refills; a graceful stop removes the pool.
// The default (0) keeps none, which every other e2e test checks.
func TestE2EPreparedNetns(t *testing.T) {
	e := newE2E(t, "--prepared-netns", "3")
	own := fmt.Sprintf("%s-pool_%d_", e.d.Prefix, e.d.PID())
	waitPrepared := func(want int) []string {
		t.Helper()
		var got []string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if got = e2ePrepared(t, e.d.Prefix); len(got) == want {
				break
			}
		}
		if len(got) != want {
			t.Fatalf("prepared netns %v, want %d of them", got, want)
		}
		for _, n := range got {
			if !strings.HasPrefix(n, own) {
				t.Fatalf("prepared netns %s is not the daemon's (%s*)", n, own)
			}
		}
		return got
	}
	before := waitPrepared(3)
	e.createNetOnly("p1", "--allow", "api.e2e.test")
	e.createNetOnly("p2", "--allow", "docs.e2e.test")
	after := waitPrepared(3) // refilled
	claimed := 0
	for _, n := range before {
		if !slices.Contains(after, n) {
			claimed++
		}
	}
	if claimed != 2 {
		t.Errorf("pool before %v, after two creates %v: want the two oldest claimed", before, after)
	}
	e.resolveTo("p1", "api.e2e.test", "198.18.1.10")
	e2eExpect(t, e2eTCP(e.nsPath("p1"), "198.18.1.10:7", e2eReach), e2eTCP(e.nsPath("p1"), "198.18.1.11:7", e2eRejected))
	e.expectConsistent("with two sessions and the pool")
	if err := e.d.Stop(); err != nil {
		t.Fatal(err)
	}
	if left := e2ePrepared(t, e.d.Prefix); len(left) > 0 {
		t.Fatalf("prepared netns left after a graceful stop: %v", left)
	}
}
