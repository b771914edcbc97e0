package dnsproxy

import (
	"net/netip"
	"sync"
	"testing"
)

// TestSessionTable: every guest of a pool lands in a shard, is found
// there, and a put or remove of one guest leaves every other shard's
// snapshot as it was (the copy is one shard's), while readers run.
func TestSessionTable(t *testing.T) {
	tab := newSessionTable()
	base := netip.MustParseAddr("10.20.0.2")
	var guests []netip.Addr
	for i, a := 0, base; i < 1000; i++ {
		guests = append(guests, a)
		for range 4 {
			a = a.Next()
		}
	}
	used := map[int]int{}
	for _, g := range guests {
		if prev := tab.put(&compiledSession{guest: g}); prev != nil {
			t.Fatalf("put %s replaced %v", g, prev)
		}
		used[shardOf(g)]++
	}
	if len(used) != sessionShards {
		t.Errorf("1000 consecutive slots use %d of %d shards", len(used), sessionShards)
	}
	if tab.len() != len(guests) {
		t.Fatalf("len %d, want %d", tab.len(), len(guests))
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() { // a reader during the writes below
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if tab.get(guests[1]) == nil {
				t.Error("a guest nobody removed went missing during writes")
				return
			}
		}
	}()
	other := tab.shards[shardOf(guests[1])].Load()
	victim := guests[0]
	if shardOf(victim) == shardOf(guests[1]) {
		t.Fatal("test setup: neighbours share a shard")
	}
	replaced := &compiledSession{guest: victim}
	if prev := tab.put(replaced); prev == nil || prev.guest != victim {
		t.Fatalf("replacing %s returned %v", victim, prev)
	}
	if tab.get(victim) != replaced {
		t.Fatal("get does not see the replacement")
	}
	if got := tab.remove(victim); got != replaced {
		t.Fatalf("remove returned %v", got)
	}
	if tab.get(victim) != nil || tab.remove(victim) != nil {
		t.Fatal("a removed guest is still found")
	}
	if tab.shards[shardOf(guests[1])].Load() != other {
		t.Error("a write to one shard replaced another shard's snapshot")
	}
	close(stop)
	wg.Wait()
	if tab.len() != len(guests)-1 {
		t.Fatalf("len %d, want %d", tab.len(), len(guests)-1)
	}
}
