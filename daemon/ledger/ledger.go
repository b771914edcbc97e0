package ledger

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/enforcerd/enforcerd/api"
)

// FileExt is a ledger file's suffix, after the session's name.
const FileExt = ".ledger.ndjson"

// DefaultBudget is a session's line budget: past it flows go to aggregates.
const DefaultBudget = 100000

// Record kinds.
const (
	KindOpen      = "open"      // the table admitted a new flow
	KindClose     = "close"     // a flow ended: duration and bytes
	KindAggregate = "aggregate" // flows past the line budget, summed per destination
)

// Record is one line of a ledger. Hash is the hex SHA-256 of Prev (the
// previous record's Hash, "" for the first) followed by the record's
// canonical JSON (this struct marshalled with Hash empty); the first
// record's Prev is Genesis of the session's name.
type Record struct {
	Seq   uint64    `json:"seq"`
	Time  time.Time `json:"time"`
	Kind  string    `json:"kind"`
	Proto string    `json:"proto"`
	Src   string    `json:"src,omitempty"`
	Sport uint16    `json:"sport,omitempty"`
	Dst   string    `json:"dst"`
	Dport uint16    `json:"dport,omitempty"`
	CtID  uint32    `json:"ct_id,omitempty"` // the conntrack entry's id
	Dest            // how it was admitted
	// Close: how long the flow lasted and what it carried each way.
	DurationMs uint64 `json:"duration_ms,omitempty"`
	Counts
	// Aggregate: how many flows, first and last seen.
	Connections uint64     `json:"connections,omitempty"`
	First       *time.Time `json:"first,omitempty"`
	Last        *time.Time `json:"last,omitempty"`
	Prev        string     `json:"prev"`
	Hash        string     `json:"hash,omitempty"`
}

// Dest is what admitted a flow.
type Dest struct {
	Via          string `json:"via"` // static, pinned, attested, lab-peer, public or unknown
	Entry        string `json:"entry,omitempty"`
	AttestedName string `json:"attested_name,omitempty"`
	Generation   uint64 `json:"generation"`
}

// Counts are a flow's accounting, out = sent by the guest.
type Counts struct {
	BytesOut   uint64 `json:"bytes_out,omitempty"`
	BytesIn    uint64 `json:"bytes_in,omitempty"`
	PacketsOut uint64 `json:"packets_out,omitempty"`
	PacketsIn  uint64 `json:"packets_in,omitempty"`
}

// Flow is one admitted flow as the daemon reports it.
type Flow struct {
	Time     time.Time
	CtID     uint32
	Proto    uint8
	Src, Dst netip.Addr
	Sport    uint16
	Dport    uint16
	Dest     Dest
	Start    time.Time // Close: when it began, if the kernel says (else the open's time)
	Counts   Counts    // Close only
}

// ProtoName names a protocol number as the report does.
func ProtoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return strconv.Itoa(int(p))
}

// hashRecord is the chain's link: SHA-256 of prev and the canonical JSON.
func hashRecord(r Record) (string, error) {
	r.Hash = ""
	b, err := json.Marshal(r)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write([]byte(r.Prev))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// aggKey is a destination under one entry and generation.
type aggKey struct {
	dst   string
	dport uint16
	proto string
	Dest
}

type aggregate struct {
	conns       uint64
	counts      Counts
	first, last time.Time
}

// Writer appends to one session's ledger. mu guards everything.
type Writer struct {
	mu     sync.Mutex
	path   string
	f      *os.File
	seq    uint64
	head   string
	lines  int
	budget int
	open   map[uint32]openFlow // ct id -> the open flow's record, to close it alike
	agg    map[aggKey]*aggregate
}

type openFlow struct {
	dest  Dest
	start time.Time
	lined bool // its open has a line
}

// Genesis is the Prev of a session's first record: the hash of the
// session's name, so a ledger copied under another session's name does
// not verify.
func Genesis(session string) string {
	h := sha256.Sum256([]byte("enforcerd ledger of admissions: " + session))
	return hex.EncodeToString(h[:])
}

// Open opens (or makes) the ledger of session at path and continues its
// chain from its last record; budget bounds the open and close lines (0:
// DefaultBudget).
func Open(session, path string, budget int) (*Writer, error) {
	if budget <= 0 {
		budget = DefaultBudget
	}
	w := &Writer{path: path, budget: budget, open: map[uint32]openFlow{}, agg: map[aggKey]*aggregate{}}
	seq, head, lines, err := tail(path)
	if err != nil {
		return nil, err
	}
	if seq == 0 {
		head = Genesis(session)
	}
	w.seq, w.head, w.lines = seq, head, lines
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open ledger %s: %w", path, err)
	}
	w.f = f
	return w, nil
}

