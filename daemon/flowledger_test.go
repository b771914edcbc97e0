package daemon

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/internal/nfnetlink"
)

// chanEvents is a FlowEventSource fed by the test.
type chanEvents struct {
	ch     chan []nfnetlink.FlowEvent
	closed chan struct{}
}

func newChanEvents() *chanEvents {
	return &chanEvents{ch: make(chan []nfnetlink.FlowEvent), closed: make(chan struct{})}
}

func (c *chanEvents) Receive() ([]nfnetlink.FlowEvent, error) {
	select {
	case evs := <-c.ch:
		return evs, nil
	case <-c.closed:
		return nil, errors.New("closed")
	}
}

func (c *chanEvents) Close() error {
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	return nil
}

func ctEvent(typ nfnetlink.FlowEventType, id uint32, src, dst string, dport uint16, out, in uint64) nfnetlink.FlowEvent {
	return nfnetlink.FlowEvent{Type: typ, ID: id, HasCounters: typ == nfnetlink.FlowDestroy,
		Flow: nfnetlink.Flow{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: 6, Sport: 40000 + uint16(id), Dport: dport},
		Orig: nfnetlink.Counters{Bytes: out, Packets: 1}, Reply: nfnetlink.Counters{Bytes: in, Packets: 1}}
}

// TestFlowLedgerRecordsAdmissions: the kernel's events of a session's
// guest go to its ledger, classified by its policy (the static entry and
// generation; a flow its policy does not admit now is "unknown", not
// guessed); events of other sources and to the DNS proxy are not; a
// removed session's late DESTROY events still land, and its report stays.
func TestFlowLedgerRecordsAdmissions(t *testing.T) {
	w := newWorld(t)
	info := w.create(api.CreateRequest{Name: "fl", NetworkOnly: true, Allow: []string{"93.184.216.7:443"}})
	guest := info.GuestIP
	src := newChanEvents()
	stop := w.d.serveLedger(src, 0)
	defer stop()
	send := func(evs ...nfnetlink.FlowEvent) { src.ch <- evs }

	send(ctEvent(nfnetlink.FlowNew, 1, guest, "93.184.216.7", 443, 0, 0),
		ctEvent(nfnetlink.FlowNew, 2, guest, "93.184.216.99", 80, 0, 0),         // not admitted by the policy now
		ctEvent(nfnetlink.FlowNew, 3, "10.20.0.250", "93.184.216.7", 443, 0, 0), // not a guest
		ctEvent(nfnetlink.FlowNew, 4, guest, smDNSAddr.String(), 53, 0, 0))      // the DNS proxy
	send(ctEvent(nfnetlink.FlowDestroy, 1, guest, "93.184.216.7", 443, 700, 9000))
	send() // the previous batch is written once this one is taken

	rep, err := w.d.Report(context.Background(), "fl")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Verified || len(rep.Destinations) != 2 {
		t.Fatalf("report %+v, want verified with 2 destinations", rep)
	}
	st, unk := rep.Destinations[0], rep.Destinations[1]
	if st.Dest != "93.184.216.7" || st.Via != "static" || st.Entry != "93.184.216.7:443/tcp" && st.Entry != "93.184.216.7:443" || st.Generation != 1 ||
		st.Connections != 1 || st.BytesOut != 700 || st.BytesIn != 9000 {
		t.Errorf("static destination %+v, want 93.184.216.7 under its entry, generation 1, 1 connection, 700/9000 bytes", st)
	}
	if unk.Dest != "93.184.216.99" || unk.Via != "unknown" || unk.Entry != "" {
		t.Errorf("unadmitted destination %+v, want via unknown without an entry", unk)
	}

	if err := w.d.Delete(context.Background(), "fl"); err != nil {
		t.Fatal(err)
	}
	send(ctEvent(nfnetlink.FlowDestroy, 2, guest, "93.184.216.99", 80, 5, 6)) // flushed by the removal
	send()
	rep, err = w.d.Report(context.Background(), "fl")
	if err != nil {
		t.Fatalf("report of the removed session: %v", err)
	}
	if !rep.Verified || len(rep.Destinations) != 2 || rep.Destinations[1].BytesOut != 5 || rep.Destinations[1].Connections != 1 {
		t.Fatalf("report of the removed session %+v, want the late close counted under its open", rep)
	}
	if _, err := w.d.Report(context.Background(), "never"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("report of a session that never was: %v, want not found", err)
	}
	if _, err := w.d.Report(context.Background(), "../x"); !errors.Is(err, api.ErrBadRequest) {
		t.Errorf("report of a bad name: %v, want bad request", err)
	}
	if _, err := os.Stat(w.d.ledgerPath("fl")); err != nil {
		t.Errorf("the removed session's ledger: %v", err)
	}
}

