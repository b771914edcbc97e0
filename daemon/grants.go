package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// ReasonGrantExpired is session why's reason for a destination that only
// an ended grant with an end (allow_for) allowed.
const ReasonGrantExpired = "grant-expired"

// grantRetry is how soon an expiry that found the session busy (another
// operation on it in progress) tries again.
const grantRetry = time.Second

// grantErrorRetry is how soon an expiry whose update failed tries again.
const grantErrorRetry = 10 * time.Second

// GrantRecord is one grant in a session's record: the allow entries of one
// create or update call given with allow_for (the deadline computed then;
// zero without), connections or budget (limits.go). Ended is set by the
// update that revoked them at the deadline.
type GrantRecord struct {
	Entries         []string   `json:"entries"`
	Deadline        time.Time  `json:"deadline"`
	KeepEstablished bool       `json:"keep_established,omitempty"`
	Ended           *time.Time `json:"ended,omitempty"`
	Connections     uint32     `json:"connections,omitempty"`
	Budget          uint64     `json:"budget,omitempty"`
}

// hasEnd reports whether the grant has a deadline.
func (g GrantRecord) hasEnd() bool { return !g.Deadline.IsZero() }

// errKeepWithoutGrant refuses keep_established at create without
// allow_for: there it only applies to a grant's end (an update's
// keep_established also applies to its own revocations).
var errKeepWithoutGrant = errors.New("keep_established at create only applies to a grant's end: want it with allow_for (--for)")

// grantAsk is what a create or update call asks of its allow entries.
type grantAsk struct {
	allowFor    string // a Go duration; "" for no end
	keep        bool
	connections uint32
	budget      uint64
}

// newGrant returns the grant of a call's allow entries, or nil when the
// call asks for no end, count or budget.
func newGrant(allow []string, ask grantAsk, now time.Time) (*GrantRecord, error) {
	if ask.allowFor == "" && ask.connections == 0 && ask.budget == 0 {
		return nil, nil
	}
	g := &GrantRecord{Entries: slices.Clone(allow), Connections: ask.connections, Budget: ask.budget}
	if ask.allowFor != "" {
		d, err := time.ParseDuration(ask.allowFor)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("allow_for %q: want a positive duration such as 90s, 10m or 2h", ask.allowFor)
		}
		if len(allow) == 0 {
			return nil, fmt.Errorf("allow_for %q with no allow entries: want --allow ENTRY --for DURATION (it applies to the allow entries of the same call)", ask.allowFor)
		}
		g.Deadline, g.KeepEstablished = now.Add(d).UTC(), ask.keep
	}
	if len(allow) == 0 {
		return nil, fmt.Errorf("connections %d, budget %d with no allow entries: want --allow ENTRY with --connections N or --budget SIZE (they apply to the allow entries of the same call)", ask.connections, ask.budget)
	}
	return g, nil
}

// dueGrants returns the indexes of the grants not yet ended whose
// deadline is at or before now.
func dueGrants(gs []GrantRecord, now time.Time) []int {
	var out []int
	for i, g := range gs {
		if g.hasEnd() && g.Ended == nil && !g.Deadline.After(now) {
			out = append(out, i)
		}
	}
	return out
}

// endDueGrants marks every due grant ended at now.
func endDueGrants(gs []GrantRecord, now time.Time) []GrantRecord {
	gs = slices.Clone(gs)
	for _, i := range dueGrants(gs, now) {
		t := now.UTC()
		gs[i].Ended = &t
	}
	return gs
}

// nextDeadline is the earliest deadline of a grant not yet ended.
func nextDeadline(gs []GrantRecord) (time.Time, bool) {
	var next time.Time
	for _, g := range gs {
		if g.hasEnd() && g.Ended == nil && (next.IsZero() || g.Deadline.Before(next)) {
			next = g.Deadline
		}
	}
	return next, !next.IsZero()
}

// grantViews is how inspect shows a session's grants; with use (read
// from the kernel), what each entry still limited by a grant has left.
func grantViews(gs []GrantRecord, lim sessionLimits, use *nft.LimitUsage) []api.GrantView {
	var out []api.GrantView
	for i, g := range gs {
		v := api.GrantView{Entries: g.Entries, KeepEstablished: g.KeepEstablished, Ended: g.Ended, Connections: g.Connections, Budget: g.Budget}
		if g.hasEnd() {
			d := g.Deadline
			v.Deadline = &d
		}
		if use != nil {
			for _, ent := range lim.entries {
				u := use.Entries[ent.limit.ID]
				if ent.connGrant == i {
					if v.Remaining == nil {
						v.Remaining = map[string]uint32{}
					}
					v.Remaining[ent.entry] = ent.limit.Connections - min(u.Used, ent.limit.Connections)
				}
				if ent.budgetGrant == i {
					if v.Spent == nil {
						v.Spent = map[string]uint64{}
					}
					v.Spent[ent.entry] = u.Spent
				}
			}
		}
		out = append(out, v)
	}
	return out
}

// scheduleGrants arms the session's grant timer for the earliest deadline
// of its grants not yet ended (a past one fires at once: a restart after
// the deadline ends the grant as soon as the session is adopted).
func (e *Engine) scheduleGrants(rec SessionRecord) {
	next, ok := nextDeadline(rec.Grants)
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.grantTimers[rec.Name]; t != nil {
		t.Stop()
		delete(e.grantTimers, rec.Name)
	}
	if !ok || e.grantsStopped {
		return
	}
	name := rec.Name
	e.grantTimers[name] = time.AfterFunc(time.Until(next), func() { e.expireGrants(name) })
}

