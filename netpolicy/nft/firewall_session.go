package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/google/nftables"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// checkRules validates r against the firewall configuration.
func (f *Firewall) checkRules(r SessionRules) error {
	if _, err := netpolicy.ParseMode(string(r.Egress)); err != nil {
		return err
	}
	if !strings.HasPrefix(r.HostIface, f.cfg.Prefix) || len(r.HostIface) >= ifNameSize {
		// An interface without the prefix would bypass the forward chain.
		return fmt.Errorf("host interface %q: must start with %q and be at most 15 characters", r.HostIface, f.cfg.Prefix)
	}
	if err := f.checkGuest(r.Guest); err != nil {
		return err
	}
	for _, p := range r.Peers {
		if err := f.checkGuest(p); err != nil {
			return fmt.Errorf("lab peer: %w", err)
		}
	}
	return nil
}

// AddSession inserts every element of a session in one batch: its interface
// and address (anti-spoofing), public mode, lab peers, static targets and
// zeroed counters. Adding the same rules again is harmless. It never changes
// another session's elements. A ModeNone session has no interface, hence no
// elements: AddSession does nothing. Policy changes are RemoveSession then
// AddSession (elements are only ever added here, never replaced).
func (f *Firewall) AddSession(r SessionRules) error {
	if r.Egress == netpolicy.ModeNone {
		return nil
	}
	if err := f.checkRules(r); err != nil {
		return fmt.Errorf("add session %s: %w", r.Name, err)
	}
	if err := r.Limits.check(f.dualStack()); err != nil {
		return fmt.Errorf("add session %s: %w", r.Name, err)
	}
	// A new session on an address starts knowing nothing of it (its
	// predecessor's removal forgot it already).
	f.known.forgetGuest(r.Guest)
	plan := append(sessionElements(r), f.sessionElements6(r)...)
	err := f.admin.do(func(c *nftables.Conn) error {
		for _, se := range plan {
			if err := addElements(c, f.schema.sets[se.set], se.elems, false); err != nil {
				return err
			}
		}
		// Added again after a restart, the limit objects keep their
		// counts (see queueLimitsLocked).
		if err := f.queueLimitsLocked(c, r.Guest, r.Limits, limitObjects{}); err != nil {
			return err
		}
		return c.Flush()
	})
	if err != nil {
		return fmt.Errorf("add session %s (guest %s): %w", r.Name, r.Guest, err)
	}
	// After the batch: an answer meanwhile would name sets not yet made.
	// (Sets a restart finds keep their elements.)
	f.named.set(r.Guest, namedOf(r.Guest, r.Limits))
	return nil
}

// sessionSets are the sets RemoveSession scans for a guest's elements.
var sessionSets = []string{setSessions, setPublic, setPeers, setAttested, setAttestedPorts, setAttestedLive, setAttestedPortsLive,
	setStatic, setStaticPorts, setStaticCIDR, setStaticCIDRPorts, setAcctAccept, setAcctDrop, setAcctLimited, setAcctReturn,
	setFlows, setFlowRate, setIfaces, setPortHosts, setPortCIDRs, setPortAttested, setAcctReason, setLogRate,
	setDenied, setDeniedPorts, setReject, setReset, setInboundHost, setNameCheck, setNameCheckPublic, setNameCheckQUIC, setPinned, setPinnedPorts}

// datapathSets hold elements the datapath creates (a session's flow budget)
// that RemoveSession cannot know exist. The by-key batch adds each (a no-op
// when it exists: an add without NLM_F_EXCL of an existing key succeeds)
// and then deletes it, so the delete never meets a missing element. (A
// batch the kernel rejects costs an RCU grace period, ~20 ms, in its abort.)
var datapathSets = []string{setFlows, setFlowRate, setLogRate}