// TestFlowLedgerKeptForRetention: a removed session's ledger is read
// within the events' retention and pruned with its other files after it.
func TestFlowLedgerKeptForRetention(t *testing.T) {
	w := newWorld(t)
	w.restartPersisted(time.Hour)
	info := w.create(api.CreateRequest{Name: "kr", NetworkOnly: true, Allow: []string{"93.184.216.7"}})
	src := newChanEvents()
	stop := w.d.serveLedger(src, 0)
	defer stop()
	src.ch <- []nfnetlink.FlowEvent{ctEvent(nfnetlink.FlowNew, 1, info.GuestIP, "93.184.216.7", 443, 0, 0)}
	src.ch <- nil
	if err := w.d.Delete(context.Background(), "kr"); err != nil {
		t.Fatal(err)
	}
	if rep, err := w.d.Report(context.Background(), "kr"); err != nil || !rep.Verified || len(rep.Destinations) != 1 {
		t.Fatalf("removed, within the retention: %+v %v, want its one destination", rep, err)
	}
	w.eventsSkew.Store(int64(2 * time.Hour))
	w.d.events.Prune()
	if _, err := os.Stat(w.d.ledgerPath("kr")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("past the retention, the ledger: %v, want pruned", err)
	}
	if _, err := w.d.Report(context.Background(), "kr"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("past the retention, the report: %v, want not found", err)
	}
}

// TestFlowLedgerAttestedByName: a flow to an address a DNS answer attested
// is recorded under the name whose answer opened it, from the daemon's
// memory of answers (no kernel read per flow); an address no answer gave
// and no entry names stays unknown (the control).
func TestFlowLedgerAttestedByName(t *testing.T) {
	w := newWorld(t)
	info := w.create(api.CreateRequest{Name: "fa", NetworkOnly: true, Allow: []string{"api.example.com"}})
	w.d.names.remember("fa", "api.example.com.", "A", []netip.Addr{netip.MustParseAddr("93.184.216.34")})
	src := newChanEvents()
	stop := w.d.serveLedger(src, 0)
	defer stop()
	src.ch <- []nfnetlink.FlowEvent{
		ctEvent(nfnetlink.FlowNew, 1, info.GuestIP, "93.184.216.34", 443, 0, 0),
		ctEvent(nfnetlink.FlowNew, 2, info.GuestIP, "93.184.216.35", 443, 0, 0),
	}
	src.ch <- nil // the previous batch is written once this one is taken

	rep, err := w.d.Report(context.Background(), "fa")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Verified || len(rep.Destinations) != 2 {
		t.Fatalf("report %+v, want verified with 2 destinations", rep)
	}
	at, unk := rep.Destinations[0], rep.Destinations[1]
	if at.Dest != "93.184.216.34" || at.Via != "attested" || at.AttestedName != "api.example.com" || at.Entry != "api.example.com" {
		t.Errorf("attested destination %+v, want via attested by api.example.com", at)
	}
	if unk.Dest != "93.184.216.35" || unk.Via != "unknown" {
		t.Errorf("unattested destination %+v, want via unknown", unk)
	}
}
