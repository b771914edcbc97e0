package netpolicy

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
)

func targetStrings(ts []Target) []string {
	var out []string
	for _, t := range ts {
		s := t.Prefix.String()
		if t.Port != 0 {
			s += fmt.Sprintf(":%d", t.Port)
			if t.Proto != ProtoAny {
				s += "/" + string(t.Proto)
			}
		}
		out = append(out, s)
	}
	return out
}

func policyOf(mode Mode, entries ...string) Policy {
	p := Policy{Egress: mode}
	for _, s := range entries {
		p.Allow = append(p.Allow, MustParseEntry(s))
	}
	return p
}

func TestStaticTargets(t *testing.T) {
	a := netip.MustParseAddr
	pinned := map[string][]netip.Addr{
		"api.example.com":    {a("93.184.216.34"), a("::ffff:93.184.216.35"), a("2606:2800::1")},
		"www.example.com":    {a("93.184.216.40")},
		"deep.a.example.com": {a("93.184.216.50")},
		"other.org":          {a("1.1.1.1")},
	}
	tests := []struct {
		name string
		p    Policy
		want []string
	}{
		{"none has nothing", policyOf(ModeNone), nil},
		{"cidrs", policyOf(ModeAllowlist, "8.8.8.0/24", "1.2.3.4:53/udp"), []string{"1.2.3.4/32:53/udp", "8.8.8.0/24"}},
		{"pinned exact name with its port", policyOf(ModeAllowlist, "api.example.com:443"),
			[]string{"93.184.216.34/32:443", "93.184.216.35/32:443"}},
		{"pinned under wildcards", policyOf(ModeAllowlist, "*.example.com:443/tcp", "**.example.com:80"),
			[]string{"93.184.216.34/32:80", "93.184.216.34/32:443/tcp", "93.184.216.35/32:80", "93.184.216.35/32:443/tcp",
				"93.184.216.40/32:80", "93.184.216.40/32:443/tcp", "93.184.216.50/32:80"}},
		{"covered targets dropped", policyOf(ModeAllowlist, "93.184.216.0/24", "api.example.com:443", "8.8.8.8:53/udp", "8.8.8.8:53", "8.8.8.8:53"),
			[]string{"8.8.8.8/32:53", "93.184.216.0/24"}},
		{"tcp and udp of one port kept apart", policyOf(ModeAllowlist, "8.8.8.8:53/udp", "8.8.8.8:53/tcp"),
			[]string{"8.8.8.8/32:53/tcp", "8.8.8.8/32:53/udp"}},
		// A port-less entry never opens 53 or 853 (the resolver chain
		// reads port entries only): an entry naming one is kept beside it.
		{"resolver ports beside a port-less cover", policyOf(ModeAllowlist, "9.9.9.9", "9.9.9.9:53", "9.9.9.0/24:853/tcp", "9.9.9.0/24", "9.9.9.9:80"),
			[]string{"9.9.9.0/24", "9.9.9.0/24:853/tcp", "9.9.9.9/32:53"}},
		{"public keeps its targets", policyOf(ModePublic, "8.8.8.0/24"), []string{"8.8.8.0/24"}},
		{"unpinned names give nothing", policyOf(ModeAllowlist, "nothing.example.net"), nil},
	}
	for _, tt := range tests {
		got := targetStrings(StaticTargets(tt.p, pinned))
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: StaticTargets =\n%v\nwant\n%v", tt.name, got, tt.want)
		}
	}
}

func TestExpandProto(t *testing.T) {
	in := []Target{
		{Prefix: netip.MustParsePrefix("8.8.8.0/24"), Port: 53},
		{Prefix: netip.MustParsePrefix("8.8.8.8/32"), Port: 53, Proto: ProtoUDP}, // covered by the /24's udp half
		{Prefix: netip.MustParsePrefix("9.9.9.9/32")},
	}
	got := targetStrings(ExpandProto(in))
	want := []string{"8.8.8.0/24:53/tcp", "8.8.8.0/24:53/udp", "9.9.9.9/32"}
	if !slices.Equal(got, want) {
		t.Errorf("ExpandProto = %v, want %v", got, want)
	}
}
