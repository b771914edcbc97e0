package integration

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// TestNetpolicyDualStackTableReadsAsDocumented: a dual-stack table, as nft
// prints it, holds the v6 rules docs/network-model.md shows (anti-spoofing
// by interface and v6 source, the guest's RAs dropped, on-link ND only,
// ND never forwarded, the v6 guard, ICMPv6 admin-prohibited, NAT66), and a
// session's v6 elements (its interface with its ::2, a v6 literal with its
// port; under the name check, its guest6 in namecheck6) are keyed by its
// v6 address, and the name check's v6 rules queue and answer its flows;
// with the refresh on, an attested6 hit refreshes its live element, which
// admits through the name check too (refresh6.go).
func TestNetpolicyDualStackTableReadsAsDocumented(t *testing.T) {
	world.RequireTool(t, "nft")
	w := world.New(t)
	prefix := "t" + w.ID[:4]
	cfg := dualStackFirewallConfig(t, w, prefix)
	cfg.AttestMaxLifetime = 10 * time.Minute
	fw, guard := openEnsured(t, cfg, true), cfg.Guard
	lit, err := netpolicy.ParseEntry("[2001:2:0:1::11]:7/tcp", guard)
	if err != nil {
		t.Fatal(err)
	}
	r := nft.SessionRules{Name: "d6", HostIface: prefix + "0h", Guest: netip.MustParseAddr("10.20.0.2"), Egress: netpolicy.ModeAllowlist,
		Static: []netpolicy.Target{{Prefix: lit.Prefix, Port: lit.Port, Proto: lit.Proto}}, OnDeny: netpolicy.DenyReject,
		NameCheck: true, QUICCheck: true}
	if err := fw.AddSession(r); err != nil {
		t.Fatal(err)
	}
	got := run(t, "ip", "netns", "exec", w.HostName, "nft", "list", "table", "inet", prefix)
	for _, want := range []string{
		`iifname "` + prefix + `*" meta nfproto ipv6 goto raw_session6`,
		`icmpv6 type nd-router-advert drop`,
		`icmpv6 type nd-redirect drop`,
		`exthdr rt exists drop`,
		`icmpv6 type nd-neighbor-solicit ip6 hoplimit 255 ip6 saddr fe80::2 accept`,
		`icmpv6 type nd-neighbor-advert ip6 hoplimit 255 ip6 saddr fe80::2 accept`,
		`icmpv6 type nd-neighbor-solicit ip6 hoplimit 255 ip6 saddr :: accept`,
		`iifname . ip6 saddr != @sessions6 goto drop_spoofed6`,
		`ip6 daddr @blocked6 goto drop_special6`,
		`ip6 saddr vmap @budget_chains6`,
		`ip6 saddr vmap @grant_chains6`,
		`goto drop_not_allowed6`,
		`meta nfproto ipv6 meta mark != 0x00000000 update @acct_reason { meta mark . 0x00000003 }`,
		`log prefix "` + prefix + `:special-purpose"`,
		`ip6 saddr @reject6 reject with icmpv6 admin-prohibited`,
		`ip6 saddr @reset6 meta l4proto tcp reject with tcp reset`,
		`ip6 saddr fd00:20::/112 oifname != "` + prefix + `*" masquerade`,
		`"` + prefix + `0h" . fd00:20::2`,
		`fd00:20::2 . tcp . 2001:2:0:1::11 . 7`,
		`ct count over`,
		// The name check over v6 (namecheck6.go): the server's packets
		// and the guest's of a pending flow queued, a refused flow
		// answered, name-admitted flows marked pending.
		`oifname "` + prefix + `*" meta nfproto ipv6 ct mark 0x6e630001 goto name_queue`,
		`meta nfproto ipv6 ct mark 0x6e630003 goto drop_name6`,
		`ip6 saddr . ip6 daddr @attested6 goto accept_named6`,
		`ip6 saddr @namecheck6_public goto accept_named6`,
		`meta l4proto tcp ip6 saddr @namecheck6 ct mark set 0x6e630001`,
		`udp dport 443 ip6 saddr @namecheck6_quic ct mark set 0x6e630001`,
		`udp dport 443 ip6 saddr @namecheck6 goto drop_quic6`,
		`ip6 saddr @reject6 meta l4proto tcp reject with tcp reset`,
		// The refresh of attested6 elements (refresh6.go).
		`ip6 saddr . ip6 daddr @attested6 update @attested6_live { ip6 saddr . ip6 daddr timeout `,
		`ip6 saddr . ip6 daddr @attested6_live update @attested6_live { ip6 saddr . ip6 daddr timeout `,
		`ip6 saddr . meta l4proto . ip6 daddr . th dport @attested6_ports update @attested6_ports_live { ip6 saddr . meta l4proto . ip6 daddr . th dport timeout `,
		`ip6 saddr . meta l4proto . ip6 daddr . th dport @attested6_ports goto accept_named6`,
		`ip6 saddr . meta l4proto . ip6 daddr . th dport @attested6_ports_live update @attested6_ports_live { ip6 saddr . meta l4proto . ip6 daddr . th dport timeout `,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	// A live hit alone admits, refreshes, and goes through the name check.
	for _, live := range []string{"attested6_live", "attested6_ports_live"} {
		re := regexp.MustCompile(`@` + live + ` update @` + live + ` \{ [^}]* timeout \d+s \} goto accept_named6`)
		if !re.MatchString(got) {
			t.Errorf("table lacks a rule matching %s", re)
		}
	}
	// from_session6 drops every ND type: never forwarded.
	if !strings.Contains(got, "icmpv6 type nd-neighbor-advert drop") {
		t.Error("from_session6 does not drop ND (nd-neighbor-advert drop missing)")
	}
	if t.Failed() {
		t.Logf("nft list table inet %s:\n%s", prefix, got)
	}
	if err := fw.RemoveSession(r); err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{"sessions6", "namecheck6", "namecheck6_quic"} {
		if after := run(t, "ip", "netns", "exec", w.HostName, "nft", "list", "set", "inet", prefix, set); strings.Contains(after, "fd00:20::2") {
			t.Errorf("%s keeps the removed session's element:\n%s", set, after)
		}
	}
}
