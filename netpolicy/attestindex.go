package netpolicy

import (
	"net/netip"
	"sync"
	"time"

	"github.com/google/nftables"
)

// attestSlack is added to an attested element's expiry as this process
// records it. The record is taken after the kernel's ack, so it is already
// later than the kernel's expiry; the slack covers clock granularity. An
// element recorded as live but already gone from the kernel only costs a
// fallback (its delete fails with ENOENT; see RemoveSession); an element
// recorded as gone while the kernel still holds it would survive a removal,
// which must never happen.
const attestSlack = time.Second

// attestedSets are the sets Attest inserts into: port_attested holds, for
// each address of attested_ports, the address without its ports (it names
// the reason of a drop, and counts nothing against MaxAttested).
var attestedSets = []string{setAttested, setAttestedPorts, setPortAttested}

// attestKey is one attested element: the set (an index into attestedSets)
// and its key (8 bytes in attested and port_attested, 16 in attested_ports).
type attestKey struct {
	set_ uint8
	n    uint8
	key  [16]byte
}

func newAttestKey(set string, key []byte) (attestKey, bool) {
	k := attestKey{n: uint8(len(key))}
	i := 0
	for i < len(attestedSets) && attestedSets[i] != set {
		i++
	}
	if i == len(attestedSets) || (len(key) != 8 && len(key) != 16) {
		return k, false
	}
	k.set_ = uint8(i)
	copy(k.key[:], key)
	return k, true
}

func (k attestKey) set() string { return attestedSets[k.set_] }

// counted reports whether the element counts against MaxAttested.
func (k attestKey) counted() bool { return k.set() != setPortAttested }

// attestIndex records, per guest, the attested elements this Firewall put in
// the kernel and when each expires at the latest, so RemoveSession can
// delete a session's attested elements by key instead of dumping every
// session's. It is authoritative (complete) only once seeded: Ensure seeds
// it with a dump of the attested sets, after which every insert into them
// goes through Attest, which records it after the kernel's ack. It may hold
// more than the kernel (expired or externally deleted elements), never less,
// as long as this Firewall is the table's only writer (one daemon per
// table). Until seeded, RemoveSession dumps.
//
// mu protects everything below it.
type attestIndex struct {
	mu      sync.Mutex
	seeded  bool
	base    time.Time // the first record's time: expiries are kept as offsets from it
	byGuest map[netip.Addr]*guestAttests
}

// guestAttests is one guest's recorded elements with their latest expiry
// (an offset from base: 8 bytes instead of a time.Time's 24); pruneAt is
// the size at which expired records are next swept.
type guestAttests struct {
	exp     map[attestKey]time.Duration
	pruneAt int
}

// at returns t as an offset from base (setting base on first use).
func (x *attestIndex) at(t time.Time) time.Duration {
	if x.base.IsZero() {
		x.base = t
	}
	return t.Sub(x.base)
}

const pruneMin = 64

// record notes elements inserted with their timeouts at now.
func (x *attestIndex) record(guest netip.Addr, set string, elems []nftables.SetElement, now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.recordLocked(guest, set, elems, now)
}

func (x *attestIndex) recordLocked(guest netip.Addr, set string, elems []nftables.SetElement, now time.Time) {
	if x.byGuest == nil {
		x.byGuest = map[netip.Addr]*guestAttests{}
	}
	ga := x.byGuest[guest]
	if ga == nil {
		ga = &guestAttests{exp: map[attestKey]time.Duration{}, pruneAt: pruneMin}
		x.byGuest[guest] = ga
	}
	t := x.at(now)
	for _, e := range elems {
		k, ok := newAttestKey(set, e.Key)
		if !ok {
			continue
		}
		// Re-adding refreshes (sets) the kernel's expiry, which may shorten
		// it; keeping the later of the two only over-approximates.
		if exp := t + e.Timeout + attestSlack; exp > ga.exp[k] {
			ga.exp[k] = exp
		}
	}
	if len(ga.exp) >= ga.pruneAt {
		for k, exp := range ga.exp {
			if exp <= t {
				delete(ga.exp, k)
			}
		}
		ga.pruneAt = max(2*len(ga.exp), pruneMin)
	}
}