// stopGrants stops every grant timer (Close): the deadlines stay in the
// records for the next start.
func (e *Engine) stopGrants() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.grantsStopped = true
	for name, t := range e.grantTimers {
		t.Stop()
		delete(e.grantTimers, name)
	}
}

// expireGrants ends the session's due grants: their entries still in the
// policy are revoked by an update (UpdatePolicy marks the grants ended in
// the same record), each grant's end is an operator event, and the timer
// is armed for the next deadline.
func (e *Engine) expireGrants(name string) {
	e.mu.Lock()
	s, ok := e.sessions[name]
	stopped := e.grantsStopped
	e.mu.Unlock()
	if !ok || stopped {
		return
	}
	now := time.Now()
	due := dueGrants(s.rec.Grants, now)
	if len(due) == 0 {
		e.scheduleGrants(s.rec)
		return
	}
	var revoke []string
	keep := true
	for _, i := range due {
		g := s.rec.Grants[i]
		keep = keep && g.KeepEstablished
		for _, ent := range g.Entries {
			if e.allowHas(s.rec.Request.Allow, ent) && !slices.Contains(revoke, ent) {
				revoke = append(revoke, ent)
			}
		}
	}
	ctx := context.Background()
	var info api.SessionInfo
	var err error
	if len(revoke) > 0 {
		info, err = e.UpdatePolicy(context.WithValue(ctx, grantExpiryKey{}, true), name, api.PolicyUpdate{Revoke: revoke, KeepEstablished: keep}, false)
	} else {
		err = e.markGrantsEnded(name, now)
	}
	if errors.Is(err, api.ErrBusy) {
		e.retryGrants(name, grantRetry)
		return
	}
	for _, i := range due {
		g := s.rec.Grants[i]
		d := map[string]any{"entries": g.Entries, "deadline": g.Deadline, "revoked": revoke, "keep_established": g.KeepEstablished, "reason": ReasonGrantExpired}
		if len(revoke) > 0 && err == nil {
			d["generation"] = info.Policy.Generation
		}
		e.recordCall(ctx, name, "grant_expired", d, err)
	}
	if err != nil {
		// The grant is still open (the update changed nothing): try
		// again, without an event a second.
		e.log.Error("a grant's end failed; retrying", "session", name, "err", err)
		e.retryGrants(name, grantErrorRetry)
		return
	}
	e.mu.Lock()
	s, ok = e.sessions[name]
	e.mu.Unlock()
	if ok {
		e.scheduleGrants(s.rec)
	}
}

// retryGrants runs the session's grant expiry again after d.
func (e *Engine) retryGrants(name string, d time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t := e.grantTimers[name]; t != nil {
		t.Stop()
	}
	if !e.grantsStopped {
		e.grantTimers[name] = time.AfterFunc(d, func() { e.expireGrants(name) })
	}
}

// grantExpiryKey marks the context of the update that ends a grant: a
// locked session's grants end too (the lock refuses callers' updates).
type grantExpiryKey struct{}

// markGrantsEnded records the due grants of a session whose entries were
// all revoked already (by a caller's update) as ended.
func (e *Engine) markGrantsEnded(name string, now time.Time) error {
	s, err := e.reserve(name, true)
	if err != nil {
		return err
	}
	defer e.release(name)
	next := *s
	next.rec.Grants = endDueGrants(s.rec.Grants, now)
	if err := e.state.Save(next.rec); err != nil {
		return fmt.Errorf("record the end of a grant of %s: %w", name, err)
	}
	e.mu.Lock()
	e.sessions[name] = &next
	e.mu.Unlock()
	return nil
}

// allowHas reports whether allow holds ent (compared as parsed entries).
func (e *Engine) allowHas(allow []string, ent string) bool {
	want, err := netpolicy.ParseEntry(ent, e.guard)
	if err != nil {
		return slices.Contains(allow, ent)
	}
	return slices.ContainsFunc(allow, func(a string) bool {
		x, err := netpolicy.ParseEntry(a, e.guard)
		return err == nil && x.String() == want.String()
	})
}

// endedGrantFor returns the entry of an ended grant that covers the name
// (or, with name "", the address), and its grant: session why's answer
// for a destination the policy no longer allows because a grant ended.
func (e *Engine) endedGrantFor(s *liveSession, name string, addr netip.Addr) (string, GrantRecord, bool) {
	for i := len(s.rec.Grants) - 1; i >= 0; i-- {
		g := s.rec.Grants[i]
		if g.Ended == nil {
			continue
		}
		for _, raw := range g.Entries {
			ent, err := netpolicy.ParseEntry(raw, e.guard)
			if err != nil {
				continue
			}
			switch {
			case name != "" && ent.Kind != netpolicy.KindCIDR && ent.MatchesName(name),
				name == "" && ent.Kind == netpolicy.KindCIDR && ent.Prefix.Contains(addr):
				return ent.String(), g, true
			}
		}
	}
	return "", GrantRecord{}, false
}

// grantExpiredDetail is session why's detail for an ended grant's entry.
func grantExpiredDetail(entry string, g GrantRecord) string {
	return fmt.Sprintf("the grant of %q ended at %s (its deadline %s): the policy no longer allows it", entry, g.Ended.Format(time.RFC3339), g.Deadline.Format(time.RFC3339))
}
