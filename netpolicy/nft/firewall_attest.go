package nft

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// attestBatchMax bounds the Attest calls coalesced into one batch (each
// call's elements are already chunked per message by addElements).
const attestBatchMax = 128

// attestReq is one Attest call's elements: a dual-stack guest's v6 ones
// ride in the same batch as its v4 ones.
type attestReq struct {
	guest  netip.Addr
	plan   []setElems   // attested, attested_ports, port_attested
	plan6  []setElems   // attested6, attested6_ports (counted by attested6)
	named  []namedElems // the answer's v4 addresses for the session's limited names
	named6 []namedElems // and its v6 ones (limits6.go)
}

// Attest makes ips reachable from the session whose guest address is guest
// for ttl, clamped to [AttestFloor, MaxAttestTimeout]; it returns the
// effective timeout: how long the elements are known to stay in the
// kernel from now (what a DNS answer may promise). With no ports (or a
// port-less spec) every port and protocol is allowed; otherwise only the
// given ports (ProtoAny = TCP and UDP). It returns after the kernel
// acknowledged the batch holding its elements, so a DNS answer released
// afterwards can never race the rule. Attesting an address again refreshes
// (sets) its expiry. IPv6 addresses go into the guest's v6 sets when the
// table is dual-stack (Pool6) and are ignored otherwise; attested addresses
// in a blocked range stay unreachable (the guard is checked first).
//
// Every element already in the kernel with at least the clamped timeout
// less knownSlack of life left (an eighth, at most 30 s), as far as this Firewall KNOWS (it inserted
// it, nothing deleted it since; see knownIndex), needs no batch: Attest
// then returns at once with the shortest remaining life, and the kernel
// keeps the elements' expiry (only the refresh's maximum lifetime counts
// from this answer). A call with any element not known so waits for a
// batch with all of them.
//
// Concurrent calls are group-committed: a call that finds no batch in
// flight sends its own at once; calls arriving meanwhile are sent together
// as the next batch, one Flush for all. If that batch fails, each call's
// elements are retried in a batch of their own, so one call's failure is
// never another's. When two coalesced calls attest the same element, it is
// inserted once with the longer of their timeouts. All of this holds for
// both families at once: an answer's v4 and v6 elements are one request,
// skipped together, and acked in one batch.
func (f *Firewall) Attest(guest netip.Addr, ips []netip.Addr, ttl time.Duration, ports []netpolicy.PortSpec) (time.Duration, error) {
	return f.AttestName(guest, "", ips, ttl, ports)
}

// AttestName is Attest of an answer for name (presentation format, as the
// DNS proxy has it; "" unknown): when the session has counted limits on
// entries matching the name, the addresses also go into those entries'
// address sets, in the same batch (namedlimits.go). Such an answer always
// waits for a batch.
func (f *Firewall) AttestName(guest netip.Addr, name string, ips []netip.Addr, ttl time.Duration, ports []netpolicy.PortSpec) (time.Duration, error) {
	timeout := min(max(ttl, f.floor), MaxAttestTimeout)
	if err := f.checkGuest(guest); err != nil {
		return 0, fmt.Errorf("attest for %s: %w", guest, err)
	}
	plan := attestElements(guest, ips, timeout, ports)
	plan6 := f.attestElements6Of(guest, ips, timeout, ports)
	if len(plan) == 0 && len(plan6) == 0 {
		return timeout, nil
	}
	var named, named6 []namedElems
	if len(plan) > 0 {
		named = f.namedElements(guest, name, ips, timeout)
	}
	if len(plan6) > 0 {
		named6 = f.namedElements6(guest, name, ips, timeout)
	}
	now := time.Now()
	if left, ok := f.known.covers(guest, timeout, now, plan, plan6); ok && len(named) == 0 && len(named6) == 0 {
		// The answer justifies the refresh as a batch's would, in both
		// families (the v6 one: refresh6.go).
		for _, se := range plan {
			f.attested.noteAnswer(guest, se.set, se.elems, now)
		}
		if len(plan6) > 0 {
			f.noteAnswer6(guest, plan6, now)
		}
		return left, nil
	}
	// The cap's reservations last until the batch is acked and recorded
	// (or failed), so answers in flight together count each other.
	if len(plan) > 0 {
		n, ok := f.attested.reserve(guest, plan, f.cfg.MaxAttested, now)
		if !ok {
			return 0, fmt.Errorf("attest %d addresses for %s: %w (%d)", len(ips), guest, netpolicy.ErrAttestCap, f.cfg.MaxAttested)
		}
		defer f.attested.release(guest, n)
	}
	if len(plan6) > 0 {
		n, ok := f.attested6.reserve(guest, plan6, f.cfg.MaxAttested, now) // attestcap6.go
		if !ok {
			return 0, fmt.Errorf("attest %d addresses for %s: %w (%d IPv6 elements)", len(ips), guest, netpolicy.ErrAttestCap, f.cfg.MaxAttested)
		}
		defer f.attested6.release(guest, n)
	}
	if err := f.attests.do(attestReq{guest: guest, plan: plan, plan6: plan6, named: named, named6: named6}); err != nil {
		return 0, fmt.Errorf("attest %d addresses for %s: %w", len(ips), guest, err)
	}
	return timeout, nil
}