// RemoveSession deletes every element that belongs to r.Guest in one batch:
// whatever it was added with, its attested addresses, its counters, and the
// peer elements of other sessions that name it (so a reused address inherits
// nothing). A zero Guest (egress none) has nothing to remove. It is
// idempotent: removing a removed session succeeds.
//
// Once the elements are gone (no packet of the guest passes raw_prerouting
// any more, so no new flow can appear), it queues the guest's conntrack
// entries for the background flusher (see flowTable): until they are gone
// FlowsFlushed(guest) is false, and the address must not be handed out.
//
// Two ways, one batch each:
//   - by key, when r carries an egress mode other than none: r must be the
//     rules the session was added with. The batch deletes the elements
//     AddSession made from r, the attested elements this Firewall recorded
//     for the guest (see attestIndex; only once Ensure has seeded it), and
//     the peers elements naming the guest, found by dumping the peers set
//     (only lab sessions have any). Its cost does not grow with the number
//     of sessions.
//   - by dump, otherwise (r holds only Guest, e.g. an orphan found after a
//     restart), or when the by-key batch fails: the kernel rejects a batch
//     that deletes a missing element with ENOENT (a second removal, an
//     attested element that just expired, rules that differ from those
//     added), and nothing of it is applied. It lists all eleven session sets
//     and deletes what is there, so its cost grows with every session's
//     elements. An element that expires between the listing and the delete
//     makes the kernel reject that batch too; it is then retried.
//
// Rules that lack some of the session's elements (a static target, public
// mode) would leave those behind on the by-key way: pass the rules it was
// added with, or only the Guest.
func (f *Firewall) RemoveSession(r SessionRules) error {
	if !r.Guest.IsValid() {
		return nil // a session without an address (egress none) has no elements
	}
	if !r.Guest.Is4() {
		return fmt.Errorf("remove session %s: guest address %s is not IPv4", r.Name, r.Guest)
	}
	// Unknown before the batch and after it: an attest batch in flight
	// meanwhile learns nothing (see knownIndex).
	f.known.forgetGuest(r.Guest)
	defer f.known.forgetGuest(r.Guest)
	f.named.set(r.Guest, nil) // before the batch deletes their sets
	f.attested6.forget(r.Guest, nil)
	attested, taken, complete := f.attested.take(r.Guest, time.Now())
	if complete && r.Egress != "" && r.Egress != netpolicy.ModeNone && f.checkRules(r) == nil {
		err := f.admin.do(func(c *nftables.Conn) error { return f.removeByKeyLocked(c, r, attested) })
		if err == nil {
			f.flows.schedule(r.Guest)
			return nil
		}
		// Whatever failed, nothing of the batch was applied: the dump decides.
	}
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		if err = f.admin.do(func(c *nftables.Conn) error { return f.removeGuestLocked(c, r.Guest) }); err == nil || !isNotFound(err) {
			break
		}
	}
	if err != nil {
		f.attested.putBack(r.Guest, taken)
		return fmt.Errorf("remove session %s (guest %s): %w", r.Name, r.Guest, err)
	}
	f.flows.schedule(r.Guest)
	return nil
}

// FlowsFlushed reports whether no conntrack entry of a removed session at
// guest can remain: true once the background flush of its entries is done
// (or if it was never removed). An allocator must not hand out the guest
// address while it is false.
func (f *Firewall) FlowsFlushed(guest netip.Addr) bool { return f.flows.flushed(guest) }

