package nft

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

// liveSets are the datapath's refreshed copies of the first two attested
// sets (liveSets[i] of attestedSets[i]): same keys, written by the packet
// path (see buildRules). Their keys are recorded under the attested set's.
var liveSets = []string{setAttestedLive, setAttestedPortsLive}

// liveOf returns the live set of an attested set, if it has one.
func liveOf(set string) (string, bool) {
	for i, s := range liveSets {
		if attestedSets[i] == set {
			return s, true
		}
	}
	return "", false
}

// baseOf returns the attested set of a live set.
func baseOf(live string) (string, bool) {
	for i, s := range liveSets {
		if s == live {
			return attestedSets[i], true
		}
	}
	return "", false
}

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
// the kernel and when each expires at the latest (its live copy included),
// and until when the refresh may keep it alive, so RemoveSession can
// delete a session's attested elements by key instead of dumping every
// session's. It is authoritative (complete) only once seeded: Ensure seeds
// it with a dump of the attested sets, after which every insert into them
// goes through Attest, which records it after the kernel's ack. It may hold
// more than the kernel (expired or externally deleted elements), never less,
// as long as this Firewall is the table's only writer (one daemon per
// table). Until seeded, RemoveSession dumps.
//
// refresh and maxLife are the refresh's parameters (both 0: no refresh),
// set before first use. mu protects everything below it.
type attestIndex struct {
	refresh, maxLife time.Duration

	mu      sync.Mutex
	seeded  bool
	base    time.Time // the first record's time: expiries are kept as offsets from it
	byGuest map[netip.Addr]*guestAttests
	pending map[netip.Addr]int // elements reserved by answers not yet recorded (reserve)
}

// guestAttests is one guest's recorded elements; pruneAt is the size at
// which expired records are next swept.
type guestAttests struct {
	exp     map[attestKey]attestRec
	pruneAt int
}

// attestRec is one element's record, as offsets from base (8 bytes each
// instead of a time.Time's 24). exp is the DNS element's latest expiry.
// live is when the refresh stops being justified: the latest answer's time
// plus the maximum lifetime (0: never justified, as for a revoked element or
// one dumped after a restart); the live element may exist until
// gone().
type attestRec struct {
	exp, live time.Duration
}

// gone is the time after which neither the element nor its live copy can
// be in the kernel.
func (x *attestIndex) gone(r attestRec) time.Duration {
	if r.live > 0 {
		return max(r.exp, r.live+x.refresh+attestSlack)
	}
	return r.exp
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
	x.recordLocked(guest, set, elems, now, false)
}

// noteAnswer is record for an answer whose elements were known to be in
// the kernel (no batch): the refresh is justified from now, and the
// expiry the index keeps (an upper bound) can only grow.
func (x *attestIndex) noteAnswer(guest netip.Addr, set string, elems []nftables.SetElement, now time.Time) {
	x.record(guest, set, elems, now)
}

// recordLocked records elems; a seeding record (a dump) never justifies a
// refresh: when the answer that attested it came is unknown.
func (x *attestIndex) recordLocked(guest netip.Addr, set string, elems []nftables.SetElement, now time.Time, seeding bool) {
	if x.byGuest == nil {
		x.byGuest = map[netip.Addr]*guestAttests{}
	}
	ga := x.byGuest[guest]
	if ga == nil {
		ga = &guestAttests{exp: map[attestKey]attestRec{}, pruneAt: pruneMin}
		x.byGuest[guest] = ga
	}
	t := x.at(now)
	_, refreshable := liveOf(set)
	for _, e := range elems {
		k, ok := newAttestKey(set, e.Key)
		if !ok {
			continue
		}
		// Re-adding refreshes (sets) the kernel's expiry, which may shorten
		// it; keeping the later of the two only over-approximates.
		r := ga.exp[k]
		r.exp = max(r.exp, t+e.Timeout+attestSlack)
		if refreshable && x.maxLife > 0 && !seeding {
			r.live = t + x.maxLife
		}
		ga.exp[k] = r
	}
	if len(ga.exp) >= ga.pruneAt {
		for k, r := range ga.exp {
			if x.gone(r) <= t {
				delete(ga.exp, k)
			}
		}
		ga.pruneAt = max(2*len(ga.exp), pruneMin)
	}
}

