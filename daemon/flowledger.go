package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/daemon/ledger"
	"github.com/enforcerd/enforcerd/internal/nfnetlink"
	"github.com/enforcerd/enforcerd/netpolicy"
	"github.com/enforcerd/enforcerd/nsmgr"
)

// The ledger of admissions: the kernel reports every conntrack entry it
// confirms (NEW: the table accepted the flow's first packet, a dropped
// packet is never confirmed) and every one it destroys, with its
// accounting; flowLedger keeps those whose original source is a session's
// guest in that session's ledger (package ledger), each open classified
// by the session's policy as it stands when the event is read: which
// entry and which generation admitted it (see docs/network-model.md).

// FlowEventSource is the kernel's conntrack event stream
// (*nfnetlink.FlowEvents). Close ends a blocked Receive.
type FlowEventSource interface {
	Receive() ([]nfnetlink.FlowEvent, error)
	Close() error
}

// Timing of the ledger: how often pending aggregates are written, and how
// long a removed session's ledger stays open for the DESTROY events of
// the flows its removal flushes.
const (
	ledgerSocketBuffer = 8 << 20 // bytes of the event socket's receive buffer
	ledgerFlushEvery   = 5 * time.Second
	ledgerCloseGrace   = 5 * time.Second
)

// flowLedger writes the sessions' ledgers. mu guards everything below it.
type flowLedger struct {
	e      *Engine
	dir    string // <state-dir>/events/operator
	budget int

	mu      sync.Mutex
	writers map[string]*ledger.Writer   // by session name
	byGuest map[netip.Addr]string       // guest -> session name; a cache of e.sessions
	removed map[netip.Addr]removedGuest // sessions removed within the grace
}

type removedGuest struct {
	name  string
	until time.Time
}

// ledgerPath is the session's ledger file.
func (e *Engine) ledgerPath(name string) string {
	return filepath.Join(e.cfg.StateDir, "events", "operator", name+ledger.FileExt)
}

// serveLedger reads src until it is closed, writing the ledgers; Close
// (stop) closes src and every ledger.
func (e *Engine) serveLedger(src FlowEventSource, budget int) (stop func()) {
	fl := &flowLedger{e: e, dir: filepath.Dir(e.ledgerPath("x")), budget: budget,
		writers: map[string]*ledger.Writer{}, removed: map[netip.Addr]removedGuest{}}
	e.ledger = fl
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			evs, err := src.Receive()
			if errors.Is(err, nfnetlink.ErrEventsLost) {
				e.log.Error("ledger of admissions: conntrack events lost (socket buffer overflow); the ledger misses flows")
				continue
			}
			if err != nil {
				return
			}
			for _, ev := range evs {
				fl.record(ev)
			}
		}
	}()
	go everyTick(ledgerFlushEvery, quit, func() { fl.flush(time.Now()) })
	return func() {
		close(quit)
		src.Close()
		<-done
		fl.closeAll()
	}
}

// session returns the name of the live (or just removed) session whose
// guest is g.
func (fl *flowLedger) sessionLocked(g netip.Addr) (string, bool) {
	if r, ok := fl.removed[g]; ok {
		return r.name, true
	}
	check := func(name string) bool {
		s, ok := fl.e.sessions[name]
		return ok && s.hasNIC() && s.rec.Guest == g
	}
	fl.e.mu.Lock()
	defer fl.e.mu.Unlock()
	if name, ok := fl.byGuest[g]; ok && check(name) {
		return name, true
	}
	// (a miss is an address of the pool: a session new since the last
	// build, or one gone; rebuilt at once, so a new session's first flow
	// is never missed)
	fl.byGuest = make(map[netip.Addr]string, len(fl.e.sessions))
	for name, s := range fl.e.sessions {
		if s.hasNIC() {
			fl.byGuest[s.rec.Guest] = name
		}
	}
	name, ok := fl.byGuest[g]
	return name, ok
}

func (fl *flowLedger) writerLocked(name string) (*ledger.Writer, error) {
	if w := fl.writers[name]; w != nil {
		return w, nil
	}
	if err := os.MkdirAll(fl.dir, 0o700); err != nil {
		return nil, err
	}
	w, err := ledger.Open(name, fl.e.ledgerPath(name), fl.budget)
	if err != nil {
		return nil, err
	}
	fl.writers[name] = w
	return w, nil
}

// record writes one event to its session's ledger; events of other
// addresses (the host's, lab peers' flows into a session) are skipped.
func (fl *flowLedger) record(ev nfnetlink.FlowEvent) {
	f := ev.Flow
	if f.Dst == fl.e.dnsAddr {
		return // the daemon's own DNS proxy: its answers are in the events
	}
	if !fl.e.cfg.Pool.Contains(f.Src) {
		return // the host's own flows (every flow of the netns is an event): no lock, no lookup
	}
	fl.mu.Lock()
	name, ok := fl.sessionLocked(f.Src)
	var w *ledger.Writer
	var err error
	if ok {
		w, err = fl.writerLocked(name)
	}
	fl.mu.Unlock()
	if !ok {
		return
	}
	if err != nil {
		fl.e.log.Error("ledger of admissions: open the session's ledger", "session", name, "err", err)
		return
	}
	now := time.Now().UTC()
	lf := ledger.Flow{Time: now, CtID: ev.ID, Proto: f.Proto, Src: f.Src, Dst: f.Dst, Sport: f.Sport, Dport: f.Dport}
	switch ev.Type {
	case nfnetlink.FlowNew:
		lf.Dest = fl.e.admittedBy(name, f.Dst, f.Dport, f.Proto)
		err = w.Opened(lf)
	case nfnetlink.FlowDestroy:
		if !w.Knows(ev.ID) {
			// (its open was not seen: the entry is read now, else the open's is kept)
			lf.Dest = fl.e.admittedBy(name, f.Dst, f.Dport, f.Proto)
		}
		lf.Start = ev.Start
		if !ev.Stop.IsZero() {
			lf.Time = ev.Stop
		}
		lf.Counts = ledger.Counts{BytesOut: ev.Orig.Bytes, BytesIn: ev.Reply.Bytes, PacketsOut: ev.Orig.Packets, PacketsIn: ev.Reply.Packets}
		err = w.Closed(lf)
	}
	if err != nil {
		fl.e.log.Error("ledger of admissions: write", "session", name, "err", err)
	}
}

