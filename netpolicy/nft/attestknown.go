package nft

import (
	"net/netip"
	"sync"
	"time"

	"github.com/google/nftables"
)

// knownSlack is how much shorter than a fresh attest's timeout a known
// element's remaining life may be and still spare the kernel round trip:
// an eighth of the timeout, at most 30 s. The answer then says the shorter
// remaining life (Attest returns it as the effective timeout), so an
// answer's TTL never outlives the element: at most this much of a TTL is
// lost (a client asks again that much sooner), and an address answered
// steadily is inserted again about once per slack. (A slack of one second
// made every name in steady use cost a round trip a second: 12% of the
// answers in the benchmark's 1000 names at 8000 q/s.)
func knownSlack(timeout time.Duration) time.Duration { return min(30*time.Second, timeout/8) }

// knownClockSlack is taken off a known element's computed expiry: the
// kernel stamps an element's expiry when it commits the batch (after our
// send time, which the computation uses) but in jiffies, which may round
// a few milliseconds down.
const knownClockSlack = 20 * time.Millisecond

// knownIndex is what this Firewall KNOWS is in the attested sets: each
// element it inserted, with a lower bound of its expiry in the kernel, as
// long as nothing removed it since. It is the opposite of attestIndex
// (which may hold more than the kernel, never less): knownIndex may hold
// less, never more, because Attest skips the kernel round trip for what
// it holds, and the DNS answer then vouches for it. A wrong entry would be
// an answer vouching for an address the kernel drops, or, worse, a
// session's answer vouching for an element another session left behind,
// which cannot happen either: every removal forgets first.
//
// What makes an element unknown:
//   - RemoveSession, UpdateSession, PruneGuests, Ensure and DeleteTable
//     forget the guests they touch (every guest, for the last two) before
//     their batch and again after it is acknowledged (forget, forgetAll).
//   - A delete by anyone else (an operator's nft, another process): the
//     Firewall's monitor (attestmonitor.go) reads the kernel's element,
//     set and table delete notifications and forgets those keys. Between
//     the kernel's delete and the monitor's read of it (the notification
//     is queued on the monitor's socket at the delete; reading it takes
//     microseconds to a millisecond) an answer may still vouch for the
//     element: the window docs/threat-model.md states. While the monitor
//     is down (not started, its socket overflowed, the netns is gone)
//     nothing is known and every Attest waits for the kernel.
//   - Expiry: an element is known until its lower-bound expiry.
//
// learn records a batch's elements only if no forget ran since the epoch
// it was given, taken before the batch was sent: a forget that overlaps
// the batch in any way (its delete was committed before or after ours)
// makes the batch's elements unknown, never known.
//
// mu guards everything below it.
type knownIndex struct {
	// guest4Of6 maps a guest's v6 address to its v4 one (nil: no v6
	// element is ever known). Set before first use.
	guest4Of6 func(netip.Addr) (netip.Addr, bool)

	mu      sync.Mutex
	epoch   uint64
	on      bool // the monitor is running: knowledge is kept
	byGuest map[netip.Addr]*guestKnown
	skipped uint64 // Attest calls answered from knowledge (no kernel round trip)
}

type guestKnown struct {
	exp     map[knownKey]time.Time // lower bound of the kernel's expiry
	pruneAt int
}

// knownSets are the sets whose elements knownIndex holds: the v4 attested
// sets and their v6 twins (a dual-stack table's). A v4 key starts with the
// guest's v4 address (guest . address is 8 bytes, with proto and port 16);
// a v6 key with the guest's v6 address (guest6 . address6 is 32 bytes,
// guest6 . proto . address6 . port 40), which guest4Of6 maps back to the
// v4 guest the element is known under: one guest, both families, so every
// forget of a guest forgets its v6 elements too.
var knownSets = append(append([]string(nil), attestedSets...), setAttested6, setAttested6Ports)

// knownKeyMax is the longest known key: an attested6_ports one.
const knownKeyMax = 40

// knownKey is one known element: the set (an index into knownSets) and
// its key.
type knownKey struct {
	set uint8
	n   uint8
	key [knownKeyMax]byte
}

// knownSetIsV6 reports whether the set at index i of knownSets is a v6 one.
func knownSetIsV6(i int) bool { return i >= len(attestedSets) }

// newKnownKey returns the known key of an element of set; false for a set
// knownIndex does not hold or a key of a length that set never has.
func newKnownKey(set string, key []byte) (knownKey, bool) {
	i := 0
	for i < len(knownSets) && knownSets[i] != set {
		i++
	}
	if i == len(knownSets) {
		return knownKey{}, false
	}
	n := len(key)
	if knownSetIsV6(i) && n != 32 && n != 40 || !knownSetIsV6(i) && n != 8 && n != 16 {
		return knownKey{}, false
	}
	k := knownKey{set: uint8(i), n: uint8(n)}
	copy(k.key[:], key)
	return k, true
}