// tail reads the last record's sequence and hash and counts the lines.
func tail(path string) (seq uint64, head string, lines int, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, "", 0, nil
	}
	if err != nil {
		return 0, "", 0, fmt.Errorf("read ledger %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var r Record
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			seq, head = r.Seq, r.Hash
		}
		lines++
	}
	return seq, head, lines, sc.Err()
}

// Head returns the last record's sequence number and hash.
func (w *Writer) Head() (uint64, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seq, w.head
}

// appendLocked chains r after the head and writes it.
func (w *Writer) appendLocked(r Record) error {
	if w.f == nil {
		return fmt.Errorf("ledger %s: closed", w.path)
	}
	r.Seq, r.Prev = w.seq+1, w.head
	r.Time = r.Time.UTC()
	h, err := hashRecord(r)
	if err != nil {
		return err
	}
	r.Hash = h
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := w.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write ledger %s: %w", w.path, err)
	}
	w.seq, w.head = r.Seq, r.Hash
	w.lines++
	return nil
}

func flowRecord(kind string, fl Flow) Record {
	return Record{
		Time: fl.Time, Kind: kind, Proto: ProtoName(fl.Proto), Src: fl.Src.String(), Sport: fl.Sport,
		Dst: fl.Dst.String(), Dport: fl.Dport, CtID: fl.CtID, Dest: fl.Dest,
	}
}

func (w *Writer) fold(fl Flow, d Dest, conns uint64, c Counts) {
	k := aggKey{dst: fl.Dst.String(), dport: fl.Dport, proto: ProtoName(fl.Proto), Dest: d}
	a := w.agg[k]
	if a == nil {
		a = &aggregate{first: fl.Time.UTC()}
		w.agg[k] = a
	}
	a.conns += conns
	a.counts.BytesOut += c.BytesOut
	a.counts.BytesIn += c.BytesIn
	a.counts.PacketsOut += c.PacketsOut
	a.counts.PacketsIn += c.PacketsIn
	if t := fl.Time.UTC(); t.After(a.last) {
		a.last = t
	}
}

// Opened records a new admitted flow: a line while the budget lasts, else
// a count in its destination's aggregate.
func (w *Writer) Opened(fl Flow) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	of := openFlow{dest: fl.Dest, start: fl.Time}
	if w.lines < w.budget {
		if err := w.appendLocked(flowRecord(KindOpen, fl)); err != nil {
			return err
		}
		of.lined = true
	} else {
		w.fold(fl, fl.Dest, 1, Counts{})
	}
	if fl.CtID != 0 {
		w.open[fl.CtID] = of
	}
	return nil
}

// Closed records the end of a flow, under what admitted its open when
// this writer saw it (else fl.Dest). A flow whose open has no line (it
// was aggregated, or opened while the daemon was down) is counted as a
// connection by the report when its close has none either.
// Knows reports whether the flow of conntrack id ctID was seen opening
// (Closed then keeps the entry recorded at its open).
func (w *Writer) Knows(ctID uint32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.open[ctID]
	return ok
}

func (w *Writer) Closed(fl Flow) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	of, known := w.open[fl.CtID]
	delete(w.open, fl.CtID)
	if known {
		fl.Dest = of.dest
	}
	start := fl.Start
	if start.IsZero() && known {
		start = of.start
	}
	if w.lines < w.budget && (!known || of.lined) {
		r := flowRecord(KindClose, fl)
		r.Counts = fl.Counts
		if !start.IsZero() && fl.Time.After(start) {
			r.DurationMs = uint64(fl.Time.Sub(start) / time.Millisecond)
		}
		return w.appendLocked(r)
	}
	conns := uint64(0)
	if !known {
		conns = 1 // its open was never counted here
	}
	w.fold(fl, fl.Dest, conns, fl.Counts)
	return nil
}

// Flush writes the pending aggregates (one record per destination) and
// syncs the file.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.flushLocked()
}

func (w *Writer) flushLocked() error {
	if w.f == nil {
		return nil
	}
	keys := make([]aggKey, 0, len(w.agg))
	for k := range w.agg {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].dst != keys[j].dst {
			return keys[i].dst < keys[j].dst
		}
		return keys[i].dport < keys[j].dport
	})
	for _, k := range keys {
		a := w.agg[k]
		first, last := a.first, a.last
		r := Record{Time: last, Kind: KindAggregate, Proto: k.proto, Dst: k.dst, Dport: k.dport, Dest: k.Dest,
			Counts: a.counts, Connections: a.conns, First: &first, Last: &last}
		if err := w.appendLocked(r); err != nil {
			return err
		}
		delete(w.agg, k)
	}
	return w.f.Sync()
}

