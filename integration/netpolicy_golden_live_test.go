package integration

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
	"github.com/enforcerd/enforcerd/netpolicy"
)

// update rewrites the golden files instead of comparing with them:
// go test -tags seccomp -run TestNetpolicyTableGolden ./integration/ -update
var update = flag.Bool("update", false, "rewrite the golden files of the live tests")

const nftTableGolden = "testdata/nft_table.golden"

// TestNetpolicyTableGolden: the whole table, as `nft list table` prints it,
// is the golden text: every chain, rule, set and element, with what
// differs between runs (prefix, pool, DNS address, interfaces, guest
// addresses, timeouts, counters, handles) replaced by placeholders. An
// unexpected extra rule, a lost one, or an element of the wrong shape fails
// it. The sessions cover each mode and entry kind: allowlist with a host,
// a CIDR and a port-constrained entry and attested addresses with and
// without ports, public, a lab target and its peer, and egress none (no
// NIC: nothing in the table). Adding them changes the sets only: the chains
// of the empty table and the full one are the same text. The public
// override (198.18.0.0/15, the world's internet) must not be in the blocked
// set, and is not in the golden. The text is nft's (checked with nft
// 1.0.6): a release that prints rules differently needs -update, the diff
// read first.
func TestNetpolicyTableGolden(t *testing.T) {
	world.RequireTool(t, "nft")
	e := newNPEnv(t, time.Second)
	w := e.w
	list := func() string {
		return run(t, "ip", "netns", "exec", w.HostName, "nft", "list", "table", "inet", e.prefix)
	}
	empty := list()

	allow, _ := e.session(t, "allow", netpolicy.ModeAllowlist, []netpolicy.Target{
		staticHost(w.Web[0]),
		{Prefix: netip.MustParsePrefix("198.18.2.0/24")},
		{Prefix: netip.MustParsePrefix("198.18.3.0/24"), Port: 443, Proto: netpolicy.ProtoTCP},
		{Prefix: netip.PrefixFrom(w.Web[1], 32), Port: 53, Proto: netpolicy.ProtoUDP},
	})
	if _, err := e.fw.Attest(allow.Guest, world.PublicAddrs(1), time.Hour, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fw.Attest(allow.Guest, world.PublicAddrs(2)[1:], time.Hour, []netpolicy.PortSpec{{Port: 8443, Proto: netpolicy.ProtoTCP}}); err != nil {
		t.Fatal(err)
	}
	public, _ := e.session(t, "public", netpolicy.ModePublic, nil)
	lab, _ := e.session(t, "lab", netpolicy.ModeAllowlist, nil)
	peer, _ := e.session(t, "peer", netpolicy.ModeAllowlist, nil, lab.Guest)
	e.session(t, "none", netpolicy.ModeNone, nil)
	full := list()

	chainsOf := func(s string) string { return s[strings.Index(s, "chain "):] }
	if chainsOf(empty) != chainsOf(full) {
		t.Errorf("adding sessions changed the chains:\n%s", lineDiff(chainsOf(empty), chainsOf(full)))
	}

	r := strings.NewReplacer(
		// Longest first: a guest or an interface name contains shorter values.
		"\""+allow.HostIface+"\"", `"<iface:allow>"`,
		"\""+public.HostIface+"\"", `"<iface:public>"`,
		"\""+lab.HostIface+"\"", `"<iface:lab>"`,
		"\""+peer.HostIface+"\"", `"<iface:peer>"`,
		"\""+e.prefix+"*\"", `"<prefix>*"`,
		"\""+e.prefix+"dns\"", `"<prefix>dns"`,
		"table inet "+e.prefix+" ", "table inet <prefix> ",
		"prefix \""+e.prefix+":", "prefix \"<prefix>:",
		fmt.Sprintf(" group %d ", e.fw.LogGroup()), " group <group> ",
		e.pool.String(), "<pool>",
		// nft (through libxtables) prints the name queue's xt NFQUEUE
		// target as "queue num N", after a complaint on stderr that the
		// inet family is not one it knows: the kernel runs it all the same.
		"libxtables: unhandled NFPROTO in xtables_set_nfproto\n", "",
	)
	got := r.Replace(full)
	got = regexp.MustCompile(`queue num \d+`).ReplaceAllString(got, "queue num <queue>")
	addrs := map[netip.Addr]string{
		allow.Guest: "<guest:allow>", public.Guest: "<guest:public>",
		lab.Guest: "<guest:lab>", peer.Guest: "<guest:peer>", e.dns: "<dns>",
	}
	got = regexp.MustCompile(`\b\d+\.\d+\.\d+\.\d+\b`).ReplaceAllStringFunc(got, func(s string) string {
		if p, ok := addrs[netip.MustParseAddr(s)]; ok {
			return p
		}
		return s
	})
	got = normalizeNft(got)

	if *update {
		if err := os.MkdirAll(filepath.Dir(nftTableGolden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(nftTableGolden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", nftTableGolden)
		return
	}
	want, err := os.ReadFile(nftTableGolden)
	if err != nil {
		t.Fatalf("read the golden table (make it with -update): %v", err)
	}
	if got != string(want) {
		t.Errorf("nft list table inet %s differs from %s (-want +got; rewrite with -update if the change is meant):\n%s",
			e.prefix, nftTableGolden, lineDiff(string(want), got))
	}
}

var (
	nftElements = regexp.MustCompile(`(?s)elements = \{ ([^}]*) \}`)
	nftExpires  = regexp.MustCompile(`(timeout \S+ )?expires \S+`)
	nftCounter  = regexp.MustCompile(`counter packets \d+ bytes \d+`)
	nftHandle   = regexp.MustCompile(` # handle \d+`)
)

// normalizeNft replaces what nft prints of the moment (an element's expiry,
// counters' values, handles) by placeholders, and sorts the elements of
// each set: the kernel's order is its hash's.
func normalizeNft(s string) string {
	s = nftExpires.ReplaceAllStringFunc(s, func(m string) string {
		if strings.HasPrefix(m, "timeout ") {
			return "timeout <timeout> expires <expires>"
		}
		return "expires <expires>"
	})
	s = nftCounter.ReplaceAllString(s, "counter packets <n> bytes <n>")
	s = nftHandle.ReplaceAllString(s, "")
	// One element a line, sorted: nft wraps the list by the width of what
	// it printed, which the placeholders changed.
	return nftElements.ReplaceAllStringFunc(s, func(m string) string {
		var elems []string
		for _, el := range strings.Split(nftElements.FindStringSubmatch(m)[1], ",") {
			elems = append(elems, strings.TrimSpace(el))
		}
		sort.Strings(elems)
		return "elements = { " + strings.Join(elems, ",\n\t\t\t     ") + " }"
	})
}

// lineDiff is a unified-style diff of two texts, line by line: "-" for a
// line only in want, "+" only in got, " " for both, with three lines of
// context around each change.
func lineDiff(want, got string) string {
	a, b := strings.Split(want, "\n"), strings.Split(got, "\n")
	// Longest common subsequence, by dynamic programming: the tables are
	// a few hundred lines.
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type line struct {
		op   byte
		text string
	}
	var ops []line
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			ops = append(ops, line{' ', a[i]})
			i, j = i+1, j+1
		case i < len(a) && (j == len(b) || lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, line{'-', a[i]})
			i++
		default:
			ops = append(ops, line{'+', b[j]})
			j++
		}
	}
	const context = 3
	var out strings.Builder
	last := -1 // the last op written
	for k, op := range ops {
		if op.op == ' ' {
			continue
		}
		from := max(k-context, last+1)
		if last >= 0 && from > last+1 {
			out.WriteString("@@\n")
		}
		for c := from; c < k; c++ {
			fmt.Fprintf(&out, "%c%s\n", ops[c].op, ops[c].text)
		}
		fmt.Fprintf(&out, "%c%s\n", op.op, op.text)
		last = k
		// Trailing context is written as the leading context of the next
		// change, or here when none follows within reach.
		next := len(ops)
		for n := k + 1; n < len(ops); n++ {
			if ops[n].op != ' ' {
				next = n
				break
			}
		}
		if next-k > 2*context {
			for c := k + 1; c <= min(k+context, len(ops)-1); c++ {
				fmt.Fprintf(&out, "%c%s\n", ops[c].op, ops[c].text)
				last = c
			}
		}
	}
	return out.String()
}
