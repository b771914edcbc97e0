package doctor

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/miekg/dns"
)

// checkUpstreams sends one query ("." NS) to each upstream, in parallel,
// each bounded by the upstream timeout. An answer (NOERROR, or NXDOMAIN
// from a resolver that does not know the root) passes; silence, a refused
// socket, or an rcode that says the upstream will not resolve for this
// host (REFUSED: an access list; SERVFAIL: it cannot resolve) fails: every
// query the sessions make would get the same.
func checkUpstreams(e *doctorEnv) (string, string) {
	ups := e.cfg.Upstreams
	if len(ups) == 0 {
		return StatusFail, "no upstream resolver configured (--upstream, or nameservers in /etc/resolv.conf)"
	}
	errs := make([]error, len(ups))
	rcodes := make([]string, len(ups))
	var wg sync.WaitGroup
	for i, up := range ups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rcodes[i], errs[i] = queryUpstream(up, e.opts)
		}()
	}
	wg.Wait()
	var bad, good []string
	for i, up := range ups {
		if errs[i] != nil {
			bad = append(bad, errs[i].Error())
		} else {
			good = append(good, fmt.Sprintf("%s (%s)", up, rcodes[i]))
		}
	}
	if len(bad) > 0 {
		return StatusFail, strings.Join(bad, "; ")
	}
	return StatusOK, "answering: " + strings.Join(good, ", ")
}

func queryUpstream(up netip.AddrPort, opts Options) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opts.UpstreamTimeout)
	defer cancel()
	q := new(dns.Msg)
	q.SetQuestion(".", dns.TypeNS)
	q.RecursionDesired = true
	c := &dns.Client{Net: "udp", Timeout: opts.UpstreamTimeout}
	resp, _, err := c.ExchangeContext(ctx, q, up.String())
	if err != nil {
		return "", fmt.Errorf("upstream %s did not answer within %s: %w", up, opts.UpstreamTimeout, err)
	}
	rcode := dns.RcodeToString[resp.Rcode]
	if resp.Rcode != dns.RcodeSuccess && resp.Rcode != dns.RcodeNameError {
		return "", fmt.Errorf("upstream %s answered %s to \". NS\": it does not resolve for this host", up, rcode)
	}
	return rcode, nil
}