// Close flushes and closes the file; it is idempotent.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.flushLocked()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.f = nil
	return err
}

// Read verifies the ledger at path and sums it per destination. A broken
// chain is a report with Verified false and Broken naming the first
// break; the sums still cover every record that parses. want, if not
// zero, is the sequence the file must end at (the running writer's head).
func Read(session, path string, wantSeq uint64, wantHead string) (api.LedgerReport, error) {
	rep := api.LedgerReport{Session: session, Destinations: []api.LedgerDestination{}}
	f, err := os.Open(path)
	if err != nil {
		return rep, err
	}
	defer f.Close()
	sums := map[aggKey]*api.LedgerDestination{}
	var order []aggKey
	openIDs := map[uint32]aggKey{} // the open flows' ct ids, and their destination
	breakAt := func(line int, format string, args ...any) {
		if rep.Broken == "" {
			rep.Broken = fmt.Sprintf("line %d: ", line) + fmt.Sprintf(format, args...)
		}
	}
	var prevSeq uint64
	prevHash := Genesis(session)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		raw := bytes.TrimSpace(sc.Bytes())
		if len(raw) == 0 {
			breakAt(line, "an empty line")
			continue
		}
		var r Record
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			breakAt(line, "not a ledger record: %v", err)
			continue
		}
		rep.Records++
		if r.Seq != prevSeq+1 {
			breakAt(line, "sequence %d follows %d: a record is missing or out of place", r.Seq, prevSeq)
		}
		switch {
		case r.Prev == prevHash:
		case prevSeq == 0:
			breakAt(line, "record %d does not start session %q's chain: the file is another's, or its start was removed", r.Seq, session)
		default:
			breakAt(line, "record %d's previous hash is not record %d's: the chain is cut", r.Seq, prevSeq)
		}
		if h, err := hashRecord(r); err != nil || h != r.Hash {
			breakAt(line, "record %d's hash does not match its content: the record was changed", r.Seq)
		}
		prevSeq, prevHash = r.Seq, r.Hash
		k := aggKey{dst: r.Dst, dport: r.Dport, proto: r.Proto, Dest: r.Dest}
		opened, wasOpen := openIDs[r.CtID]
		if r.Kind == KindClose && r.CtID != 0 && wasOpen {
			// a close under its open's entry and generation, whatever the
			// writer knew when it closed (a restart forgets the open flows)
			k = opened
		}
		d := sums[k]
		if d == nil {
			d = &api.LedgerDestination{Dest: r.Dst, Port: r.Dport, Proto: r.Proto, Via: r.Via, Entry: r.Entry,
				AttestedName: r.AttestedName, Generation: r.Generation}
			sums[k] = d
			order = append(order, k)
		}
		first, last := r.Time, r.Time
		switch r.Kind {
		case KindOpen:
			d.Connections++
			if r.CtID != 0 {
				openIDs[r.CtID] = k
			}
		case KindClose:
			if r.CtID == 0 || !wasOpen {
				d.Connections++ // opened while unrecorded (the daemon was down)
			}
			delete(openIDs, r.CtID)
			if r.DurationMs > 0 {
				first = r.Time.Add(-time.Duration(r.DurationMs) * time.Millisecond)
			}
		case KindAggregate:
			d.Connections += r.Connections
			rep.Aggregated += r.Connections
			if r.First != nil {
				first = *r.First
			}
			if r.Last != nil {
				last = *r.Last
			}
		default:
			breakAt(line, "record %d: kind %q: want open, close or aggregate", r.Seq, r.Kind)
		}
		d.BytesOut += r.BytesOut
		d.BytesIn += r.BytesIn
		if d.First.IsZero() || first.Before(d.First) {
			d.First = first
		}
		if last.After(d.Last) {
			d.Last = last
		}
	}
	if err := sc.Err(); err != nil {
		return rep, fmt.Errorf("read ledger %s: %w", path, err)
	}
	if wantSeq != 0 && (prevSeq != wantSeq || prevHash != wantHead) {
		breakAt(line, "the file ends at record %d, the daemon wrote up to record %d: records were removed or replaced", prevSeq, wantSeq)
	}
	rep.Head = prevHash
	rep.Verified = rep.Broken == ""
	for _, k := range order {
		rep.Destinations = append(rep.Destinations, *sums[k])
	}
	sort.SliceStable(rep.Destinations, func(i, j int) bool {
		a, b := rep.Destinations[i], rep.Destinations[j]
		if a.Dest != b.Dest {
			return a.Dest < b.Dest
		}
		return a.Port < b.Port
	})
	return rep, nil
}
