package integration

// A scope reaches its host's A records and nothing else: the ipv4hint of
// the host's HTTPS record (which could name any address) is not attested
// and does not reach the session; an --allow entry of the same host keeps
// hints, as before.

import (
	"slices"
	"testing"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/integration/world"
)

func TestE2EScopeDoesNotAttestHints(t *testing.T) {
	e := newE2E(t)
	e.w.DNS.AddRR(`svc.e2e.test. 300 IN A 198.18.1.10`)
	e.w.DNS.AddRR(`svc.e2e.test. 300 IN HTTPS 1 . alpn="h2" ipv4hint="198.18.1.11"`)
	e.createNetOnly("scoped", "--scope", "https://svc.e2e.test/")
	e.createNetOnly("allowed", "--allow", "svc.e2e.test:443/tcp")

	for _, tc := range []struct {
		session string
		want    []string
	}{
		{"scoped", []string{"198.18.1.10"}},
		{"allowed", []string{"198.18.1.10:443/tcp", "198.18.1.11:443/tcp"}},
	} {
		ns := e.nsPath(tc.session)
		for _, qt := range []uint16{dns.TypeA, dns.TypeHTTPS} {
			m, err := world.Lookup(ns, e2eAnycastDNS, "svc.e2e.test", qt, false, world.ReachTimeout)
			if err != nil || m.Rcode != dns.RcodeSuccess {
				t.Fatalf("%s: look up svc.e2e.test %s: %v %v", tc.session, dns.TypeToString[qt], err, m)
			}
			if tc.session == "scoped" && qt == dns.TypeHTTPS {
				for _, rr := range m.Answer {
					if h, ok := rr.(*dns.HTTPS); ok {
						for _, kv := range h.Value {
							if kv.Key() == dns.SVCB_IPV4HINT {
								t.Errorf("scoped: the answer still carries %s", h)
							}
						}
					}
				}
			}
		}
		got := e.inspect(tc.session).Attested
		var ips []string
		for _, a := range got {
			ips = append(ips, a.IP)
		}
		slices.Sort(ips)
		if !slices.Equal(ips, tc.want) {
			t.Errorf("%s: attested %v, want %v", tc.session, ips, tc.want)
		}
	}
}
