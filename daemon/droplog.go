package daemon

import (
	"net/netip"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/daemon/eventlog"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/netpolicy/nft"
)

// DropSource is the table's drop log (*nft.DropLog): each line is the
// first packet of a flow the table dropped, with its reason. Close ends a
// blocked Read.
type DropSource interface {
	Read() ([]nft.DroppedFlow, error)
	Close() error
}

// Answers of a rejected flow (the event's detail "answer").
const (
	AnswerAdminProhibited = "icmp-admin-prohibited"
	AnswerTCPReset        = "tcp-reset"
)

// unloggedPoll is how often the suppressed-line counts are read while drop
// lines arrive (and once more after they stop): a flood's summary event
// comes within about this long.
const unloggedPoll = time.Second

// dropEvents turns drop lines into session events. The kernel bounds the
// lines (each session's log budget), so this costs the daemon at most that
// many events per session and second, whatever a session sends; the lines
// it suppresses are counted in the kernel and reported here as one summary
// event per poll. mu guards everything below it.
type dropEvents struct {
	d *Engine

	mu       sync.Mutex
	byGuest  map[netip.Addr]string // guest -> session name; a cache of d.sessions
	built    time.Time             // when byGuest was last rebuilt
	lastLine time.Time             // when the last line arrived
	unlogged map[string]uint64     // session -> suppressed lines already reported
	start    time.Time             // sessions created before it count from their first poll
}

// serveDrops reads src until it is closed, recording a flow event per line
// and the summary events, in goroutines of its own.
func (e *Engine) serveDrops(src DropSource) {
	de := &dropEvents{d: e, unlogged: map[string]uint64{}, start: time.Now()}
	stop := make(chan struct{})
	go func() {
		defer close(stop)
		for {
			fls, err := src.Read()
			if err != nil {
				return
			}
			for _, fl := range fls {
				de.record(fl)
			}
		}
	}()
	go de.pollUnlogged(stop)
}

// session returns the name of the session whose guest address is g.
func (de *dropEvents) session(g netip.Addr) (string, bool) {
	de.mu.Lock()
	defer de.mu.Unlock()
	check := func(name string) bool {
		s, ok := de.d.sessions[name]
		return ok && s.hasNIC() && s.rec.Guest == g
	}
	de.d.mu.Lock()
	defer de.d.mu.Unlock()
	if name, ok := de.byGuest[g]; ok && check(name) {
		return name, true
	}
	// A miss rebuilds the cache, at most every 100 ms: lines of a session
	// just removed (or not yet recorded) do not make every line a scan.
	if time.Since(de.built) < 100*time.Millisecond {
		return "", false
	}
	de.byGuest = make(map[netip.Addr]string, len(de.d.sessions))
	for name, s := range de.d.sessions {
		if s.hasNIC() {
			de.byGuest[s.rec.Guest] = name
		}
	}
	de.built = time.Now()
	name, ok := de.byGuest[g]
	return name, ok
}

func (de *dropEvents) record(fl nft.DroppedFlow) {
	de.mu.Lock()
	de.lastLine = time.Now()
	de.mu.Unlock()
	name, ok := de.session(fl.Guest)
	if !ok {
		return
	}
	detail := flowDetail(fl, de.d.guard)
	if (fl.Reason == netpolicy.ReasonBudget || fl.Reason == netpolicy.ReasonGrantUsed) && !de.d.limitReached(name, fl) {
		return
	}
	if fl.Reason == netpolicy.ReasonNotAllowed {
		if n, ok := de.d.names.lookup(name, fl.Dst); ok {
			// Attested for the session, and no longer: nothing else of its
			// policy allows the address (an update forgets what it revokes).
			detail["reason"], detail["name"] = ReasonExpired, n
		}
	}
	if fl.Reason == netpolicy.ReasonDenied {
		if ent, ok := de.d.denyEntry(name, fl.Dst, fl.DstPort, netpolicy.Proto(fl.Proto)); ok {
			detail["entry"] = ent.String()
		}
	}
	action := eventlog.FlowActionDropped
	if answer := de.d.denyAnswer(name, fl); answer != "" {
		action, detail["answer"] = eventlog.FlowActionRejected, answer
	}
	ev := api.Event{Time: time.Now().UTC(), Session: name, Kind: api.EventKindFlow, Action: action, Detail: detail}
	de.d.events.RecordAsync(ev)
	// Under systemd the journal keeps it too, with structured fields; the
	// kernel's per-session log budget bounds how many lines a flood makes.
	de.d.logEvent(ev)
}