// seed merges a dump of one attested or live set (elements with their
// remaining lifetime at now). A live element is recorded under its attested
// set's key, for its remaining lifetime, and unjustified: the sweep deletes
// it unless a new answer attests it again.
func (x *attestIndex) seed(set string, elems []nftables.SetElement, now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if base, ok := baseOf(set); ok {
		set = base
	}
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
		x.recordLocked(g, set, []nftables.SetElement{{Key: e.Key, Timeout: ttl}}, now, true)
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
// kernel, grouped by set (live copies under the live sets: any key of an
// attested set may have one), and whether the index is authoritative. A
// caller whose delete fails gives them back with putBack.
func (x *attestIndex) take(guest netip.Addr, now time.Time) (map[string][]nftables.SetElement, map[attestKey]attestRec, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ga := x.byGuest[guest]
	delete(x.byGuest, guest)
	out := map[string][]nftables.SetElement{}
	if ga == nil {
		return out, nil, x.seeded
	}
	t := x.at(now)
	for k, r := range ga.exp {
		if x.gone(r) <= t {
			continue
		}
		out[k.set()] = append(out[k.set()], nftables.SetElement{Key: append([]byte(nil), k.key[:k.n]...)})
		if live, ok := liveOf(k.set()); ok && x.maxLife > 0 {
			out[live] = append(out[live], nftables.SetElement{Key: append([]byte(nil), k.key[:k.n]...)})
		}
	}
	return out, ga.exp, x.seeded
}

// justified reports whether a live element of set (a live set) with key
// may exist at now: the guest's latest answer attested the key less than
// the maximum lifetime ago, and no update revoked it since.
func (x *attestIndex) justified(guest netip.Addr, set string, key []byte, now time.Time) bool {
	base, ok := baseOf(set)
	if !ok || x.maxLife == 0 {
		return false
	}
	k, ok := newAttestKey(base, key)
	if !ok {
		return false
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	ga := x.byGuest[guest]
	if ga == nil {
		return false
	}
	return ga.exp[k].live > x.at(now)
}

// revoke ends the refresh of the guest's elements of plan (an update no
// longer allows them); their records stay until they are gone.
func (x *attestIndex) revoke(guest netip.Addr, plan []setElems) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ga := x.byGuest[guest]
	if ga == nil {
		return
	}
	for _, se := range plan {
		for _, e := range se.elems {
			k, ok := newAttestKey(se.set, e.Key)
			if !ok {
				continue
			}
			if r, have := ga.exp[k]; have && r.live > 0 {
				// Keep gone() where it was: the live element the update
				// deleted may be created once more by a packet in flight.
				r.exp, r.live = x.gone(r), 0
				ga.exp[k] = r
			}
		}
	}
}

// putBack merges records taken by a removal that failed.
func (x *attestIndex) putBack(guest netip.Addr, taken map[attestKey]attestRec) {
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
		ga = &guestAttests{exp: map[attestKey]attestRec{}, pruneAt: pruneMin}
		x.byGuest[guest] = ga
	}
	for k, r := range taken {
		have := ga.exp[k]
		ga.exp[k] = attestRec{exp: max(have.exp, r.exp), live: max(have.live, r.live)}
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

// reserve reports whether the guest may hold the elements of plan on top
// of its live ones and of those other answers reserved and have not yet
// released, without exceeding limit, and if so reserves the plan's new
// elements: it returns how many, for release once the answer's batch was
// acked (and recorded) or failed. Keys it already holds are refreshes and
// cost nothing. Concurrent answers for one guest so never pass the cap
// together; two that carry the same new key both count it until one
// releases (a refusal near the cap, never an excess). Expired records are
// swept only when the quick count (which includes them) says the limit is
// near, so the usual call is one map lookup per element.
func (x *attestIndex) reserve(guest netip.Addr, plan []setElems, limit int, now time.Time) (int, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ga := x.byGuest[guest]
	// An element the refresh keeps alive counts while it is justified: it
	// is reachable.
	held := func(t time.Duration) int {
		n := 0
		if ga != nil {
			for k, r := range ga.exp {
				if k.counted() && (r.exp > t || r.live > t) {
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
	n, pending := fresh(), x.pending[guest]
	if quick+pending+n > limit {
		if ga == nil {
			return 0, false
		}
		t := x.at(now)
		for k, r := range ga.exp {
			if x.gone(r) <= t {
				delete(ga.exp, k)
			}
		}
		if held(t)+pending+n > limit {
			return 0, false
		}
	}
	x.pending = addPending(x.pending, guest, n)
	return n, true
}

// release returns n elements reserve reserved for guest.
func (x *attestIndex) release(guest netip.Addr, n int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.pending = addPending(x.pending, guest, -n)
}

// addPending adds n to guest's reserved count in m (made on first use),
// dropping a count that reaches zero.
func addPending(m map[netip.Addr]int, guest netip.Addr, n int) map[netip.Addr]int {
	if n == 0 {
		return m
	}
	if m == nil {
		m = map[netip.Addr]int{}
	}
	if m[guest] += n; m[guest] <= 0 {
		delete(m, guest)
	}
	return m
}
