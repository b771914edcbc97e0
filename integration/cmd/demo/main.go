// Command demo is `make demo`: it builds a self-contained world (a simulated
// host and a simulated internet in network namespaces, nothing touching the
// machine's real network), starts enforcerd in the simulated host, creates
// sessions in each mode, probes every destination from inside each sandbox
// and prints a reachability matrix with the reason for each verdict. Then it
// removes everything it made, by name.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/integration/enforcerd"
	"github.com/enforcerd/enforcerd/integration/world"
)

type session struct {
	name string
	args []string
	what string
	// reach are the labels of the destinations the session must reach;
	// every other one must be blocked. The demo fails on any difference.
	reach []string
}

// dest is one thing a session tries to reach.
type dest struct {
	label string // column text
	name  string // DNS name to resolve first ("" = literal address)
	addr  string // literal address (when name is "")
	port  string
	proto string // "http" or "dns"
}

type verdict struct {
	ok     bool
	reason string // what the probe saw
	why    api.WhyAnswer
}

func main() {
	bin := flag.String("bin", "bin/enforcerd", "the enforcerd binary")
	rootfs := flag.String("rootfs", ".cache/rootfs", "a busybox rootfs (scripts/mkrootfs.sh)")
	flag.Parse()
	if os.Geteuid() != 0 {
		fatal("the demo builds network namespaces: run it as root")
	}
	if err := run(*bin, *rootfs); err != nil {
		fatal(err.Error())
	}
}

func fatal(msg string) {
	fmt.Fprintln(os.Stderr, "demo:", msg)
	os.Exit(1)
}

func step(format string, a ...any) { fmt.Printf("\n==> "+format+"\n", a...) }

