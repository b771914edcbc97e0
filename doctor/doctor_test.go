package doctor

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

func TestMissingCaps(t *testing.T) {
	for _, tc := range []struct {
		capEff string
		want   []string
	}{
		{"000001ffffffffff", nil},
		{"0000000000001000", []string{"CAP_SYS_ADMIN"}},                  // NET_ADMIN only
		{"0000000000200000", []string{"CAP_NET_ADMIN"}},                  // SYS_ADMIN only
		{"0000000000000000", []string{"CAP_NET_ADMIN", "CAP_SYS_ADMIN"}}, // none
	} {
		got, err := missingCaps("Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t" + tc.capEff + "\n")
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("CapEff %s: got %v, %v; want %v", tc.capEff, got, err, tc.want)
		}
	}
	if _, err := missingCaps("Name:\tx\n"); err == nil {
		t.Error("no CapEff line: no error")
	}
	if _, err := missingCaps("CapEff:\tzz\n"); err == nil || !strings.Contains(err.Error(), "zz") {
		t.Errorf("bad CapEff: %v, want an error naming it", err)
	}
}

func TestHasFilesystem(t *testing.T) {
	list := "nodev\tsysfs\nnodev\ttmpfs\n\text4\nnodev\toverlay\n"
	if !hasFilesystem(list, "overlay") || !hasFilesystem(list, "ext4") || hasFilesystem(list, "btrfs") {
		t.Errorf("hasFilesystem wrong on %q", list)
	}
}

func TestPropagationVerdict(t *testing.T) {
	const (
		root       = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
		runShared  = "25 22 0:23 / /run rw,nosuid shared:5 - tmpfs tmpfs rw\n"
		netnsShare = "30 25 0:23 /netns /run/netns rw shared:7 - tmpfs tmpfs rw\n"
		netnsPriv  = "30 25 0:23 /netns /run/netns rw - tmpfs tmpfs rw\n"
		below      = "31 25 0:4 net:[4026532] /run/netns/x rw shared:5 - nsfs nsfs rw\n"
	)
	for _, tc := range []struct {
		name, mountinfo string
		exists          bool
		status, detail  string
	}{
		{"absent", root + runShared, false, StatusOK, "absent"},
		{"shared mount", root + runShared + netnsShare, true, StatusOK, "is a shared mount point"},
		{"private mount", root + runShared + netnsPriv, true, StatusOK, "serve makes it shared"},
		{"plain dir", root + runShared, true, StatusOK, "not a mount point yet"},
		{"plain dir with netns below", root + runShared + below, true, StatusWarn, "1 netns are mounted below it"},
	} {
		st, detail := propagationVerdict(parseMountinfo(tc.mountinfo), "/run/netns", tc.exists)
		if st != tc.status || !strings.Contains(detail, tc.detail) {
			t.Errorf("%s: %s %q; want %s containing %q", tc.name, st, detail, tc.status, tc.detail)
		}
	}
	if !sharedAt(parseMountinfo(root+runShared), "/run/netns") || sharedAt(parseMountinfo(root+runShared+netnsPriv), "/run/netns") {
		t.Error("sharedAt: wrong mount chosen")
	}
}

func TestPoolVerdict(t *testing.T) {
	pool := netip.MustParsePrefix("10.20.0.0/16")
	np := func(s, what string) namedPrefix { return namedPrefix{netip.MustParsePrefix(s), what} }
	for _, tc := range []struct {
		name           string
		hn             hostNet
		status, detail string
	}{
		{"nothing", hostNet{}, StatusOK, "overlaps no address or route"},
		{"elsewhere", hostNet{addrs: []namedPrefix{np("192.168.1.5/24", "link eth0")}, routes: []namedPrefix{np("192.168.1.0/24", "link eth0")}}, StatusOK, "overlaps no"},
		{"address inside", hostNet{addrs: []namedPrefix{np("10.20.3.1/24", "link dummy0")}}, StatusFail,
			"pool 10.20.0.0/16 holds the host's address 10.20.3.1/24 (link dummy0); choose another --pool"},
		{"route inside", hostNet{routes: []namedPrefix{np("10.20.8.0/22", "link wg0")}}, StatusFail,
			"pool 10.20.0.0/16 holds the host's route to 10.20.8.0/22 (link wg0); choose another --pool"},
		{"route equal", hostNet{routes: []namedPrefix{np("10.20.0.0/16", "link wg0")}}, StatusFail, "route to 10.20.0.0/16"},
		{"route wider", hostNet{routes: []namedPrefix{np("10.0.0.0/8", "link tun0")}}, StatusWarn, "inside the host's route to 10.0.0.0/8 (link tun0)"},
	} {
		st, detail := poolVerdict(pool, tc.hn)
		if st != tc.status || !strings.Contains(detail, tc.detail) {
			t.Errorf("%s: %s %q; want %s containing %q", tc.name, st, detail, tc.status, tc.detail)
		}
	}
}

func forwardChain(family nftables.TableFamily, table, name string, policy nftables.ChainPolicy) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: &nftables.Table{Name: table, Family: family},
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Type: nftables.ChainTypeFilter, Policy: &policy}
}

