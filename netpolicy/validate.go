package netpolicy

import (
	"errors"
	"fmt"
)

// Validate checks the policy as a whole (entries are validated when parsed;
// Validate re-checks their invariants so a hand-built Policy cannot bypass
// them). It returns every problem joined, one line each.
func (p Policy) Validate() error {
	var errs []error
	if _, err := ParseMode(string(p.Egress)); err != nil {
		errs = append(errs, err)
	}
	if p.Egress == ModeNone {
		if len(p.Allow) > 0 {
			errs = append(errs, fmt.Errorf("egress none takes no allow entries (got %d); use allowlist or public", len(p.Allow)))
		}
		if len(p.LabPeers) > 0 {
			errs = append(errs, fmt.Errorf("egress none takes no lab peers (got %d); a session without a network cannot reach a peer", len(p.LabPeers)))
		}
		if p.Lab {
			errs = append(errs, fmt.Errorf("egress none cannot be a lab target; a session without a network cannot be reached"))
		}
		if len(p.Deny) > 0 {
			errs = append(errs, fmt.Errorf("egress none takes no deny entries (got %d); nothing leaves a session without a network", len(p.Deny)))
		}
		if p.OnDeny.Answers() {
			errs = append(errs, fmt.Errorf("egress none takes no --on-deny %s; a session without a network sends nothing to answer", p.OnDeny))
		}
		if len(p.InboundFromHost) > 0 {
			errs = append(errs, fmt.Errorf("egress none takes no --inbound-from-host (got %d); a session without a network cannot be reached", len(p.InboundFromHost)))
		}
	}
	for _, e := range p.Deny {
		err := e.check()
		if err == nil && e.Kind != KindCIDR && e.Port != 0 {
			err = fmt.Errorf("a name is denied on every port")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("deny entry %q: %w", e.String(), err))
		}
	}
	for _, e := range p.Allow {
		if err := e.check(); err != nil {
			errs = append(errs, fmt.Errorf("allow entry %q: %w", e.String(), err))
		}
	}
	seen := map[string]bool{}
	for _, peer := range p.LabPeers {
		switch {
		case peer == "":
			errs = append(errs, fmt.Errorf("lab peer: empty session name"))
		case seen[peer]:
			errs = append(errs, fmt.Errorf("lab peer %q: listed twice", peer))
		}
		seen[peer] = true
	}
	return errors.Join(errs...)
}

// check verifies the invariants documented on Entry.
func (e Entry) check() error {
	if e.Port == 0 && e.Proto != ProtoAny {
		return fmt.Errorf("protocol %q without a port", e.Proto)
	}
	if e.Proto != ProtoAny && e.Proto != ProtoTCP && e.Proto != ProtoUDP {
		return fmt.Errorf("unknown protocol %q; want tcp or udp", e.Proto)
	}
	switch e.Kind {
	case KindCIDR:
		if !e.Prefix.IsValid() || e.Prefix.Addr().Is4In6() || e.Prefix != e.Prefix.Masked() || e.Name != "" {
			return fmt.Errorf("malformed CIDR entry")
		}
	case KindHost, KindWildcard, KindMultiWildcard:
		n, err := NormalizeName(e.Name)
		if err != nil {
			return err
		}
		if n != e.Name || e.Prefix.IsValid() {
			return fmt.Errorf("malformed name entry; build entries with ParseEntry")
		}
	default:
		return fmt.Errorf("unknown entry kind %d", int(e.Kind))
	}
	return nil
}
