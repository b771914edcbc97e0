package nft

import (
	"net/netip"
	"sync"
	"time"

	"github.com/google/nftables"

	"github.com/enforcerd/enforcerd/netpolicy"
)

// Counted limits of name entries (issue 24): a grant's connections or a
// budget for a name count the flows to the addresses the DNS proxy
// answered for the name, kept per session and entry in the entry's address
// set (addrs_<guest>_<entry>, limits.go). The Firewall knows each session's
// limited names (namedIndex, from AddSession and UpdateSession); an answer
// for a matching name puts its addresses into the entry's set in the batch
// that attests them (AttestName), acknowledged by the kernel before the
// answer is released. Only the session's own answers fill its sets.

// namedLimit is one limited name entry of a session.
type namedLimit struct {
	entry netpolicy.Entry
	set   string // its address set
}

// namedIndex is every session's limited name entries, by guest.
type namedIndex struct {
	mu sync.RWMutex
	by map[netip.Addr][]namedLimit
}

// namedOf returns the limited name entries of l.
func namedOf(g netip.Addr, l SessionLimits) []namedLimit {
	var out []namedLimit
	for _, e := range l.Entries {
		if e.Name != nil && (e.Connections > 0 || e.Budget > 0) {
			out = append(out, namedLimit{entry: *e.Name, set: addrsSetName(g, e.ID)})
		}
	}
	return out
}

// set replaces the guest's limited names (none: forgets the guest).
func (x *namedIndex) set(g netip.Addr, ls []namedLimit) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(ls) == 0 {
		delete(x.by, g)
		return
	}
	if x.by == nil {
		x.by = map[netip.Addr][]namedLimit{}
	}
	x.by[g] = ls
}

// sets returns the address sets of the guest's limited names that name
// matches (in presentation format, as the DNS proxy has it).
func (x *namedIndex) sets(g netip.Addr, name string) []string {
	x.mu.RLock()
	ls := x.by[g]
	x.mu.RUnlock()
	var out []string
	for _, l := range ls {
		if l.entry.MatchesName(name) {
			out = append(out, l.set)
		}
	}
	return out
}

// bothNamed returns the limited names in both a and b (by set).
func bothNamed(a, b []namedLimit) []namedLimit {
	var out []namedLimit
	for _, x := range a {
		for _, y := range b {
			if x.set == y.set {
				out = append(out, y)
				break
			}
		}
	}
	return out
}

// namedElems are the elements an answer adds to one address set.
type namedElems struct {
	set   string
	elems []nftables.SetElement
}

// addrsTimeout is an address set element's timeout for an answer attested
// with timeout: at least as long as any attested element of the answer may
// let a new flow through (its refreshed live copy included, see
// SweepRefreshed), so that no flow the attestation admits escapes the
// count. A flow to the address after the attestation ended is counted and
// refused by the policy.
func (f *Firewall) addrsTimeout(timeout time.Duration) time.Duration {
	extra := time.Second
	if f.attested.maxLife > 0 {
		extra += f.attested.maxLife + f.RefreshSweepPeriod() + f.attested.refresh
	}
	return timeout + extra
}

// namedElements are the address set elements of an answer for name.
func (f *Firewall) namedElements(guest netip.Addr, name string, ips []netip.Addr, timeout time.Duration) []namedElems {
	if name == "" {
		return nil
	}
	sets := f.named.sets(guest, name)
	if len(sets) == 0 {
		return nil
	}
	var elems []nftables.SetElement
	for _, ip := range ips {
		if ip = ip.Unmap(); ip.Is4() {
			elems = append(elems, nftables.SetElement{Key: ipKey(ip), Timeout: f.addrsTimeout(timeout)})
		}
	}
	if len(elems) == 0 {
		return nil
	}
	out := make([]namedElems, 0, len(sets))
	for _, s := range sets {
		out = append(out, namedElems{set: s, elems: elems})
	}
	return out
}

// mergeNamed concatenates the requests' address set elements per set, each
// key once with its longest timeout: the v4 ones (named), or with v6 the
// v6 ones (named6).
func mergeNamed(reqs []attestReq, v6 bool) []namedElems {
	var out []namedElems
	at := map[string]int{}
	seen := map[[2]string]int{}
	for _, r := range reqs {
		named := r.named
		if v6 {
			named = r.named6
		}
		for _, ne := range named {
			i, ok := at[ne.set]
			if !ok {
				i = len(out)
				at[ne.set] = i
				out = append(out, namedElems{set: ne.set})
			}
			for _, e := range ne.elems {
				k := [2]string{ne.set, string(e.Key)}
				if j, ok := seen[k]; ok {
					out[i].elems[j].Timeout = max(out[i].elems[j].Timeout, e.Timeout)
					continue
				}
				seen[k] = len(out[i].elems)
				out[i].elems = append(out[i].elems, e)
			}
		}
	}
	return out
}

// queueNamed queues the address set elements (after the attested ones:
// in one batch, each is stamped no earlier than the attested element it
// goes with), each set found by set (addrsSet, or addrsSet6 for the v6
// twins).
func (f *Firewall) queueNamed(c *nftables.Conn, named []namedElems, set func(string) *nftables.Set) error {
	for _, ne := range named {
		if err := addElements(c, set(ne.set), ne.elems, false); err != nil {
			return err
		}
	}
	return nil
}

// seedNamed fills the address sets of the name entries in fresh (limited
// by an update that made them so) with the guest's attested addresses
// the entry's port can use: the names the guest resolved before are not
// known here, so every attested address of the session is counted under
// the grant until it expires (more than the name's, never fewer). Called
// once the sets exist and the index names them, so an answer meanwhile is
// either attested (and seen here) or put into the set itself.
func (f *Firewall) seedNamed(guest netip.Addr, fresh []namedLimit) error {
	if len(fresh) == 0 {
		return nil
	}
	att, err := f.Attested(guest)
	if err != nil {
		return err
	}
	return f.admin.do(func(c *nftables.Conn) error {
		queued := false
		for _, l := range fresh {
			var elems, elems6 []nftables.SetElement
			seen := map[netip.Addr]bool{}
			for _, a := range att {
				if seen[a.IP] || (a.Port != 0 && l.entry.Port != 0 && a.Port != l.entry.Port) {
					continue
				}
				seen[a.IP] = true
				if a.IP.Is4() {
					elems = append(elems, nftables.SetElement{Key: ipKey(a.IP), Timeout: f.addrsTimeout(a.Expires)})
				} else if f.dualStack() {
					elems6 = append(elems6, nftables.SetElement{Key: ip6Key(a.IP), Timeout: f.addrsTimeout(a.Expires)})
				}
			}
			if err := addElements(c, f.addrsSet(l.set), elems, false); err != nil {
				return err
			}
			if err := addElements(c, f.addrsSet6(addrs6SetName(l.set)), elems6, false); err != nil {
				return err
			}
			queued = queued || len(elems) > 0 || len(elems6) > 0
		}
		if !queued {
			return nil
		}
		return c.Flush()
	})
}

// freshNamed returns the limited names of b not in a (by set).
func freshNamed(a, b []namedLimit) []namedLimit {
	var out []namedLimit
	for _, y := range b {
		if len(bothNamed(a, []namedLimit{y})) == 0 {
			out = append(out, y)
		}
	}
	return out
}