func run(bin, rootfs string) (err error) {
	step("building a world: a simulated host and a simulated internet (198.18.0.0/15), in network namespaces")
	w, err := world.Build()
	if err != nil {
		return err
	}
	defer func() {
		step("removing the world %s (namespaces %s, %s)", w.ID, w.HostName, w.NetName)
		w.Close()
	}()
	for _, rr := range []string{
		"api.demo.test. 300 IN A 198.18.1.10",
		"docs.demo.test. 300 IN A 198.18.1.11",
		"cdn.demo.test. 300 IN CNAME edge.cdn-provider.test.",
		"edge.cdn-provider.test. 300 IN A 198.18.2.10",
		"rebind.demo.test. 300 IN A 169.254.169.254",
	} {
		w.DNS.AddRR(rr)
	}
	fmt.Printf("    DNS zone at %s:\n", w.DNS.Addr())
	fmt.Println("      api.demo.test -> 198.18.1.10     docs.demo.test -> 198.18.1.11")
	fmt.Println("      cdn.demo.test -> CNAME edge.cdn-provider.test -> 198.18.2.10")
	fmt.Println("      rebind.demo.test -> 169.254.169.254 (a DNS-rebinding attempt)")
	fmt.Println("    web servers on 198.18.1.10, 198.18.1.11, 198.18.2.10; a metadata look-alike on 169.254.169.254; a private server on 10.99.0.10")

	dir, err := os.MkdirTemp("", "enforcerd-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	d := enforcerd.New(bin, w, dir)
	step("starting enforcerd in the simulated host: nsenter --net=%s %s %s", w.HostPath, bin, strings.Join(d.ServeArgs(), " "))
	if err := d.Start(); err != nil {
		return err
	}
	defer func() {
		step("stopping enforcerd and reaping prefix %q", d.Prefix)
		d.Stop()
		if out, err := d.Reap(); err != nil {
			fmt.Print(out)
		}
	}()

	sessions := []session{
		{"agent", []string{"--allow", "api.demo.test", "--allow", "cdn.demo.test", "--allow", "rebind.demo.test"}, "allowlist of three names",
			[]string{"api.demo.test", "cdn.demo.test"}},
		{"pinned", []string{"--scope", "https://API.demo.test/app/#/login", "--pin"}, "scope URL, pinned at create",
			[]string{"api.demo.test"}},
		{"cidr", []string{"--allow", "198.18.1.11/32:80"}, "one address, port 80 only",
			[]string{"198.18.1.11:80"}},
		{"open", []string{"--egress", "public"}, "every public destination",
			[]string{"api.demo.test", "docs.demo.test", "cdn.demo.test", "198.18.1.11:80", "198.18.1.11:7"}},
		{"sealed", nil, "egress none: only lo", nil},
		{"lab", []string{"--lab"}, "a lab target", []string{"lab target"}},
		{"tester", []string{"--lab-peer", "lab"}, "may reach the lab target only", []string{"lab target"}},
	}
	step("creating sessions (each a libcontainer sandbox in its own netns)")
	for _, s := range sessions {
		args := append([]string{"session", "create", s.name, "--rootfs", rootfs}, s.args...)
		fmt.Printf("    enforcerd %s\n", strings.Join(args, " "))
		if _, _, err := d.CLI(args...); err != nil {
			return err
		}
	}
	defer func() {
		step("removing sessions")
		for _, s := range sessions {
			d.CLI("session", "rm", s.name)
		}
	}()
	labIP, err := guestIP(d, "lab")
	if err != nil {
		return err
	}
	// The lab target serves HTTP on port 80 from inside its sandbox.
	if _, _, err := d.CLI("session", "exec", "lab", "--", "sh", "-c",
		"mkdir -p /tmp/www && echo lab > /tmp/www/index.html && httpd -p 80 -h /tmp/www"); err != nil {
		return err
	}

	dests := []dest{
		{label: "api.demo.test", name: "api.demo.test", port: "80", proto: "http"},
		{label: "docs.demo.test", name: "docs.demo.test", port: "80", proto: "http"},
		{label: "cdn.demo.test", name: "cdn.demo.test", port: "80", proto: "http"},
		{label: "rebind.demo.test", name: "rebind.demo.test", port: "80", proto: "http"},
		{label: "198.18.1.11:80", addr: "198.18.1.11", port: "80", proto: "http"},
		{label: "198.18.1.11:7", addr: "198.18.1.11", port: "7", proto: "tcp"},
		{label: "169.254.169.254", addr: "169.254.169.254", port: "80", proto: "http"},
		{label: "10.99.0.10", addr: "10.99.0.10", port: "80", proto: "http"},
		{label: "DNS 198.18.0.53", addr: "198.18.0.53", port: "53", proto: "dns"},
		{label: "lab target", addr: labIP, port: "80", proto: "http"},
	}
	step("probing every destination from inside every sandbox (busybox nslookup, wget, nc via enforcerd session exec)")
	results := make([][]verdict, len(sessions))
	var wg sync.WaitGroup
	for i, s := range sessions {
		results[i] = make([]verdict, len(dests))
		for j, dst := range dests {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i][j] = probe(d, s.name, dst)
			}()
		}
	}
	wg.Wait()

	step("each session's policy")
	for _, s := range sessions {
		fmt.Printf("    %-7s %s: %s\n", s.name, s.what, strings.Join(s.args, " "))
	}

	step("reachability matrix (✔ reached, ✘ blocked; the word is the reason enforcerd session why gives)")
	tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprint(tw, "    destination \\ session")
	for _, s := range sessions {
		fmt.Fprintf(tw, "\t%s", s.name)
	}
	fmt.Fprintln(tw)
	var mismatches []string
	for j, dst := range dests {
		fmt.Fprintf(tw, "    %s", dst.label)
		for i, s := range sessions {
			v := results[i][j]
			mark := "✘ " + shortReason(v.why)
			if v.ok {
				mark = "✔"
			}
			fmt.Fprintf(tw, "\t%s", mark)
			want := slices.Contains(s.reach, dst.label)
			switch {
			case v.ok != want:
				mismatches = append(mismatches, fmt.Sprintf("%s -> %s: %s, want %s (%s)", s.name, dst.label, word(v.ok), word(want), v.reason))
			case whyAllows(v.why) != v.ok:
				mismatches = append(mismatches, fmt.Sprintf("%s -> %s: %s, but session why says %s (%s)", s.name, dst.label, word(v.ok), v.why.Verdict, v.why.Reason))
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()

	step("why, session by session (enforcerd session why NAME DEST)")
	for i, s := range sessions {
		fmt.Printf("\n  %s (%s)\n", s.name, s.what)
		tw := tabwriter.NewWriter(os.Stdout, 2, 4, 2, ' ', 0)
		for j, dst := range dests {
			v := results[i][j]
			fmt.Fprintf(tw, "    %s\t%s\t%s\n", dst.label, word(v.ok), whyLine(v.why))
		}
		tw.Flush()
	}
	if len(mismatches) > 0 {
		return fmt.Errorf("%d verdicts differ from what the policies say:\n  %s", len(mismatches), strings.Join(mismatches, "\n  "))
	}
	step("every verdict is the one its policy says, and the one session why gives")
	step("what the kernel recorded for agent (enforcerd session inspect agent, abridged)")
	if out, _, err := d.CLI("session", "inspect", "agent"); err == nil {
		var in api.SessionInfo
		json.Unmarshal([]byte(out), &in)
		var att []string
		for _, a := range in.Attested {
			att = append(att, a.IP)
		}
		sort.Strings(att)
		c := in.Counters
		fmt.Printf("    guest %s behind %s; attested: %s; counters: accepted %d packets, dropped %d (flow limits %d)\n",
			in.GuestIP, in.HostVeth, strings.Join(att, ", "), c.AcceptedPackets, c.DroppedPackets, c.LimitedPackets)
	}
	return dualStack(bin)
}

// dualStack is the demo's IPv6 step (issue 26): a second daemon with
// --pool6, in a world of its own with an IPv6 internet (2001:2::/48), and
// one network-only session allowed one name. From inside its netns the demo
// resolves the name's AAAA through the session's v6 resolver and connects
// to it over IPv6 (reached), then connects to another v6 address of the
// same internet, a literal no entry names (refused). It fails on any other
// outcome.
func dualStack(bin string) (err error) {
	step("dual-stack: a second enforcerd with --pool6 fd00:20::/112 in a world with an IPv6 internet (2001:2::/48)")
	w, err := world.Build()
	if err != nil {
		return err
	}
	defer func() {
		step("removing the dual-stack world %s", w.ID)
		w.Close()
	}()
	if err := w.EnableIPv6(); err != nil {
		return err
	}
	w.DNS.AddRR("web6.demo.test. 300 IN AAAA 2001:2:0:1::10")
	dir, err := os.MkdirTemp("", "enforcerd-demo6-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	d := enforcerd.New(bin, w, dir, "--pool6", "fd00:20::/112", "--public-override", world.World6Prefix.String())
	if err := d.Start(); err != nil {
		return err
	}
	defer func() {
		d.Stop()
		if out, err := d.Reap(); err != nil {
			fmt.Print(out)
		}
	}()
	args := []string{"session", "create", "agent6", "--json", "--network-only", "--allow", "web6.demo.test"}
	fmt.Printf("    enforcerd %s\n", strings.Join(args, " "))
	out, _, err := d.CLI(args...)
	if err != nil {
		return err
	}
	defer d.CLI("session", "rm", "agent6")
	var in api.SessionInfo
	if err := json.Unmarshal([]byte(out), &in); err != nil {
		return fmt.Errorf("session create agent6: %w", err)
	}
	dns6, err := netip.ParseAddr(in.DNS6)
	if err != nil {
		return fmt.Errorf("agent6: no v6 resolver (%q)", in.DNS6)
	}
	ns := "/run/netns/" + in.Netns
	fmt.Printf("    agent6: guest %s and %s, resolvers %s and %s\n", in.GuestIP, in.Guest6IP, in.DNS, in.DNS6)
	m, err := world.Lookup(ns, netip.AddrPortFrom(dns6, 53), "web6.demo.test", dns.TypeAAAA, false, 3*time.Second)
	if err != nil {
		return fmt.Errorf("agent6: AAAA web6.demo.test: %w", err)
	}
	addrs := world.Addrs6Of(m)
	if len(addrs) != 1 {
		return fmt.Errorf("agent6: AAAA web6.demo.test = %v, want one address", addrs)
	}
	allowed := netip.AddrPortFrom(addrs[0], 7)
	literal := netip.MustParseAddrPort("[2001:2:0:1::11]:7")
	reached := world.TCPEcho(ns, allowed, 3*time.Second)
	refused := world.TCPEcho(ns, literal, 3*time.Second) // a v6 refusal comes with the retransmitted SYN (network model, "Limits, stated")
	fmt.Printf("    agent6 -> web6.demo.test (AAAA %s, attested), TCP %s: %s\n", addrs[0], allowed, mark(reached == nil, reached))
	fmt.Printf("    agent6 -> the v6 literal %s, named by no entry: %s\n", literal, mark(refused == nil, refused))
	if reached != nil || refused == nil {
		return fmt.Errorf("dual-stack: agent6 reached web6.demo.test: %v, the v6 literal: %v; want the name reached and the literal refused", reached == nil, refused == nil)
	}
	step("dual-stack: the allowed name reached over IPv6, the unlisted v6 literal refused")
	return nil
}

// mark is ✔ for a reached destination, ✘ and the error for a refused one.
func mark(ok bool, err error) string {
	if ok {
		return "✔ reached"
	}
	return "✘ refused (" + err.Error() + ")"
}

func guestIP(d *enforcerd.Daemon, name string) (string, error) {
	out, _, err := d.CLI("session", "inspect", name)
	if err != nil {
		return "", err
	}
	var in api.SessionInfo
	if err := json.Unmarshal([]byte(out), &in); err != nil {
		return "", fmt.Errorf("inspect %s: %w", name, err)
	}
	return in.GuestIP, nil
}

// probe resolves (when the destination is a name) and connects from inside
// the session's sandbox, and asks the daemon why (session why).
func probe(d *enforcerd.Daemon, sess string, dst dest) verdict {
	v := probeTraffic(d, sess, dst)
	target := dst.addr
	if dst.name != "" {
		target = dst.name
	}
	spec := target + ":" + dst.port
	if dst.proto == "dns" {
		spec += "/udp"
	}
	ans, err := d.Client().Why(context.Background(), sess, spec)
	if err != nil {
		ans = api.WhyAnswer{Verdict: "error", Reason: "error", Detail: err.Error()}
	}
	v.why = ans
	return v
}

// whyAllows is the answer's verdict for a connection: a name is reached
// when one of its addresses is allowed.
func whyAllows(a api.WhyAnswer) bool {
	if len(a.Addrs) > 0 {
		for _, ad := range a.Addrs {
			if ad.Verdict == api.WhyAllowed {
				return true
			}
		}
		return false
	}
	return a.Verdict == api.WhyAllowed
}

// shortReason is the word in a blocked matrix cell.
func shortReason(a api.WhyAnswer) string {
	r := a.Reason
	if a.Verdict == api.WhyNXDomain {
		return "nxdomain"
	}
	for _, ad := range a.Addrs {
		if ad.Verdict != api.WhyAllowed {
			r = ad.Reason
		}
	}
	if r == "special-purpose" {
		return "ssrf"
	}
	return r
}

// whyLine is the answer in one line.
func whyLine(a api.WhyAnswer) string {
	line := fmt.Sprintf("%s (%s): %s", a.Verdict, a.Reason, a.Detail)
	for _, ad := range a.Addrs {
		line += fmt.Sprintf("; %s %s (%s): %s", ad.IP, ad.Verdict, ad.Reason, ad.Detail)
	}
	return line
}

func word(ok bool) string {
	if ok {
		return "ALLOWED"
	}
	return "blocked"
}

// probeTraffic resolves (when the destination is a name) and connects from
// inside the session's sandbox.
func probeTraffic(d *enforcerd.Daemon, sess string, dst dest) verdict {
	if sess == "sealed" {
		_, _, code, _ := d.CLIStatus(context.Background(), "session", "exec", sess, "--", "sh", "-c", "ip -o link | grep -v ' lo:' | grep -q .")
		if code != 0 {
			return verdict{ok: false, reason: "no network: the netns has only lo"}
		}
	}
	addr := dst.addr
	via := ""
	if dst.name != "" {
		out, _, _ := d.CLI("session", "exec", sess, "--timeout", "5s", "--", "nslookup", "-type=a", dst.name, "10.20.255.254")
		addr = "" // the last address of the answer, if any
		if addrs := world.NslookupAddrs(out); len(addrs) > 0 {
			addr = addrs[len(addrs)-1]
		}
		switch {
		case strings.Contains(out, "NXDOMAIN") || strings.Contains(out, "can't find"):
			if addr == "" {
				return verdict{ok: false, reason: "DNS: NXDOMAIN from the proxy (name not in policy; never sent upstream)"}
			}
		case addr == "" && strings.Contains(strings.ToLower(out), "timed out"):
			return verdict{ok: false, reason: "DNS: no answer (no network: only lo)"}
		}
		if addr == "" {
			return verdict{ok: false, reason: "DNS: no usable address (the special-purpose answer was filtered: rebinding guard)"}
		}
		via = fmt.Sprintf("DNS answered %s and attested it; ", addr)
	}
	var script string
	switch dst.proto {
	case "http":
		script = fmt.Sprintf("timeout 2 wget -q -O /dev/null http://%s:%s/", addr, dst.port)
	case "tcp":
		script = fmt.Sprintf("echo ping | timeout 2 nc %s %s | grep -q ping", addr, dst.port)
	case "dns":
		script = fmt.Sprintf("timeout 2 nslookup api.demo.test %s", addr)
	}
	_, _, code, err := d.CLIStatus(context.Background(), "session", "exec", sess, "--", "sh", "-c", script)
	if err != nil {
		return verdict{ok: false, reason: "probe failed: " + err.Error()}
	}
	if code == 0 {
		if sess == "lab" && dst.label == "lab target" {
			return verdict{ok: true, reason: "its own address: never leaves the sandbox"}
		}
		return verdict{ok: true, reason: via + "connection accepted"}
	}
	return verdict{ok: false, reason: via + "no connection"}
}
