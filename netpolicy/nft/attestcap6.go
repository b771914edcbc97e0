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

// attest6Index is the v6 side of what attestIndex is for v4: each
// dual-stack guest's attested v6 elements (by its v4 guest; key: set name
// and element key), with exp, the latest expiry an answer gave the element
// (its life in the kernel), and live, until when its refresh is justified
// (the latest answer's time plus the maximum lifetime; zero: never, as
// after a restart or a revoke; see refresh6.go). An element counts against
// the v6 cap while either is ahead: it is reachable. pending is the new
// elements answers in flight reserved (reserve).
type attest6Index struct {
	mu      sync.Mutex
	by      map[netip.Addr]map[string]attest6Rec
	pending map[netip.Addr]int
}

// attest6Rec is one v6 element's record.
type attest6Rec struct{ exp, live time.Time }

func attest6Key(set string, key []byte) string { return set + "\x00" + string(key) }

// heldLocked returns the guest's elements still counted at now, dropping
// the others.
func (x *attest6Index) heldLocked(guest netip.Addr, now time.Time) map[string]attest6Rec {
	m := x.by[guest]
	for k, r := range m {
		if !r.exp.After(now) && !r.live.After(now) {
			delete(m, k)
		}
	}
	return m
}

// reserve reports whether the guest may hold the plan's elements besides
// those it holds and those other answers reserved, within limit (0: no
// cap), and if so reserves the new ones until release, as
// attestIndex.reserve does for v4.
func (x *attest6Index) reserve(guest netip.Addr, plan []setElems, limit int, now time.Time) (int, bool) {
	if limit <= 0 {
		return 0, true
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	have := x.heldLocked(guest, now)
	fresh := 0
	seen := map[string]bool{}
	for _, se := range plan {
		for _, e := range se.elems {
			k := attest6Key(se.set, e.Key)
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
func (x *attest6Index) release(guest netip.Addr, n int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.pending = addPending(x.pending, guest, -n)
}

// record notes the plan's elements inserted with their timeouts at now
// (after the kernel acked them, or found there at a start).
func (x *attest6Index) record(guest netip.Addr, plan []setElems, now time.Time) {
	x.update(guest, plan, func(e nftables.SetElement, r *attest6Rec) {
		if exp := now.Add(e.Timeout); exp.After(r.exp) {
			r.exp = exp
		}
	})
}

// justify notes that an answer justifies the refresh of the plan's
// elements until until.
func (x *attest6Index) justify(guest netip.Addr, plan []setElems, until time.Time) {
	x.update(guest, plan, func(_ nftables.SetElement, r *attest6Rec) {
		if until.After(r.live) {
			r.live = until
		}
	})
}

// update applies fn to the record of each of the plan's elements (made
// when new).
func (x *attest6Index) update(guest netip.Addr, plan []setElems, fn func(nftables.SetElement, *attest6Rec)) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.by == nil {
		x.by = map[netip.Addr]map[string]attest6Rec{}
	}
	m := x.by[guest]
	if m == nil {
		m = map[string]attest6Rec{}
		x.by[guest] = m
	}
	for _, se := range plan {
		for _, e := range se.elems {
			k := attest6Key(se.set, e.Key)
			r := m[k]
			fn(e, &r)
			m[k] = r
		}
	}
}

// justified reports whether the live element of the attested6 set set
// with key may exist at now.
func (x *attest6Index) justified(guest netip.Addr, set string, key []byte, now time.Time) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.by[guest][attest6Key(set, key)].live.After(now)
}

// revoke ends the refresh of the plan's elements (an update's unattest,
// before its batch); they count until they expire or forget drops them.
func (x *attest6Index) revoke(guest netip.Addr, plan []setElems) {
	x.mu.Lock()
	defer x.mu.Unlock()
	m := x.by[guest]
	for _, se := range plan {
		for _, e := range se.elems {
			k := attest6Key(se.set, e.Key)
			if r, ok := m[k]; ok {
				r.live = time.Time{}
				m[k] = r
			}
		}
	}
}

// forget drops the elements of the plan (an update's unattest, after its
// batch deleted them), or with a nil plan every element of the guest (its
// removal).
func (x *attest6Index) forget(guest netip.Addr, plan []setElems) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if plan == nil {
		delete(x.by, guest)
		return
	}
	for _, se := range plan {
		for _, e := range se.elems {
			delete(x.by[guest], attest6Key(se.set, e.Key))
		}
	}
}

// prune drops the records neither alive nor justified at now.
func (x *attest6Index) prune(now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for g := range x.by {
		if len(x.heldLocked(g, now)) == 0 {
			delete(x.by, g)
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