func TestForwardFirewall(t *testing.T) {
	dropAll := &nftables.Rule{Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}}
	acceptOurs := &nftables.Rule{Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("enf")},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}}
	dropSome := &nftables.Rule{Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("eth9\x00")},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}}
	rejectAll := &nftables.Rule{Exprs: []expr.Any{&expr.Counter{}, &expr.Target{Name: "REJECT"}}}
	for _, tc := range []struct {
		name           string
		chain          *nftables.Chain
		rules          []*nftables.Rule
		status, detail string
	}{
		{"accepting chain", forwardChain(nftables.TableFamilyINet, "fw", "forward", nftables.ChainPolicyAccept), []*nftables.Rule{dropSome}, StatusOK, "no other table"},
		{"iptables-nft policy drop", forwardChain(nftables.TableFamilyIPv4, "filter", "FORWARD", nftables.ChainPolicyDrop), nil, StatusFail,
			"table ip filter chain FORWARD (iptables-nft) has policy drop: it drops the sessions' forwarded traffic after enforcerd's table accepted it; accept traffic from and to enf* interfaces there"},
		{"unconditional drop", forwardChain(nftables.TableFamilyINet, "fw", "fwd", nftables.ChainPolicyAccept), []*nftables.Rule{dropAll}, StatusFail, "table inet fw chain fwd has an unconditional drop rule"},
		{"unconditional reject", forwardChain(nftables.TableFamilyIPv4, "filter", "FORWARD", nftables.ChainPolicyAccept), []*nftables.Rule{rejectAll}, StatusFail, "unconditional drop rule"},
		{"policy drop accepting ours", forwardChain(nftables.TableFamilyIPv4, "filter", "FORWARD", nftables.ChainPolicyDrop), []*nftables.Rule{acceptOurs}, StatusWarn, "a rule names enf* interfaces"},
	} {
		var drops []forwardDrop
		if d, ok := judgeForward(tc.chain, tc.rules, "enf"); ok {
			drops = append(drops, d)
		}
		st, detail := forwardVerdict(drops, "enf")
		if st != tc.status || !strings.Contains(detail, tc.detail) {
			t.Errorf("%s: %s %q; want %s containing %q", tc.name, st, detail, tc.status, tc.detail)
		}
	}
	if isForwardChain(&nftables.Chain{Name: "x", Table: &nftables.Table{Family: nftables.TableFamilyBridge}, Hooknum: nftables.ChainHookForward}) {
		t.Error("a bridge-family chain judged as the IPv4 forward path")
	}
	if isForwardChain(&nftables.Chain{Name: "x", Table: &nftables.Table{Family: nftables.TableFamilyINet}}) {
		t.Error("a regular chain judged as a base chain")
	}
}

func TestDatapathVerdict(t *testing.T) {
	ok := nft.Counters{AcceptedPackets: 2}
	drop := nft.Counters{DroppedPackets: 1}
	if _, err := datapathVerdict(ok, drop, true); err != nil {
		t.Errorf("both moved: %v", err)
	}
	for _, tc := range []struct {
		name      string
		a, b      nft.Counters
		delivered bool
		want      string
	}{
		{"nothing accepted", nft.Counters{}, drop, false, "the accepted counter did not move"},
		{"accepted, not delivered", ok, drop, false, "accepted (2 packets) but never delivered"},
		{"nothing dropped", ok, nft.Counters{}, true, "the dropped counter did not move"},
		{"denied accepted", ok, nft.Counters{DroppedPackets: 1, AcceptedPackets: 1}, true, "1 packets the policy denies were accepted"},
	} {
		_, err := datapathVerdict(tc.a, tc.b, tc.delivered)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestReportFatalFailure(t *testing.T) {
	r := Report{
		{Name: CheckRoot, Status: StatusOK, Fatal: true},
		{Name: CheckUpstreams, Status: StatusFail},
		{Name: CheckForeignLinks, Status: StatusFail, Fatal: true, Detail: "link enfx"},
		{Name: CheckPoolOverlap, Status: StatusFail, Fatal: true},
	}
	if !r.Failed() {
		t.Error("Failed: false")
	}
	if c, ok := r.FatalFailure(); !ok || c.Name != CheckForeignLinks {
		t.Errorf("FatalFailure: %v %v, want foreign-links", c, ok)
	}
	if _, ok := r[:2].FatalFailure(); ok {
		t.Error("a non-fatal failure reported as fatal")
	}
	if (Report{{Name: CheckOverlay, Status: StatusWarn}}).Failed() {
		t.Error("a warning counted as a failure")
	}
}

// Every check serve refuses on is one of the checks the issue names as
// making enforcement impossible; the list is the contract of serve's start.
func TestFatalChecks(t *testing.T) {
	var fatal []string
	for _, c := range doctorChecks() {
		if c.fatal {
			fatal = append(fatal, c.name)
		}
	}
	want := []string{CheckRoot, CheckNetnsVeth, CheckNftables, CheckProcSysNet, CheckForeignLinks, CheckPoolOverlap}
	if !slices.Equal(fatal, want) {
		t.Errorf("fatal checks %v, want %v", fatal, want)
	}
}