// flushAttests sends one batch with the elements of reqs on the attest
// connection and, once the kernel acked it, records them in the index.
func (f *Firewall) flushAttests(reqs []attestReq) error {
	merged := mergeAttests(reqs)
	epoch := f.known.begin()
	var sent time.Time
	err := f.attest.do(func(c *nftables.Conn) error {
		if f.cfg.AttestFault != nil {
			for _, r := range reqs {
				if err := f.cfg.AttestFault(r.guest); err != nil {
					return err
				}
			}
		}
		for _, se := range merged {
			if err := addElements(c, f.schema.sets[se.set], se.elems, false); err != nil {
				return err
			}
		}
		if err := f.queueNamed(c, mergeNamed(reqs, false), f.addrsSet); err != nil {
			return err
		}
		if err := f.queueNamed(c, mergeNamed(reqs, true), f.addrsSet6); err != nil {
			return err
		}
		// Before the send: the kernel stamps the expiries later, so
		// sent+timeout is a lower bound of each.
		sent = time.Now()
		f.flushes.Add(1)
		return c.Flush()
	})
	if err != nil {
		return err
	}
	f.known.learn(epoch, merged, sent)
	now := time.Now()
	for _, r := range reqs {
		for _, se := range r.plan {
			f.attested.record(r.guest, se.set, se.elems, now)
		}
		if len(r.plan6) > 0 {
			f.attested6.record(r.guest, r.plan6, now)
			f.noteAnswer6(r.guest, r.plan6, sent) // the refresh (refresh6.go)
		}
	}
	return nil
}

// mergeAttests concatenates the requests' elements per set, v4 sets then
// v6 ones, each key once with its longest timeout (the kernel would
// refresh a repeated key within the batch anyway; one element per key
// keeps that out of the question).
func mergeAttests(reqs []attestReq) []setElems {
	if len(reqs) == 1 {
		return append(append([]setElems(nil), reqs[0].plan...), reqs[0].plan6...)
	}
	var out []setElems
	for _, name := range knownSets {
		var elems []nftables.SetElement
		at := map[string]int{}
		for _, r := range reqs {
			for _, plan := range [][]setElems{r.plan, r.plan6} {
				for _, se := range plan {
					if se.set != name {
						continue
					}
					for _, e := range se.elems {
						if i, ok := at[string(e.Key)]; ok {
							elems[i].Timeout = max(elems[i].Timeout, e.Timeout)
							continue
						}
						at[string(e.Key)] = len(elems)
						elems = append(elems, e)
					}
				}
			}
		}
		if len(elems) > 0 {
			out = append(out, setElems{name, elems})
		}
	}
	return out
}

// AttestRoundTrips returns how many attest batches were sent to the kernel
// (each one acked before its answers are released), and AttestSkipped how
// many Attest calls needed none (every element known to be there).
func (f *Firewall) AttestRoundTrips() uint64 { return f.flushes.Load() }

// AttestSkipped: see AttestRoundTrips.
func (f *Firewall) AttestSkipped() uint64 { return f.known.skips() }

// RefreshSweepPeriod is how often SweepRefreshed should run: a quarter of
// the maximum lifetime, at most 30 s; 0 without the refresh.
func (f *Firewall) RefreshSweepPeriod() time.Duration {
	return min(f.attested.maxLife/4, 30*time.Second)
}

// AttestMaxLifetime returns the refresh's maximum lifetime (0: no refresh).
func (f *Firewall) AttestMaxLifetime() time.Duration { return f.attested.maxLife }

// SweepRefreshed deletes every live element (see buildRules; on a
// dual-stack daemon the v6 ones too, refresh6.go) the refresh no
// longer justifies: its key was last attested more than the maximum
// lifetime ago, an update revoked it, its session is gone, or this process
// never attested it (a restart: refreshes end at the first sweep unless a
// new answer attests the address again). It dumps the live sets, which
// hold only the addresses sessions connected to, and deletes in one batch;
// it returns how many elements it deleted. A live element thus outlives
// the maximum by at most one period (plus its refresh timeout).
func (f *Firewall) SweepRefreshed() (int, error) {
	var n int
	f.attested6.prune(time.Now())
	err := f.admin.do(func(c *nftables.Conn) error {
		n = 0
		now := time.Now()
		queued := false
		for _, name := range f.sweptLiveSets() {
			set := f.schema.sets[name]
			elems, err := c.GetSetElements(set)
			if err != nil {
				return fmt.Errorf("list set %s: %w", name, err)
			}
			var del []nftables.SetElement
			for _, e := range elems {
				if f.liveJustified(name, e.Key, now) {
					continue
				}
				del = append(del, nftables.SetElement{Key: e.Key})
			}
			if len(del) == 0 {
				continue
			}
			// Added first: an element may expire between the dump and the
			// batch, and a delete of a missing key fails the batch.
			if err := addElements(c, set, del, false); err != nil {
				return err
			}
			if err := addElements(c, set, del, true); err != nil {
				return err
			}
			n += len(del)
			queued = true
		}
		if !queued {
			return nil
		}
		return c.Flush()
	})
	if err != nil {
		return 0, fmt.Errorf("sweep refreshed attested elements of table inet %s: %w", f.cfg.Prefix, err)
	}
	return n, nil
}
