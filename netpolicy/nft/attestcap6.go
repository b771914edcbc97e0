package nft

import (
	"net/netip"
	"sync"
	"time"

	"github.com/google/nftables"
)

// The MaxAttested cap for a dual-stack session's v6 elements (issue 26):
// attested6 and attested6_ports elements of one guest, counted apart from
// its v4 ones (as the v6 flow budget is apart from the v4 one: a
// dual-stack session may hold MaxAttested elements of each family). An
// answer whose new v6 elements would take the guest past the cap fails
// with netpolicy.ErrAttestCap before anything is inserted, as a v4 one
// does. The count is of the elements this Firewall inserted and has not
// seen expire or removed; on start it is seeded from the kernel's v6 sets.

// attest6Count is each guest's attested v6 elements, by key, with the
// latest expiry an answer gave each.
type attest6Count struct {
	mu      sync.Mutex
	by      map[netip.Addr]map[string]time.Time // v4 guest -> element key -> expiry
	pending map[netip.Addr]int                  // new elements reserved by answers not yet recorded
}

// liveLocked returns the guest's unexpired elements, dropping the expired ones.
func (x *attest6Count) liveLocked(guest netip.Addr, now time.Time) map[string]time.Time {
	m := x.by[guest]
	for k, exp := range m {
		if !exp.After(now) {
			delete(m, k)
		}
	}
	return m
}

// reserve reports whether the guest may hold the plan's elements besides
// those it holds and those other answers reserved, within limit (0: no
// cap), and if so reserves the new ones until release, as
// attestIndex.reserve does for v4.
func (x *attest6Count) reserve(guest netip.Addr, plan []setElems, limit int, now time.Time) (int, bool) {
	if limit <= 0 {
		return 0, true
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	have := x.liveLocked(guest, now)
	fresh := 0
	seen := map[string]bool{}
	for _, se := range plan {
		for _, e := range se.elems {
			k := se.set + string(e.Key)
			if _, ok := have[k]; !ok && !seen[k] {
				seen[k] = true
				fresh++
			}
		}
	}
	if len(have)+x.pending[guest]+fresh > limit {
		return 0, false
	}
	x.pending = addPending(x.pending, guest, fresh)
	return fresh, true
}

// release returns n elements reserve reserved for guest.
func (x *attest6Count) release(guest netip.Addr, n int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.pending = addPending(x.pending, guest, -n)
}

// record notes the plan's elements (after the kernel acked them).
func (x *attest6Count) record(guest netip.Addr, plan []setElems, now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.by == nil {
		x.by = map[netip.Addr]map[string]time.Time{}
	}
	m := x.by[guest]
	if m == nil {
		m = map[string]time.Time{}
		x.by[guest] = m
	}
	for _, se := range plan {
		for _, e := range se.elems {
			k := se.set + string(e.Key)
			if exp := now.Add(e.Timeout); exp.After(m[k]) {
				m[k] = exp
			}
		}
	}
}

// forget drops the elements of the plan (an update's unattest), or with a
// nil plan every element of the guest (its removal).
func (x *attest6Count) forget(guest netip.Addr, plan []setElems) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if plan == nil {
		delete(x.by, guest)
		return
	}
	for _, se := range plan {
		for _, e := range se.elems {
			delete(x.by[guest], se.set+string(e.Key))
		}
	}
}

// seedAttested6Locked counts the v6 attested elements already in the
// kernel (a restarted daemon's).
func (f *Firewall) seedAttested6Locked(c *nftables.Conn) error {
	if !f.dualStack() {
		return nil
	}
	now := time.Now()
	for _, name := range []string{setAttested6, setAttested6Ports} {
		elems, err := c.GetSetElements(f.schema.sets[name])
		if err != nil {
			return err
		}
		byGuest := map[netip.Addr][]nftables.SetElement{}
		for _, e := range elems {
			if len(e.Key) < 16 {
				continue
			}
			g, ok := f.guest4Of6(netip.AddrFrom16([16]byte(e.Key[:16])))
			if !ok {
				continue
			}
			byGuest[g] = append(byGuest[g], nftables.SetElement{Key: e.Key, Timeout: e.Expires})
		}
		for g, es := range byGuest {
			f.attested6.record(g, []setElems{{name, es}}, now)
		}
	}
	return nil
}
