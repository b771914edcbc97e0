package dnsproxy

import (
	"maps"
	"net/netip"
	"sync/atomic"
)

// sessionShards is how many snapshots the registered sessions are spread
// over. A register, unregister or update copies one shard's map (a 64th
// of the sessions), so it does not grow with the number of sessions the
// way one map copied whole did (16,383 entries and ~400 KiB of garbage per
// create at the full pool).
const sessionShards = 64

// sessionTable maps guest addresses to their compiled sessions. Reads take
// no lock (the answer path); writes are serialised by the caller
// (Proxy.sessionsMu) and publish a new copy of one shard.
type sessionTable struct {
	shards [sessionShards]atomic.Pointer[sessionMap]
}

func newSessionTable() *sessionTable {
	t := &sessionTable{}
	for i := range t.shards {
		empty := sessionMap{}
		t.shards[i].Store(&empty)
	}
	return t
}

// shardOf spreads consecutive /30 slots over consecutive shards: a guest
// address is the slot's base plus 2, so its two low bits never vary.
func shardOf(guest netip.Addr) int {
	b := guest.As16()
	return int((uint32(b[14])<<8|uint32(b[15]))>>2) % sessionShards
}

func (t *sessionTable) get(guest netip.Addr) *compiledSession {
	return (*t.shards[shardOf(guest)].Load())[guest]
}

// put publishes cs under its guest address and returns what it replaced.
// The caller holds Proxy.sessionsMu.
func (t *sessionTable) put(cs *compiledSession) (prev *compiledSession) {
	prev = t.putAt(cs.guest, cs)
	if cs.guest6.IsValid() { // a dual-stack session: its v6 queries too
		t.putAt(cs.guest6, cs)
	}
	return prev
}

func (t *sessionTable) putAt(guest netip.Addr, cs *compiledSession) (prev *compiledSession) {
	s := &t.shards[shardOf(guest)]
	old := *s.Load()
	next := make(sessionMap, len(old)+1)
	maps.Copy(next, old)
	prev = next[guest]
	next[guest] = cs
	s.Store(&next)
	return prev
}

// remove unpublishes guest and returns what it held (nil: nothing). The
// caller holds Proxy.sessionsMu.
func (t *sessionTable) remove(guest netip.Addr) *compiledSession {
	prev := t.removeAt(guest)
	if prev != nil && prev.guest6.IsValid() {
		t.removeAt(prev.guest6)
	}
	return prev
}

func (t *sessionTable) removeAt(guest netip.Addr) *compiledSession {
	s := &t.shards[shardOf(guest)]
	old := *s.Load()
	prev, ok := old[guest]
	if !ok {
		return nil
	}
	next := make(sessionMap, len(old))
	for k, v := range old {
		if k != guest {
			next[k] = v
		}
	}
	s.Store(&next)
	return prev
}

func (t *sessionTable) len() int {
	n := 0
	for i := range t.shards {
		n += len(*t.shards[i].Load())
	}
	return n
}