// denyAnswer is what the named session's table answered the dropped flow
// with (AnswerAdminProhibited, AnswerTCPReset), or "" for silence: the
// session's --on-deny, for the reasons the table answers at all.
func (e *Engine) denyAnswer(name string, fl nft.DroppedFlow) string {
	e.mu.Lock()
	s, ok := e.sessions[name]
	e.mu.Unlock()
	if !ok || !s.policy.OnDeny.Answers() || !netpolicy.AnsweredReason(fl.Reason) {
		return ""
	}
	if s.policy.OnDeny == netpolicy.DenyReset && fl.Proto == "tcp" {
		return AnswerTCPReset
	}
	return AnswerAdminProhibited
}

// denyEntry is the deny entry of the named session's policy that denies
// dst (on dport/proto), if any.
func (e *Engine) denyEntry(name string, dst netip.Addr, dport uint16, proto netpolicy.Proto) (netpolicy.Entry, bool) {
	e.mu.Lock()
	s, ok := e.sessions[name]
	e.mu.Unlock()
	if !ok {
		return netpolicy.Entry{}, false
	}
	return deniedAddr(s.policy, dst, dport, proto)
}

// flowDetail is a dropped flow as its event shows it: proto, dst, dport
// (TCP and UDP), reason; the range for special-purpose, the source for
// spoofed and inbound flows.
func flowDetail(fl nft.DroppedFlow, g *netpolicy.Guard) map[string]any {
	d := map[string]any{"proto": fl.Proto, "dst": fl.Dst.String(), "reason": fl.Reason}
	if fl.Proto == "tcp" || fl.Proto == "udp" {
		d["dport"] = fl.DstPort
	}
	switch fl.Reason {
	case netpolicy.ReasonSpecialPurpose:
		if g != nil {
			if r, ok := g.BlockedBy(fl.Dst); ok {
				d["range"] = r.String()
			}
		}
	case netpolicy.ReasonSpoofed, netpolicy.ReasonInbound:
		d["src"] = fl.Src.String()
	}
	return d
}

// pollUnlogged reports, while lines arrive and once after, each session's
// lines the kernel suppressed since the last report: one event per
// session and poll, {"count": N}.
func (de *dropEvents) pollUnlogged(stop <-chan struct{}) {
	everyTick(unloggedPoll, stop, de.reportUnlogged)
}

// reportUnlogged is one poll of pollUnlogged.
func (de *dropEvents) reportUnlogged() {
	de.mu.Lock()
	active := time.Since(de.lastLine) < 2*unloggedPoll
	de.mu.Unlock()
	if !active {
		return
	}
	all, err := de.d.fw.AllCounters()
	if err != nil {
		de.d.log.Warn("read drop counters", "err", err)
		return
	}
	type report struct {
		name string
		n    uint64
	}
	var out []report
	de.mu.Lock() // de.mu before d.mu, as in session
	de.d.mu.Lock()
	for name, s := range de.d.sessions {
		if !s.hasNIC() {
			continue
		}
		now := all[s.rec.Guest].Unlogged
		last, seen := de.unlogged[name]
		if !seen && s.rec.Created.Before(de.start) {
			// Adopted at a restart: what it suppressed before is not
			// reported again.
			de.unlogged[name] = now
			continue
		}
		if now < last {
			last = 0 // a new session on the name
		}
		if now > last {
			out = append(out, report{name, now - last})
		}
		de.unlogged[name] = now
	}
	for name := range de.unlogged {
		if _, ok := de.d.sessions[name]; !ok {
			delete(de.unlogged, name)
		}
	}
	de.d.mu.Unlock()
	de.mu.Unlock()
	for _, r := range out {
		ev := api.Event{Time: time.Now().UTC(), Session: r.name, Kind: api.EventKindFlow, Action: eventlog.FlowActionUnlogged,
			Detail: map[string]any{"count": r.n}}
		de.d.events.RecordAsync(ev)
		de.d.logEvent(ev)
	}
}