// seed merges a dump of one attested set (elements with their remaining
// lifetime at now) and, when complete is set, marks the index authoritative.
func (x *attestIndex) seed(set string, elems []nftables.SetElement, now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, e := range elems {
		g, ok := keyGuest(set, e.Key)
		if !ok {
			continue
		}
		// A dumped element without a timeout (none are inserted so) is
		// recorded for the longest life an element can have.
		ttl := e.Expires
		if ttl == 0 {
			ttl = MaxAttestTimeout
		}
		x.recordLocked(g, set, []nftables.SetElement{{Key: e.Key, Timeout: ttl}}, now)
	}
}

func (x *attestIndex) setSeeded(v bool) {
	x.mu.Lock()
	x.seeded = v
	x.mu.Unlock()
}

// reset forgets everything (the table is gone) and marks the index not
// authoritative.
func (x *attestIndex) reset() {
	x.mu.Lock()
	x.seeded, x.byGuest = false, nil
	x.mu.Unlock()
}

// take removes and returns the guest's elements that may still be in the
// kernel, grouped by set, and whether the index is authoritative. A caller
// whose delete fails gives them back with putBack.
func (x *attestIndex) take(guest netip.Addr, now time.Time) (map[string][]nftables.SetElement, map[attestKey]time.Duration, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ga := x.byGuest[guest]
	delete(x.byGuest, guest)
	out := map[string][]nftables.SetElement{}
	if ga == nil {
		return out, nil, x.seeded
	}
	t := x.at(now)
	for k, exp := range ga.exp {
		if exp > t {
			out[k.set()] = append(out[k.set()], nftables.SetElement{Key: append([]byte(nil), k.key[:k.n]...)})
		}
	}
	return out, ga.exp, x.seeded
}

// putBack merges records taken by a removal that failed.
func (x *attestIndex) putBack(guest netip.Addr, taken map[attestKey]time.Duration) {
	if len(taken) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.byGuest == nil {
		x.byGuest = map[netip.Addr]*guestAttests{}
	}
	ga := x.byGuest[guest]
	if ga == nil {
		ga = &guestAttests{exp: map[attestKey]time.Duration{}, pruneAt: pruneMin}
		x.byGuest[guest] = ga
	}
	for k, exp := range taken {
		if exp > ga.exp[k] {
			ga.exp[k] = exp
		}
	}
	ga.pruneAt = max(ga.pruneAt, 2*len(ga.exp))
}

// prune forgets every guest for which gone is true (their elements were
// deleted by a dump).
func (x *attestIndex) prune(gone func(netip.Addr) bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for g := range x.byGuest {
		if gone(g) {
			delete(x.byGuest, g)
		}
	}
}

// admits reports whether the guest may hold the elements of plan on top of
// its live ones without exceeding limit: keys it already holds are
// refreshes and cost nothing. Expired records are swept only when the quick
// count (which includes them) says the limit is near, so the usual call is
// one map lookup per element.
func (x *attestIndex) admits(guest netip.Addr, plan []setElems, limit int, now time.Time) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	ga := x.byGuest[guest]
	held := func() int {
		n := 0
		if ga != nil {
			for k := range ga.exp {
				if k.counted() {
					n++
				}
			}
		}
		return n
	}
	fresh := func() int {
		n := 0
		for _, se := range plan {
			for _, e := range se.elems {
				k, ok := newAttestKey(se.set, e.Key)
				if !ok || !k.counted() {
					continue
				}
				if ga == nil {
					n++
				} else if _, have := ga.exp[k]; !have {
					n++
				}
			}
		}
		return n
	}
	// The quick count includes the uncounted port_attested records: an
	// over-estimate, settled by the exact count below.
	quick := 0
	if ga != nil {
		quick = len(ga.exp)
	}
	if quick+fresh() <= limit {
		return true
	}
	if ga == nil {
		return false
	}
	t := x.at(now)
	for k, exp := range ga.exp {
		if exp <= t {
			delete(ga.exp, k)
		}
	}
	return held()+fresh() <= limit
}
