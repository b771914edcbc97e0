package nsmgr

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func mustIPAM(t *testing.T, pool string) *IPAM {
	t.Helper()
	p, err := NewIPAM(netip.MustParsePrefix(pool))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func allocate(t *testing.T, p *IPAM) int {
	t.Helper()
	s, err := p.Allocate()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestValidatePool(t *testing.T) {
	const want = "want an IPv4 prefix between /8 and /28"
	tests := []struct {
		pool netip.Prefix
		want string
	}{
		{netip.Prefix{}, "invalid pool: not set; " + want},
		{netip.MustParsePrefix("fd00::/64"), "invalid pool fd00::/64: IPv6 is not supported; " + want},
		{netip.MustParsePrefix("10.0.0.0/7"), "invalid pool 10.0.0.0/7: larger than /8, the largest pool (4194303 session slots); " + want},
		{netip.MustParsePrefix("10.20.0.0/29"), "invalid pool 10.20.0.0/29: smaller than /28, the smallest pool (3 session /30s beside the reserved DNS /30); " + want},
		{netip.MustParsePrefix("10.20.1.0/16"), "invalid pool 10.20.1.0/16: host bits set (did you mean 10.20.0.0/16?); " + want},
	}
	for _, tt := range tests {
		if err := ValidatePool(tt.pool); err == nil || err.Error() != tt.want {
			t.Errorf("ValidatePool(%v) = %v, want %q", tt.pool, err, tt.want)
		}
		if _, err := NewIPAM(tt.pool); err == nil || err.Error() != tt.want {
			t.Errorf("NewIPAM(%v) = %v, want %q", tt.pool, err, tt.want)
		}
	}
	for _, ok := range []string{"10.0.0.0/8", "10.20.0.0/16", "192.168.7.0/28"} {
		if err := ValidatePool(netip.MustParsePrefix(ok)); err != nil {
			t.Errorf("ValidatePool(%s) = %v, want nil", ok, err)
		}
	}
}

func TestIPAMGeometry(t *testing.T) {
	tests := []struct {
		pool    string
		slots   int
		dns     string
		first   [3]string // subnet, gateway, guest of slot 0
		last    [3]string // of the last slot
		lastDNS string    // first address of the reserved /30
	}{
		{"10.20.0.0/16", 16383, "10.20.255.254",
			[3]string{"10.20.0.0/30", "10.20.0.1", "10.20.0.2"},
			[3]string{"10.20.255.248/30", "10.20.255.249", "10.20.255.250"}, "10.20.255.252"},
		{"192.168.7.0/28", 3, "192.168.7.14",
			[3]string{"192.168.7.0/30", "192.168.7.1", "192.168.7.2"},
			[3]string{"192.168.7.8/30", "192.168.7.9", "192.168.7.10"}, "192.168.7.12"},
		{"10.0.0.0/8", 4194303, "10.255.255.254",
			[3]string{"10.0.0.0/30", "10.0.0.1", "10.0.0.2"},
			[3]string{"10.255.255.248/30", "10.255.255.249", "10.255.255.250"}, "10.255.255.252"},
	}
	for _, tt := range tests {
		p := mustIPAM(t, tt.pool)
		if p.Slots() != tt.slots {
			t.Errorf("%s: Slots = %d, want %d", tt.pool, p.Slots(), tt.slots)
		}
		if got := p.DNSAddr().String(); got != tt.dns {
			t.Errorf("%s: DNSAddr = %s, want %s", tt.pool, got, tt.dns)
		}
		for _, c := range []struct {
			slot int
			want [3]string
		}{{0, tt.first}, {tt.slots - 1, tt.last}} {
			sub, gw, guest := p.SlotAddrs(c.slot)
			got := [3]string{sub.String(), gw.String(), guest.String()}
			if got != c.want {
				t.Errorf("%s: SlotAddrs(%d) = %v, want %v", tt.pool, c.slot, got, c.want)
			}
			for _, a := range []netip.Addr{sub.Addr(), gw, guest} {
				if s, ok := p.SlotOf(a); !ok || s != c.slot {
					t.Errorf("%s: SlotOf(%s) = %d, %v; want %d", tt.pool, a, s, ok, c.slot)
				}
			}
		}
		// The reserved /30 and addresses outside the pool map to no slot.
		for _, a := range []string{tt.dns, tt.lastDNS, "172.31.0.1"} {
			if s, ok := p.SlotOf(netip.MustParseAddr(a)); ok {
				t.Errorf("%s: SlotOf(%s) = %d, true; want false", tt.pool, a, s)
			}
		}
		if sub, _, _ := p.SlotAddrs(tt.slots); sub.IsValid() {
			t.Errorf("%s: SlotAddrs(reserved slot) = %s, want zero", tt.pool, sub)
		}
		if _, _, g := p.SlotAddrs(-1); g.IsValid() {
			t.Errorf("%s: SlotAddrs(-1) = %s, want zero", tt.pool, g)
		}
	}
	if _, ok := mustIPAM(t, "10.20.0.0/16").SlotOf(netip.MustParseAddr("::ffff:10.20.0.2")); ok {
		t.Error("SlotOf(IPv4-mapped IPv6) = true, want false")
	}
}

func TestIPAMNextFit(t *testing.T) {
	p := mustIPAM(t, "10.20.0.0/28") // slots 0, 1, 2
	for want := 0; want < 3; want++ {
		if got := allocate(t, p); got != want {
			t.Fatalf("allocation %d = slot %d", want, got)
		}
	}
	p.Release(1)
	p.Release(0)
	// The cursor wrapped to 0: a released slot comes back only after the
	// cursor reaches it again, lowest first from there.
	if got := allocate(t, p); got != 0 {
		t.Fatalf("after wrap: slot %d, want 0", got)
	}
	p.Release(0)
	if got := allocate(t, p); got != 1 {
		t.Fatalf("just-freed 0 must wait: got %d, want 1", got)
	}
	if got := allocate(t, p); got != 0 {
		t.Fatalf("got %d, want 0", got)
	}
	if p.InUse() != 3 {
		t.Fatalf("InUse = %d, want 3", p.InUse())
	}
}

func TestIPAMReuseAsLateAsPossible(t *testing.T) {
	p := mustIPAM(t, "10.20.0.0/20") // 1023 slots, several bitset words
	for i := 0; i < 200; i++ {
		allocate(t, p)
	}
	p.Release(5)
	p.Release(130)
	// Every never-used slot goes first...
	for want := 200; want < 1023; want++ {
		if got := allocate(t, p); got != want {
			t.Fatalf("got slot %d, want %d", got, want)
		}
	}
	// ...then the freed ones, in cursor order after the wrap.
	if got := allocate(t, p); got != 5 {
		t.Fatalf("got %d, want 5", got)
	}
	if got := allocate(t, p); got != 130 {
		t.Fatalf("got %d, want 130", got)
	}
	var ex *ExhaustedError
	if _, err := p.Allocate(); !errors.As(err, &ex) {
		t.Fatalf("Allocate on a full pool: %v, want *ExhaustedError", err)
	}
}

func TestIPAMExhausted(t *testing.T) {
	p := mustIPAM(t, "10.20.0.0/16")
	for i := 0; i < 16383; i++ {
		allocate(t, p)
	}
	_, err := p.Allocate()
	const want = "address pool 10.20.0.0/16 exhausted: all 16383 session slots in use"
	if err == nil || err.Error() != want {
		t.Fatalf("Allocate = %v, want %q", err, want)
	}
	var ex *ExhaustedError
	if !errors.As(err, &ex) || ex.Slots != 16383 || ex.InUse != 16383 {
		t.Fatalf("errors.As: %#v", ex)
	}
	p.Release(77)
	if got := allocate(t, p); got != 77 {
		t.Fatalf("got %d, want 77", got)
	}
}

func TestIPAMQuarantine(t *testing.T) {
	p := mustIPAM(t, "10.20.0.0/28")
	for i := 0; i < 3; i++ {
		allocate(t, p)
	}
	p.Release(1)
	lingering := map[int]bool{1: true}
	var asked []int
	reusable := func(slot int) bool {
		asked = append(asked, slot)
		return !lingering[slot]
	}
	_, err := p.AllocateIf(reusable)
	const want = "address pool 10.20.0.0/28 exhausted: 2 of 3 session slots in use and 1 waiting for the kernel to remove an old interface"
	if err == nil || err.Error() != want {
		t.Fatalf("AllocateIf = %v, want %q", err, want)
	}
	if !p.Dirty(1) || p.Used(1) {
		t.Fatalf("a refused slot stays free and dirty: used=%v dirty=%v", p.Used(1), p.Dirty(1))
	}
	delete(lingering, 1) // the kernel removed the old veth
	if s, err := p.AllocateIf(reusable); err != nil || s != 1 {
		t.Fatalf("AllocateIf = %d, %v; want 1", s, err)
	}
	if p.Dirty(1) {
		t.Fatal("a handed-out slot is no longer dirty")
	}
	if len(asked) != 2 || asked[0] != 1 || asked[1] != 1 {
		t.Fatalf("reusable asked about %v, want only the dirty slot 1 twice", asked)
	}

	// Clean slots are never asked about; a refused dirty slot is skipped
	// in favour of the next free one.
	p = mustIPAM(t, "10.20.0.0/28")
	p.Release(0) // dirty, never used
	asked = nil
	lingering = map[int]bool{0: true}
	if s, err := p.AllocateIf(reusable); err != nil || s != 1 {
		t.Fatalf("AllocateIf = %d, %v; want 1", s, err)
	}
	if len(asked) != 1 || asked[0] != 0 {
		t.Fatalf("reusable asked about %v, want [0]", asked)
	}
}

func TestIPAMMarkUsedRelease(t *testing.T) {
	p := mustIPAM(t, "10.20.0.0/16")
	p.MarkUsed(0)
	p.MarkUsed(0)
	p.MarkUsed(5)
	p.MarkUsed(-1)
	p.MarkUsed(16383) // the reserved /30: ignored
	if p.InUse() != 2 {
		t.Fatalf("InUse = %d, want 2", p.InUse())
	}
	if got := allocate(t, p); got != 1 {
		t.Fatalf("got %d, want 1", got)
	}
	p.Release(5)
	p.Release(5)
	p.Release(16383)
	if p.InUse() != 2 || p.Used(5) || !p.Dirty(5) {
		t.Fatalf("after release: InUse=%d used(5)=%v dirty(5)=%v", p.InUse(), p.Used(5), p.Dirty(5))
	}
	p.MarkUsed(5)
	if p.Dirty(5) {
		t.Fatal("MarkUsed clears dirty")
	}
	p.seek(16383 + 3)
	if got := allocate(t, p); got != 3 {
		t.Fatalf("after seek: got %d, want 3", got)
	}
}

// TestIPAMModel drives the IPAM and a naive model with the same random
// operations and checks they agree on every allocation.
func TestIPAMModel(t *testing.T) {
	for _, pool := range []string{"10.20.0.0/28", "10.20.0.0/24", "10.20.0.0/21"} {
		p := mustIPAM(t, pool)
		n := p.Slots()
		used := make([]bool, n)
		cursor, inUse := 0, 0
		rng := rand.New(rand.NewPCG(1, uint64(n)))
		for op := 0; op < 20000; op++ {
			if rng.IntN(3) > 0 {
				got, err := p.Allocate()
				want := -1
				for k := 0; k < n; k++ {
					if s := (cursor + k) % n; !used[s] {
						want = s
						break
					}
				}
				if want < 0 {
					if err == nil {
						t.Fatalf("%s op %d: Allocate = %d, want exhausted", pool, op, got)
					}
					continue
				}
				if err != nil || got != want {
					t.Fatalf("%s op %d: Allocate = %d, %v; want %d", pool, op, got, err, want)
				}
				used[want], cursor = true, (want+1)%n
				inUse++
			} else {
				s := rng.IntN(n)
				if used[s] {
					inUse--
				}
				used[s] = false
				p.Release(s)
			}
			if p.InUse() != inUse {
				t.Fatalf("%s op %d: InUse = %d, want %d", pool, op, p.InUse(), inUse)
			}
		}
	}
}

// TestSlot6Addrs: a slot's /126 is the twin of its /30 (same index), ::1
// the host side and ::2 the guest; the DNS address is ::2 of the /126 after
// the last slot, inside the pool and apart from every slot's.
func TestSlot6Addrs(t *testing.T) {
	pool := netip.MustParsePrefix("10.20.0.0/16")
	pool6 := netip.MustParsePrefix("fd00:20::/112")
	if err := ValidatePool6(pool6, pool); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		slot              int
		subnet, gw, guest string
	}{
		{0, "fd00:20::/126", "fd00:20::1", "fd00:20::2"},
		{1, "fd00:20::4/126", "fd00:20::5", "fd00:20::6"},
		{16382, "fd00:20::fff8/126", "fd00:20::fff9", "fd00:20::fffa"},
	} {
		sub, gw, guest := Slot6Addrs(pool6, tc.slot)
		if sub.String() != tc.subnet || gw.String() != tc.gw || guest.String() != tc.guest {
			t.Errorf("slot %d: %s %s %s, want %s %s %s", tc.slot, sub, gw, guest, tc.subnet, tc.gw, tc.guest)
		}
	}
	dns := DNS6Addr(pool6, pool)
	if dns.String() != "fd00:20::fffe" || !pool6.Contains(dns) {
		t.Errorf("dns6 = %s, want fd00:20::fffe", dns)
	}
	if err := ValidatePool6(netip.MustParsePrefix("fd00:20::/113"), pool); err == nil {
		t.Error("a /113 for 16383 slots accepted")
	}
}
