package nsmgr

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netns"
)

func TestNewValidatesConfig(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{Prefix: "Bad", HostNS: netns.None()},
			`invalid prefix "Bad": character 'B' not allowed; want 1 to 6 characters of a-z and 0-9, starting with a letter`},
		{Config{Prefix: "enf", Pool: netip.MustParsePrefix("10.20.0.0/30"), HostNS: netns.None()},
			"invalid pool 10.20.0.0/30: smaller than /28, the smallest pool (3 session /30s beside the reserved DNS /30); want an IPv4 prefix between /8 and /28"},
		{Config{Prefix: "enf", HostNS: netns.None()},
			"nsmgr config: HostNS is not an open netns handle"},
		{Config{Prefix: "enf"}, // HostNS left at its zero value
			"nsmgr config: HostNS is not an open netns handle"},
	}
	for _, tt := range tests {
		m, err := New(tt.cfg)
		if err == nil {
			m.Close()
		}
		if err == nil || err.Error() != tt.want {
			t.Errorf("New(%+v) = %v, want %q", tt.cfg, err, tt.want)
		}
	}
}
