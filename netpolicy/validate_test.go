package netpolicy

import (
	"net/netip"
	"testing"
)

func TestParseMode(t *testing.T) {
	for _, m := range []Mode{ModeNone, ModeAllowlist, ModePublic} {
		if got, err := ParseMode(string(m)); err != nil || got != m {
			t.Errorf("ParseMode(%q) = %q, %v", m, got, err)
		}
	}
	for _, s := range []string{"", "Public", "all"} {
		_, err := ParseMode(s)
		if want := `egress mode "` + s + `": want none, allowlist or public`; err == nil || err.Error() != want {
			t.Errorf("ParseMode(%q) = %v, want %q", s, err, want)
		}
	}
}

func TestPolicyValidate(t *testing.T) {
	host := MustParseEntry("api.example.com:443")
	cidr := MustParseEntry("8.8.8.0/24")
	tests := []struct {
		name string
		p    Policy
		want string
	}{
		{"none", Policy{Egress: ModeNone}, ""},
		{"empty allowlist allows nothing but is valid", Policy{Egress: ModeAllowlist}, ""},
		{"allowlist", Policy{Egress: ModeAllowlist, Allow: []Entry{host, cidr}, LabPeers: []string{"lab"}}, ""},
		{"public with redundant entries", Policy{Egress: ModePublic, Allow: []Entry{host}}, ""},
		{"lab target", Policy{Egress: ModeAllowlist, Lab: true}, ""},
		{"unknown mode", Policy{Egress: "open"}, `egress mode "open": want none, allowlist or public`},
		{"empty mode", Policy{}, `egress mode "": want none, allowlist or public`},
		{"none with entries", Policy{Egress: ModeNone, Allow: []Entry{host, cidr}},
			"egress none takes no allow entries (got 2); use allowlist or public"},
		{"none with peers", Policy{Egress: ModeNone, LabPeers: []string{"x"}},
			"egress none takes no lab peers (got 1); a session without a network cannot reach a peer"},
		{"none as lab", Policy{Egress: ModeNone, Lab: true},
			"egress none cannot be a lab target; a session without a network cannot be reached"},
		{"bad peers", Policy{Egress: ModeAllowlist, LabPeers: []string{"a", "", "a"}},
			"lab peer: empty session name\nlab peer \"a\": listed twice"},
		{"hand-built bad entries", Policy{Egress: ModeAllowlist, Allow: []Entry{
			{Kind: KindHost, Name: "Upper.com"},
			{Kind: KindCIDR, Prefix: netip.MustParsePrefix("8.8.8.8/24")},
			{Kind: KindHost, Name: "a.com", PortSpec: PortSpec{Proto: ProtoTCP}},
			{Kind: KindHost, Name: "a.com", PortSpec: PortSpec{Port: 1, Proto: "sctp"}},
			{Kind: EntryKind(9), Name: "a.com"},
		}}, `allow entry "Upper.com": malformed name entry; build entries with ParseEntry` + "\n" +
			`allow entry "8.8.8.8/24": malformed CIDR entry` + "\n" +
			`allow entry "a.com": protocol "tcp" without a port` + "\n" +
			`allow entry "a.com:1/sctp": unknown protocol "sctp"; want tcp or udp` + "\n" +
			`allow entry "": unknown entry kind 9`},
	}
	for _, tt := range tests {
		err := tt.p.Validate()
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("%s: Validate()\n got: %s\nwant: %s", tt.name, got, tt.want)
		}
	}
}
