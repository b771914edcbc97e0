package eventlog

// What a guest can drive into its session's events, and what it cannot.
//
// The operator's records (kind lifecycle: create, update, exec, delete,
// each with its caller, and the daemon's own adopted and reaped) come
// only from API calls and the daemon: they are kept apart, in memory for
// the session's life and in a file of their own that is never rotated
// (eventstore.go), so no guest traffic pushes them out.
//
// Guest-driven events (kind dns: every decision of the session's
// resolver; kind flow: the drop log's lines and their unlogged
// summaries) are summarised the way the kernel's drop log is: every one
// is counted, exactly, per kind and action (guestTally.counts); their
// lines are a bounded sample, at most guestLineBurst at once and
// guestLineRate a second per session, the rest counted as unlogged and
// reported by one line of kind summary, action unlogged, before the next
// line that passes. Reads end with a line of kind summary, action counts,
// holding the counts (see summaryEvent), which survive any flood.

import (
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// The sample's budget per session: lines of guest-driven events per
// second, and the burst. A session resolving at a build's pace (tens of
// names a second) keeps every line; a flood keeps a sample.
const (
	guestLineRate  = 50
	guestLineBurst = 500
)

// Flow event actions: a flow dropped in silence, a flow the session's
// --on-deny answered (reject, reset: detail "answer" says with what), and
// the summary of the lines the kernel's per-session log budget suppressed.
const (
	FlowActionDropped  = "dropped"
	FlowActionRejected = "rejected"
	FlowActionUnlogged = "unlogged"
)

// Summary event actions (kind api.EventKindSummary).
const (
	SummaryActionUnlogged = "unlogged" // detail.count guest lines left out of the sample here
	SummaryActionCounts   = "counts"   // every guest event counted since creation
)

// isGuestKind reports whether events of kind are driven by the guest.
func isGuestKind(kind string) bool {
	return kind == api.EventKindDNS || kind == api.EventKindFlow
}

// guestTally is one session's counts of guest-driven events and its line
// budget. Log.mu guards it.
type guestTally struct {
	counts   map[string]uint64 // "dns_allowed", "flow_dropped", ... -> events
	unlogged uint64            // lines left out of the sample, since creation
	pending  uint64            // lines left out since the last unlogged line
	tokens   float64
	last     time.Time // when tokens was last refilled
	dirty    bool      // counts changed since they were last written
}

// countKey is the tally key of an event: kind_action.
func countKey(ev api.Event) string { return ev.Kind + "_" + ev.Action }

// count adds ev to the counts: one, or for the drop log's unlogged
// summary the flows it stands for.
func (g *guestTally) count(ev api.Event) {
	if g.counts == nil {
		g.counts = map[string]uint64{}
	}
	n := uint64(1)
	if ev.Kind == api.EventKindFlow && ev.Action == FlowActionUnlogged {
		n = detailCount(ev.Detail["count"])
	}
	g.counts[countKey(ev)] += n
	g.dirty = true
}

func detailCount(v any) uint64 {
	switch v := v.(type) {
	case uint64:
		return v
	case int:
		return uint64(max(v, 0))
	case int64:
		return uint64(max(v, 0))
	case float64:
		return uint64(max(v, 0))
	}
	return 0
}

// take spends a line of the budget at now, reporting whether the line
// goes into the sample; one that does not is counted as unlogged.
func (g *guestTally) take(now time.Time, rate, burst float64) bool {
	if g.last.IsZero() {
		g.tokens, g.last = burst, now
	}
	if el := now.Sub(g.last); el > 0 {
		g.tokens = min(burst, g.tokens+el.Seconds()*rate)
		g.last = now
	}
	if g.tokens >= 1 {
		g.tokens--
		return true
	}
	g.unlogged++
	g.pending++
	g.dirty = true
	return false
}

// unloggedEvent returns the line reporting the lines left out since the
// last one, if any, and resets that count.
func (g *guestTally) unloggedEvent(session string, at time.Time) (api.Event, bool) {
	if g.pending == 0 {
		return api.Event{}, false
	}
	ev := api.Event{Time: at, Session: session, Kind: api.EventKindSummary, Action: SummaryActionUnlogged,
		Detail: map[string]any{"count": g.pending}}
	g.pending = 0
	return ev, true
}

// storedCounts is a session's counts as written to its counts file.
type storedCounts struct {
	Counts   map[string]uint64 `json:"counts"`
	Unlogged uint64            `json:"unlogged"`
}

func (g *guestTally) snapshot() storedCounts {
	c := storedCounts{Counts: make(map[string]uint64, len(g.counts)), Unlogged: g.unlogged}
	for k, v := range g.counts {
		c.Counts[k] = v
	}
	return c
}

func (g *guestTally) restore(c storedCounts) {
	g.counts, g.unlogged = c.Counts, c.Unlogged
}

// summaryEvent is the last line of a session's events as read: every
// guest-driven event counted since the session's creation, by kind_action
// (dns_allowed, dns_denied, flow_dropped, flow_unlogged: the flows the
// kernel's log budget kept out, ...), and unlogged: the lines left out of
// the sample.
func summaryEvent(session string, at time.Time, c storedCounts) api.Event {
	d := map[string]any{"unlogged": c.Unlogged}
	for k, v := range c.Counts {
		d[k] = v
	}
	return api.Event{Time: at, Session: session, Kind: api.EventKindSummary, Action: SummaryActionCounts, Detail: d}
}