// guestOf returns the v4 guest a known key belongs to: its first 4 bytes,
// or for a v6 key the v4 guest of its first 16 (false when they are no
// guest's v6 address, or the table is not dual-stack).
func (k *knownIndex) guestOf(key knownKey) (netip.Addr, bool) {
	if !knownSetIsV6(int(key.set)) {
		return netip.AddrFrom4([4]byte(key.key[:4])), true
	}
	if k.guest4Of6 == nil {
		return netip.Addr{}, false
	}
	return k.guest4Of6(netip.AddrFrom16([16]byte(key.key[:16])))
}

// begin returns the epoch a batch about to be sent must learn under.
func (k *knownIndex) begin() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.epoch
}

// learn records elems (per set, merged timeouts), sent at sent, unless a
// forget ran since epoch or knowledge is off. Re-adding an element sets
// its expiry in the kernel (it may shorten it), so the new bound replaces
// the old.
func (k *knownIndex) learn(epoch uint64, plan []setElems, sent time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.on || epoch != k.epoch {
		return
	}
	if k.byGuest == nil {
		k.byGuest = map[netip.Addr]*guestKnown{}
	}
	for _, se := range plan {
		for _, e := range se.elems {
			key, ok := newKnownKey(se.set, e.Key)
			if !ok || e.Timeout <= 0 {
				continue
			}
			g, ok := k.guestOf(key)
			if !ok {
				continue
			}
			gk := k.byGuest[g]
			if gk == nil {
				gk = &guestKnown{exp: map[knownKey]time.Time{}, pruneAt: pruneMin}
				k.byGuest[g] = gk
			}
			gk.exp[key] = sent.Add(e.Timeout - knownClockSlack)
			if len(gk.exp) >= gk.pruneAt {
				for kk, t := range gk.exp {
					if !t.After(sent) {
						delete(gk.exp, kk)
					}
				}
				gk.pruneAt = max(2*len(gk.exp), pruneMin)
			}
		}
	}
}

// covers reports whether every element of the plans (guest's: its v4 and
// v6 elements) is known with at least timeout-knownSlack(timeout) of life
// left at now, and returns the shortest remaining life (at most timeout):
// what the answer may promise.
func (k *knownIndex) covers(guest netip.Addr, timeout time.Duration, now time.Time, plans ...[]setElems) (time.Duration, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.on {
		return 0, false
	}
	gk := k.byGuest[guest]
	if gk == nil {
		return 0, false
	}
	left, need := timeout, timeout-knownSlack(timeout)
	for _, plan := range plans {
		for _, se := range plan {
			for _, e := range se.elems {
				key, ok := newKnownKey(se.set, e.Key)
				if !ok {
					return 0, false
				}
				exp, have := gk.exp[key]
				if !have {
					return 0, false
				}
				left = min(left, exp.Sub(now))
				if left < need || left <= 0 {
					return 0, false
				}
			}
		}
	}
	k.skipped++
	return left, true
}

// forget makes every element of the guests for which gone is true unknown,
// and every batch in flight learn nothing.
func (k *knownIndex) forget(gone func(netip.Addr) bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.epoch++
	for g := range k.byGuest {
		if gone(g) {
			delete(k.byGuest, g)
		}
	}
}

// forgetGuest is forget for one guest.
func (k *knownIndex) forgetGuest(guest netip.Addr) {
	k.forget(func(g netip.Addr) bool { return g == guest })
}

// forgetAll makes everything unknown; on says whether knowledge may be
// gathered again from now on (false: the monitor is down).
func (k *knownIndex) forgetAll(on bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.epoch++
	k.byGuest = nil
	k.on = on
}

// forgetKeys makes the elements with these keys unknown in every known
// set whose keys have their length (a delete notification names no set
// this library tells us): an attested or port_attested key is 8 bytes
// (guest . address), an attested_ports key 16, guest first in both; an
// attested6 key is 32 bytes (guest6 . address6), an attested6_ports key
// 40, guest6 first. (A key of another set with such a length forgets an
// element that may not be there: harmless, it is only looked up again.)
func (k *knownIndex) forgetKeys(elems []nftables.SetElement) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.epoch++
	for _, e := range elems {
		for _, set := range knownSets {
			key, ok := newKnownKey(set, e.Key)
			if !ok {
				continue
			}
			g, ok := k.guestOf(key)
			if !ok {
				continue
			}
			if gk := k.byGuest[g]; gk != nil {
				delete(gk.exp, key)
			}
		}
	}
}

// skips returns how many Attest calls were answered from knowledge.
func (k *knownIndex) skips() uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.skipped
}