// admittedBy says which entry of the session's policy, at which
// generation, admits dst:dport/proto now: the same reading as why.
func (e *Engine) admittedBy(name string, dst netip.Addr, dport uint16, proto uint8) ledger.Dest {
	e.mu.Lock()
	s, ok := e.sessions[name]
	e.mu.Unlock()
	if !ok {
		return ledger.Dest{Via: "unknown"}
	}
	d := whyDest{addr: dst}
	switch proto {
	case 6:
		d.port, d.proto = dport, netpolicy.ProtoTCP
	case 17:
		d.port, d.proto = dport, netpolicy.ProtoUDP
	}
	dest := ledger.Dest{Generation: max(s.rec.Generation, 1)}
	v := e.whyAddr(s, d, dst, nil)
	if v.Verdict != api.WhyAllowed {
		// Not by an entry the daemon holds: the kernel admitted it by an
		// attested element. The name whose answer attested it is in memory
		// (the DNS path notes it); only an address it does not know (a
		// restart since the answer) costs a read of the kernel's sets.
		if by, ok := e.names.lookupRecord(name, dst); ok {
			dest.Via, dest.Entry, dest.AttestedName = "attested", by.name, by.name
			return dest
		}
		if att, err := e.attestedOf(s); err == nil && len(att) > 0 {
			v = e.whyAddr(s, d, dst, att)
		}
	}
	if v.Verdict != api.WhyAllowed {
		// Admitted by the kernel, and the policy as it reads now does not
		// (an update or an expiry came between): said so, not guessed.
		dest.Via = "unknown"
		return dest
	}
	dest.Via, dest.Entry, dest.AttestedName = v.Reason, v.entry, v.AttestedName
	if dest.Entry == "" && v.AttestedName != "" {
		dest.Entry = v.AttestedName
	}
	return dest
}

// flush writes every ledger's pending aggregates and closes the ledgers
// of sessions removed more than the grace ago.
func (fl *flowLedger) flush(now time.Time) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	for g, r := range fl.removed {
		if now.After(r.until) {
			delete(fl.removed, g)
			if w := fl.writers[r.name]; w != nil {
				if err := w.Close(); err != nil {
					fl.e.log.Error("ledger of admissions: close", "session", r.name, "err", err)
				}
				delete(fl.writers, r.name)
			}
		}
	}
	for name, w := range fl.writers {
		if err := w.Flush(); err != nil {
			fl.e.log.Error("ledger of admissions: flush", "session", name, "err", err)
		}
	}
}

// removedSession keeps the removed session's ledger open for the grace:
// the DESTROY events of the flows its removal flushes still come. Its
// head goes to the log (the journal under systemd): an anchor outside
// the file.
func (e *Engine) ledgerSessionRemoved(name string, guest netip.Addr) {
	fl := e.ledger
	if fl == nil {
		return
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if guest.IsValid() {
		fl.removed[guest] = removedGuest{name: name, until: time.Now().Add(ledgerCloseGrace)}
	}
	if w := fl.writers[name]; w != nil {
		seq, head := w.Head()
		e.log.Info("ledger of admissions: head at removal", "session", name, "seq", seq, "head", head)
	}
}

func (fl *flowLedger) closeAll() {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	for name, w := range fl.writers {
		seq, head := w.Head()
		if err := w.Close(); err != nil {
			fl.e.log.Error("ledger of admissions: close", "session", name, "err", err)
		}
		if seq > 0 {
			fl.e.log.Info("ledger of admissions: head", "session", name, "seq", seq, "head", head)
		}
		delete(fl.writers, name)
	}
}

// Report verifies the session's ledger and sums it per destination; a
// removed session's while its files are retained. A live writer's head
// is what the file must end at.
func (e *Engine) Report(ctx context.Context, name string) (api.LedgerReport, error) {
	if err := nsmgr.ValidateSessionName(name); err != nil {
		return api.LedgerReport{}, badRequest(fmt.Errorf("session %q: %w", name, err))
	}
	e.mu.Lock()
	_, live := e.sessions[name]
	e.mu.Unlock()
	var seq uint64
	var head string
	if fl := e.ledger; fl != nil {
		fl.mu.Lock()
		w := fl.writers[name]
		fl.mu.Unlock()
		if w != nil {
			if err := w.Flush(); err != nil {
				return api.LedgerReport{}, fmt.Errorf("session %q: flush its ledger: %w", name, err)
			}
			seq, head = w.Head()
		}
	}
	rep, err := ledger.Read(name, e.ledgerPath(name), seq, head)
	if errors.Is(err, os.ErrNotExist) {
		if live {
			return api.LedgerReport{Session: name, Verified: true, Destinations: []api.LedgerDestination{}}, nil
		}
		return rep, fmt.Errorf("session %q: %w", name, api.ErrNotFound)
	}
	return rep, err
}
