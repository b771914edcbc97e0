package nsmgr

import (
	"strings"
	"testing"
)

// A pool entry's name carries the prefix, is never a session's netns name
// (of this prefix or of one that extends it), and is recognised only for
// its own prefix.
func TestPreparedNames(t *testing.T) {
	a, b := preparedName("enf"), preparedName("enf")
	if a == b || !strings.HasPrefix(a, "enf-pool_") {
		t.Fatalf("preparedName = %q, %q: want two distinct enf-pool_ names", a, b)
	}
	for _, prefix := range []string{"enf", "en", "enf2"} {
		if s, ok := parseNetnsName(prefix, a); ok {
			t.Errorf("parseNetnsName(%q, %q) = session %q: a pool entry taken for a session", prefix, a, s)
		}
	}
	for _, c := range []struct {
		prefix, name string
		want         bool
	}{
		{"enf", a, true},
		{"en", a, false},
		{"enf2", a, false},
		{"enf", "enf2-pool_1_2", false},
		{"enf", "enf-pool_", false},
		{"enf", "enf-pool_1_x", false},
		{"enf", "enf-pool", false}, // a session named "pool"
		{"enf", "enf-pool-1", false},
	} {
		if got := isPreparedName(c.prefix, c.name); got != c.want {
			t.Errorf("isPreparedName(%q, %q) = %v, want %v", c.prefix, c.name, got, c.want)
		}
	}
}
