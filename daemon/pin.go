package daemon

import (
	"context"
	"errors"
	"fmt"

	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// resolvePins resolves every host entry of an allowlist once, through the
// upstream resolvers, IPv4 only (sessions are IPv4-only). A host with no
// public IPv4 address fails the whole create, naming the host: pinning never
// falls back to anything wider.
func (e *Engine) resolvePins(ctx context.Context, p netpolicy.Policy) (map[string][]netip.Addr, error) {
	pinned := map[string][]netip.Addr{}
	for _, ent := range p.Allow {
		if ent.Kind != netpolicy.KindHost {
			continue
		}
		if _, done := pinned[ent.Name]; done {
			continue
		}
		addrs, err := e.pin(ctx, ent.Name)
		if err != nil {
			return nil, badRequest(fmt.Errorf("--pin: host %s: %v", ent.Name, err))
		}
		var public []netip.Addr
		for _, a := range addrs {
			if e.guard.IsPublicUnicast(a) {
				public = append(public, a)
			}
		}
		if len(public) == 0 {
			return nil, badRequest(fmt.Errorf("--pin: host %s has no public IPv4 address; refusing to create the session", ent.Name))
		}
		pinned[ent.Name] = public
	}
	return pinned, nil
}

// upstreamResolver returns a function resolving a name's A records through
// the given resolvers, in order.
func upstreamResolver(upstreams []netip.AddrPort, timeout time.Duration) func(ctx context.Context, host string) ([]netip.Addr, error) {
	return func(ctx context.Context, host string) ([]netip.Addr, error) {
		if len(upstreams) == 0 {
			return nil, errors.New("no upstream resolver configured")
		}
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(host), dns.TypeA)
		q.RecursionDesired = true
		var lastErr error
		for _, up := range upstreams {
			c := &dns.Client{Net: "udp", Timeout: timeout}
			resp, _, err := c.ExchangeContext(ctx, q, up.String())
			if err == nil && resp.Truncated {
				c.Net = "tcp"
				resp, _, err = c.ExchangeContext(ctx, q, up.String())
			}
			if err != nil {
				lastErr = fmt.Errorf("upstream %s: %w", up, err)
				continue
			}
			if resp.Rcode == dns.RcodeNameError {
				return nil, errors.New("no such name (NXDOMAIN)")
			}
			if resp.Rcode != dns.RcodeSuccess {
				lastErr = fmt.Errorf("upstream %s answered %s", up, dns.RcodeToString[resp.Rcode])
				continue
			}
			var out []netip.Addr
			for _, rr := range resp.Answer {
				if a, ok := rr.(*dns.A); ok {
					if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
						out = append(out, ip)
					}
				}
			}
			return out, nil
		}
		return nil, lastErr
	}
}
