package nft

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
)

// monitorRetry is how long a monitor that failed waits before it is
// started again; nothing is known meanwhile (Attest waits for the kernel).
const monitorRetry = time.Second

// attestMonitor reads the kernel's nftables notifications so that an
// element someone else deletes from the attested sets stops being known
// (see knownIndex). The library's monitor joins the nftables multicast
// group and hands over each transaction's changes at its end; a socket
// that overflowed (the kernel dropped notifications: ENOBUFS) or any other
// receive error ends it, and then nothing is known until a new one has
// joined. mu guards everything below it.
type attestMonitor struct {
	ended atomic.Uint64 // monitors that ended other than by Close

	mu      sync.Mutex
	mon     *nftables.Monitor
	closed  bool
	running bool
}

// startMonitor starts the monitor unless it runs; knowledge is gathered
// from the moment it has joined the group. An error leaves knowledge off.
func (f *Firewall) startMonitor() error {
	m := &f.monitor
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.running {
		return nil
	}
	// The large buffer: each inserted element is a notification too, and
	// a burst of answers (a thousand names at once) overflowed the
	// default one, which ends the monitor and all knowledge with it.
	c, err := nftables.New(nftables.WithNetNSFd(f.nsFd), nftables.WithSockOptions(forceBuffers))
	if err != nil {
		return fmt.Errorf("open nftables monitor socket: %w", err)
	}
	// Every action and object: the library filters others out in a way
	// that, for deletes only, drops the end-of-transaction message that
	// hands the changes over.
	mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(64))
	ch, err := c.AddGenerationalMonitor(mon)
	if err != nil {
		return fmt.Errorf("join the nftables notification group: %w", err)
	}
	m.mon, m.running = mon, true
	// Joined: a delete from now on is seen; nothing known before counts.
	f.known.forgetAll(true)
	go f.watch(ch)
	return nil
}

// watch forgets what the notifications delete, until the monitor ends;
// then knowledge is off and, unless the Firewall is closing, a new
// monitor is started after monitorRetry.
func (f *Firewall) watch(ch chan *nftables.MonitorEvents) {
	for evs := range ch {
		if evs.GeneratedBy != nil && evs.GeneratedBy.Type == nftables.MonitorEventTypeOOB {
			f.known.forgetAll(false)
		}
		for _, ev := range evs.Changes {
			f.onChange(ev)
		}
	}
	f.known.forgetAll(false)
	m := &f.monitor
	m.mu.Lock()
	m.running, m.mon = false, nil
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return
	}
	m.ended.Add(1)
	time.AfterFunc(monitorRetry, func() {
		if err := f.startMonitor(); err != nil {
			f.monitorFailed(err)
		}
	})
}

// onChange forgets what one notification deletes: the keys of a deleted
// element, everything for a deleted set or table or a change that did not
// decode.
func (f *Firewall) onChange(ev *nftables.MonitorEvent) {
	switch ev.Type {
	case nftables.MonitorEventTypeDelSetElem:
		elems, ok := ev.Data.([]nftables.SetElement)
		if ev.Error != nil || !ok {
			f.known.forget(everyGuest)
			return
		}
		f.known.forgetKeys(elems)
	case nftables.MonitorEventTypeDelSet, nftables.MonitorEventTypeDelTable, nftables.MonitorEventTypeOOB:
		f.known.forget(everyGuest)
	}
}

// monitorFailed retries a monitor that could not start, every
// monitorRetry, until it starts or the Firewall closes.
func (f *Firewall) monitorFailed(err error) {
	_ = err // knowledge stays off: Attest waits for the kernel meanwhile
	time.AfterFunc(monitorRetry, func() {
		if err := f.startMonitor(); err != nil {
			f.monitorFailed(err)
		}
	})
}

// AttestMonitorEnded returns how many times the notification monitor
// ended by itself (its socket overflowed or failed): each time, nothing
// was known for about monitorRetry.
func (f *Firewall) AttestMonitorEnded() uint64 { return f.monitor.ended.Load() }

// stopMonitor ends the monitor for good (Close).
func (f *Firewall) stopMonitor() {
	m := &f.monitor
	m.mu.Lock()
	m.closed = true
	mon := m.mon
	m.mu.Unlock()
	if mon != nil {
		_ = mon.Close()
	}
	f.known.forgetAll(false)
}

// everyGuest is forget's argument that forgets every guest.
func everyGuest(netip.Addr) bool { return true }