// WaitFlows waits until every queued conntrack flush is done, or timeout.
func (f *Firewall) WaitFlows(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !f.flows.idle() {
		if time.Now().After(deadline) {
			return fmt.Errorf("conntrack entries of removed sessions still queued after %s", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// removeByKeyLocked queues the deletion of r's own elements, the given
// attested elements and the peers elements naming r.Guest, and flushes.
func (f *Firewall) removeByKeyLocked(c *nftables.Conn, r SessionRules, attested map[string][]nftables.SetElement) error {
	g := ipKey(r.Guest)
	peers, err := c.GetSetElements(f.schema.sets[setPeers])
	if err != nil {
		return fmt.Errorf("list set %s: %w", setPeers, err)
	}
	var del []nftables.SetElement
	for _, e := range peers {
		if len(e.Key) == 8 && (bytes.Equal(e.Key[:4], g) || bytes.Equal(e.Key[4:8], g)) {
			del = append(del, nftables.SetElement{Key: e.Key})
		}
	}
	if err := addElements(c, f.schema.sets[setPeers], del, true); err != nil {
		return err
	}
	for _, se := range sessionElements(r) {
		if se.set == setPeers {
			continue // deleted from the listing above
		}
		elems := se.elems
		if se.set == setIfaces {
			elems = []nftables.SetElement{{Key: elems[0].Key}} // a delete names the key only
		}
		if err := addElements(c, f.schema.sets[se.set], elems, true); err != nil {
			return err
		}
	}
	// Added first, then deleted, like the datapath's: an attested element
	// may have expired, and its live copy may never have existed.
	for _, name := range append(append([]string(nil), attestedSets...), liveSets...) {
		if err := addElements(c, f.schema.sets[name], attested[name], false); err != nil {
			return err
		}
		if err := addElements(c, f.schema.sets[name], attested[name], true); err != nil {
			return err
		}
	}
	own := []nftables.SetElement{{Key: g}}
	for _, name := range datapathSets {
		if err := addElements(c, f.schema.sets[name], own, false); err != nil {
			return err
		}
		if err := addElements(c, f.schema.sets[name], own, true); err != nil {
			return err
		}
	}
	// The drop-reason counters, likewise: one possible key per code.
	var reasons []nftables.SetElement
	for _, d := range dropCodes {
		reasons = append(reasons, nftables.SetElement{Key: concat(g, reasonKey(d.code))})
	}
	if err := addElements(c, f.schema.sets[setAcctReason], reasons, false); err != nil {
		return err
	}
	if err := addElements(c, f.schema.sets[setAcctReason], reasons, true); err != nil {
		return err
	}
	if !r.Limits.Empty() {
		if err := f.queueLimitsLocked(c, r.Guest, SessionLimits{}, wantedLimits(r.Guest, r.Limits)); err != nil {
			return err
		}
	}
	// A dual-stack session's v6 elements: found by listing (firewall6.go).
	if _, err := f.removeGuests6Locked(c, func(a netip.Addr) bool { return a == r.Guest }); err != nil {
		return err
	}
	return c.Flush()
}

func (f *Firewall) removeGuestLocked(c *nftables.Conn, guest netip.Addr) error {
	return f.removeGuestsLocked(c, func(a netip.Addr) bool { return a == guest })
}

// removeGuestsLocked deletes, in one batch, every element of the session
// sets that belongs to a guest for which gone is true, and every peers
// element pointing at one.
func (f *Firewall) removeGuestsLocked(c *nftables.Conn, gone func(netip.Addr) bool) error {
	ok, err := tableExists(c, f.schema.table)
	if err != nil || !ok {
		return err
	}
	queued := 0
	for _, name := range sessionSets {
		set := f.schema.sets[name]
		elems, err := c.GetSetElements(set)
		if err != nil {
			return fmt.Errorf("list set %s: %w", name, err)
		}
		var del []nftables.SetElement
		for _, e := range elems {
			owner, ok := elemGuest(name, e)
			mine := ok && gone(owner)
			if name == setPeers && len(e.Key) == 8 && gone(netip.AddrFrom4([4]byte(e.Key[4:8]))) {
				mine = true // another session's permission to reach this one
			}
			if mine {
				del = append(del, nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd})
			}
		}
		if err := addElements(c, set, del, true); err != nil {
			return err
		}
		queued += len(del)
	}
	limits, err := f.listLimitsLocked(c, gone)
	if err != nil {
		return err
	}
	for g, have := range limits {
		if have.empty() {
			continue
		}
		if err := f.queueLimitsLocked(c, g, SessionLimits{}, have); err != nil {
			return err
		}
		queued++
	}
	n6, err := f.removeGuests6Locked(c, gone)
	if err != nil {
		return err
	}
	queued += n6
	if queued == 0 {
		return nil
	}
	return c.Flush()
}

// PruneGuests deletes everything keyed by a guest address for which gone is
// true (the caller knows the pool's layout and which sessions are live): the
// elements of every session set (attested ones included, and peers
// elements naming such a guest) and the conntrack entries whose original
// source or destination it is. A restarted daemon calls it once it knows its live sessions, so
// that nothing a session left behind (a crash mid-removal, an answer attested
// after its removal by an older version) outlives it for the next session on
// the address. It returns the number of conntrack entries deleted.
func (f *Firewall) PruneGuests(gone func(guest netip.Addr) bool) (int, error) {
	f.known.forget(gone)
	defer f.known.forget(gone)
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		if err = f.admin.do(func(c *nftables.Conn) error { return f.removeGuestsLocked(c, gone) }); err == nil || !isNotFound(err) {
			break
		}
	}
	if err != nil {
		return 0, fmt.Errorf("prune orphaned elements in table inet %s: %w", f.cfg.Prefix, err)
	}
	f.attested.prune(gone)
	n, err := f.flows.prune(gone)
	if err != nil {
		return n, err
	}
	// What a reply created while the entries were being flushed.
	for attempt := 0; attempt < 4; attempt++ {
		if err = f.admin.do(func(c *nftables.Conn) error { return f.removeGuestsLocked(c, gone) }); err == nil || !isNotFound(err) {
			break
		}
	}
	if err != nil {
		return n, fmt.Errorf("prune orphaned elements in table inet %s: %w", f.cfg.Prefix, err)
	}
	return n, nil
}

// forgetReturns deletes the acct_return elements of the given guests,
// removed sessions whose conntrack entries are gone: until then a reply
// still on its way into a removed session (a server's FIN a moment after
// the removal) is forwarded by its flow's conntrack entry, and
// accept_return's update creates the element again, for the next session
// on the address to inherit. After the flush nothing is forwarded to the
// guest, and the address is not handed out before this has run (the
// guests are pending until then). Each key is added, then deleted: one
// batch that never meets a missing element.
func (f *Firewall) forgetReturns(guests []netip.Addr) error {
	if len(guests) == 0 {
		return nil
	}
	var elems []nftables.SetElement
	for _, g := range guests {
		elems = append(elems, nftables.SetElement{Key: ipKey(g)})
	}
	err := f.admin.do(func(c *nftables.Conn) error {
		ok, err := tableExists(c, f.schema.table)
		if err != nil || !ok {
			return err
		}
		set := f.schema.sets[setAcctReturn]
		if err := addElements(c, set, elems, false); err != nil {
			return err
		}
		if err := addElements(c, set, elems, true); err != nil {
			return err
		}
		return c.Flush()
	})
	if err != nil {
		return fmt.Errorf("forget the replies counted for removed sessions: %w", err)
	}
	return nil
}

// listSet dumps one set's elements on the admin connection.
func (f *Firewall) listSet(name string) ([]nftables.SetElement, error) {
	var out []nftables.SetElement
	err := f.admin.do(func(c *nftables.Conn) error {
		ok, err := tableExists(c, f.schema.table)
		if err != nil {
			return err
		}
		if !ok {
			return errNoTable
		}
		out, err = c.GetSetElements(f.schema.sets[name])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list set %s in table inet %s: %w", name, f.cfg.Prefix, err)
	}
	return out, nil
}

// Attested returns one session's attested elements with their remaining
// lifetime (diagnostics: it dumps the attested sets).
func (f *Firewall) Attested(guest netip.Addr) ([]AttestedAddr, error) {
	all, err := f.AllAttested()
	if err != nil {
		return nil, err
	}
	return all[guest], nil
}

// AllAttested returns every session's attested elements keyed by guest
// address, each list sorted: four dumps whatever the number of sessions.
// An element the refresh keeps alive (see buildRules) is listed with the
// later of its answer's and its refresh's expiry.
func (f *Firewall) AllAttested() (map[netip.Addr][]AttestedAddr, error) {
	out := map[netip.Addr][]AttestedAddr{}
	type id struct {
		guest netip.Addr
		key   string
	}
	at := map[id]int{}
	for _, name := range []string{setAttested, setAttestedLive, setAttestedPorts, setAttestedPortsLive} {
		elems, err := f.listSet(name)
		if err != nil {
			return nil, err
		}
		for _, e := range elems {
			var g netip.Addr
			var a AttestedAddr
			switch len(e.Key) {
			case 8:
				g, a = netip.AddrFrom4([4]byte(e.Key[0:4])), AttestedAddr{IP: netip.AddrFrom4([4]byte(e.Key[4:8])), Expires: e.Expires}
			case 16:
				gg, ip, proto, port, _ := decodeGuestPort(e.Key)
				g, a = gg, AttestedAddr{IP: ip, Port: port, Proto: proto, Expires: e.Expires}
			default:
				continue
			}
			k := id{g, string(e.Key)}
			if i, ok := at[k]; ok {
				out[g][i].Expires = max(out[g][i].Expires, a.Expires)
				continue
			}
			at[k] = len(out[g])
			out[g] = append(out[g], a)
		}
	}
	if err := f.allAttested6(out); err != nil {
		return nil, err
	}
	for _, list := range out {
		sort.Slice(list, func(i, j int) bool {
			if c := list[i].IP.Compare(list[j].IP); c != 0 {
				return c < 0
			}
			if list[i].Port != list[j].Port {
				return list[i].Port < list[j].Port
			}
			return list[i].Proto < list[j].Proto
		})
	}
	return out, nil
}

// AllCounters returns the counters of every session that has any, keyed by
// guest address: four dumps whatever the number of sessions.
func (f *Firewall) AllCounters() (map[netip.Addr]Counters, error) {
	out, err := f.reasonCounters()
	if err != nil {
		return nil, err
	}
	for _, name := range []string{setAcctAccept, setAcctDrop, setAcctLimited, setAcctReturn} {
		elems, err := f.listSet(name)
		if err != nil {
			return nil, err
		}
		for _, e := range elems {
			g, ok := keyGuest(name, e.Key)
			if !ok || e.Counter == nil {
				continue
			}
			c := out[g]
			switch name {
			case setAcctAccept:
				c.AcceptedPackets, c.AcceptedBytes = e.Counter.Packets, e.Counter.Bytes
			case setAcctDrop:
				c.DroppedPackets, c.DroppedBytes = e.Counter.Packets, e.Counter.Bytes
			case setAcctReturn:
				c.ReceivedPackets, c.ReceivedBytes = e.Counter.Packets, e.Counter.Bytes
			default:
				c.LimitedPackets = e.Counter.Packets
				if c.LimitedPackets > 0 {
					if c.ByReason == nil {
						c.ByReason = map[string]uint64{}
					}
					c.ByReason[netpolicy.ReasonRateLimit] = c.LimitedPackets
				}
			}
			out[g] = c
		}
	}
	return out, nil
}

// reasonCounters dumps @acct_reason: each guest's drops by reason and its
// unlogged count.
func (f *Firewall) reasonCounters() (map[netip.Addr]Counters, error) {
	elems, err := f.listSet(setAcctReason)
	if err != nil {
		return nil, err
	}
	out := map[netip.Addr]Counters{}
	for _, e := range elems {
		if len(e.Key) != 8 || e.Counter == nil {
			continue
		}
		g := netip.AddrFrom4([4]byte(e.Key[:4]))
		c := out[g]
		code := binary.NativeEndian.Uint32(e.Key[4:8])
		if code == codeUnlogged {
			c.Unlogged = e.Counter.Packets
		} else if r, ok := reasonOfCode(code); ok && e.Counter.Packets > 0 {
			if c.ByReason == nil {
				c.ByReason = map[string]uint64{}
			}
			c.ByReason[r] = e.Counter.Packets
		}
		out[g] = c
	}
	return out, nil
}

// Counters returns one session's counters (zero if it has none), read by
// key: a dozen single-element requests whatever the number of sessions.
// For many sessions AllCounters is cheaper (four dumps in all).
func (f *Firewall) Counters(guest netip.Addr) (Counters, error) {
	return f.guestCounters(guest)
}

// Sessions lists the sessions present in the kernel (host interface and
// guest address), for reconciliation after a restart.
func (f *Firewall) Sessions() ([]SessionKey, error) {
	elems, err := f.listSet(setSessions)
	if err != nil {
		return nil, err
	}
	var out []SessionKey
	for _, e := range elems {
		if len(e.Key) != ifNameSize+4 {
			continue
		}
		out = append(out, SessionKey{
			HostIface: string(bytes.TrimRight(e.Key[:ifNameSize], "\x00")),
			Guest:     netip.AddrFrom4([4]byte(e.Key[ifNameSize:])),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Guest.Less(out[j].Guest) })
	return out, nil
}
