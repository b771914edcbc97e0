package integration

// DNSSEC passes through: a session's DO query reaches the upstream with DO,
// and the signatures of an answer that passes the filter unchanged come
// back and verify; a signature over an RRset the filter changed (an
// address dropped by the guard) is removed, not sent broken.

import (
	"crypto"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/integration/world"
)

// lookupDO sends one DO query for name's A records from inside nsPath.
func lookupDO(t *testing.T, nsPath, name string) *dns.Msg {
	t.Helper()
	var resp *dns.Msg
	err := world.DoPath(nsPath, func() error {
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), dns.TypeA)
		q.SetEdns0(1232, true)
		c := &dns.Client{Net: "udp", Timeout: world.ReachTimeout}
		var err error
		resp, _, err = c.Exchange(q, net.JoinHostPort(e2eAnycastDNS.Addr().String(), "53"))
		return err
	})
	if err != nil {
		t.Fatalf("DO query for %s from %s: %v", name, nsPath, err)
	}
	return resp
}

func TestE2EDNSSECSignaturesPassUnchanged(t *testing.T) {
	e := newE2E(t)
	key := &dns.DNSKEY{Hdr: dns.RR_Header{Name: "e2e.test.", Rrtype: dns.TypeDNSKEY, Class: dns.ClassINET, Ttl: 300},
		Flags: 257, Protocol: 3, Algorithm: dns.ECDSAP256SHA256}
	priv, err := key.Generate(256)
	if err != nil {
		t.Fatal(err)
	}
	signed := func(zone ...string) []dns.RR {
		var rrs []dns.RR
		for _, z := range zone {
			rr, err := dns.NewRR(z)
			if err != nil {
				t.Fatal(err)
			}
			rrs = append(rrs, rr)
		}
		sig := &dns.RRSIG{Hdr: dns.RR_Header{Name: rrs[0].Header().Name, Rrtype: dns.TypeRRSIG, Class: dns.ClassINET, Ttl: 300},
			Algorithm: key.Algorithm, SignerName: key.Hdr.Name, KeyTag: key.KeyTag(),
			Inception: uint32(time.Now().Add(-time.Hour).Unix()), Expiration: uint32(time.Now().Add(time.Hour).Unix())}
		if err := sig.Sign(priv.(crypto.Signer), rrs); err != nil {
			t.Fatal(err)
		}
		return append(rrs, sig)
	}
	e.w.DNS.AddRRs(signed("sec.e2e.test. 300 IN A 198.18.1.10")...)
	// One address of this RRset is special-purpose: the guard drops it, so
	// the RRset the session sees is not the one that was signed.
	e.w.DNS.AddRRs(signed("mixed.e2e.test. 300 IN A 198.18.1.11", "mixed.e2e.test. 300 IN A 10.1.2.3")...)
	e.createNetOnly("v", "--allow", "sec.e2e.test", "--allow", "mixed.e2e.test")
	ns := e.nsPath("v")

	resp := lookupDO(t, ns, "sec.e2e.test")
	var a []dns.RR
	var sig *dns.RRSIG
	for _, rr := range resp.Answer {
		switch r := rr.(type) {
		case *dns.A:
			a = append(a, r)
		case *dns.RRSIG:
			sig = r
		}
	}
	if sig == nil || len(a) != 1 {
		t.Fatalf("sec.e2e.test with DO: answer %v, want the A record and its RRSIG", resp.Answer)
	}
	if err := sig.Verify(key, a); err != nil {
		t.Errorf("sec.e2e.test: the returned signature does not verify: %v", err)
	}
	if opt := resp.IsEdns0(); opt == nil || !opt.Do() {
		t.Errorf("sec.e2e.test: the reply does not mirror DO: %v", opt)
	}
	if !slices.Contains(e.w.DNS.Queries(), "sec.e2e.test. A") {
		t.Errorf("upstream queries %v", e.w.DNS.Queries())
	}

	resp = lookupDO(t, ns, "mixed.e2e.test")
	for _, rr := range resp.Answer {
		if _, ok := rr.(*dns.RRSIG); ok {
			t.Errorf("mixed.e2e.test: a signature over the changed A RRset was sent: %s", rr)
		}
	}
	if got := world.AddrsOf(resp); !slices.Equal(addrStrs(got), []string{"198.18.1.11"}) {
		t.Errorf("mixed.e2e.test: addresses %v, want only the public one", got)
	}
}
