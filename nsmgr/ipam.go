package nsmgr

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net/netip"
)

// Pool size limits. The smallest pool has three session slots beside the
// reserved DNS /30; the largest (the whole of 10/8) has 4194303, whose slot
// numbers still fit the 15-character interface names.
const (
	MinPoolBits = 8
	MaxPoolBits = 28
)

// ExhaustedError reports that no slot can be handed out: every slot is in
// use, or the free ones still have an old host interface in the kernel.
type ExhaustedError struct {
	Pool      netip.Prefix
	Slots     int // session slots in the pool (the DNS /30 excluded)
	InUse     int
	Lingering int // free slots skipped because their old interface still exists
}

func (e *ExhaustedError) Error() string {
	if e.Lingering == 0 {
		return fmt.Sprintf("address pool %s exhausted: all %d session slots in use", e.Pool, e.Slots)
	}
	return fmt.Sprintf("address pool %s exhausted: %d of %d session slots in use and %d waiting for the kernel to remove an old interface",
		e.Pool, e.InUse, e.Slots, e.Lingering)
}

// IPAM hands out /30 slots of a pool. Slot i is the subnet base+4i/30: the
// gateway (host side) is base+4i+1, the guest base+4i+2. The pool's last
// /30 is reserved; its last usable address is the DNS anycast address.
//
// Allocation is next-fit: a cursor moves on past every slot it hands out
// and wraps around, so a released slot is reused as late as possible.
// Released slots are also remembered as dirty (their host veth may linger
// in the kernel after a lazy delete) until they are handed out again; see
// AllocateIf.
//
// IPAM is pure (no I/O) and not safe for concurrent use.
type IPAM struct {
	pool   netip.Prefix
	base   uint32
	slots  int
	used   []uint64 // bit set: slot in use
	dirty  []uint64 // bit set: slot released since it was last handed out
	inUse  int
	cursor int // the next slot to look at
}

// ValidatePool checks a session pool: an IPv4 prefix between /8 and /28
// given as its network address (the slot math needs the reserved DNS /30
// and at least three session /30s; slot numbers of a /8 still fit the
// interface names). It is the one rule: NewIPAM applies it, and the
// program's configuration calls it before any kernel change.
func ValidatePool(pool netip.Prefix) error {
	const want = "want an IPv4 prefix between /8 and /28"
	switch {
	case !pool.IsValid():
		return fmt.Errorf("invalid pool: not set; %s", want)
	case !pool.Addr().Is4():
		return fmt.Errorf("invalid pool %s: IPv6 is not supported; %s", pool, want)
	case pool.Bits() < MinPoolBits:
		return fmt.Errorf("invalid pool %s: larger than /8, the largest pool (4194303 session slots); %s", pool, want)
	case pool.Bits() > MaxPoolBits:
		return fmt.Errorf("invalid pool %s: smaller than /28, the smallest pool (3 session /30s beside the reserved DNS /30); %s", pool, want)
	case pool.Masked() != pool:
		return fmt.Errorf("invalid pool %s: host bits set (did you mean %s?); %s", pool, pool.Masked(), want)
	}
	return nil
}

// NewIPAM returns an IPAM for a pool ValidatePool accepts.
func NewIPAM(pool netip.Prefix) (*IPAM, error) {
	if err := ValidatePool(pool); err != nil {
		return nil, err
	}
	n := 1<<(32-pool.Bits())/4 - 1
	words := (n + 63) / 64
	a4 := pool.Addr().As4()
	return &IPAM{
		pool:  pool,
		base:  binary.BigEndian.Uint32(a4[:]),
		slots: n,
		used:  make([]uint64, words),
		dirty: make([]uint64, words),
	}, nil
}

// Pool returns the pool.
func (p *IPAM) Pool() netip.Prefix { return p.pool }

// Slots returns the number of session slots (the DNS /30 excluded).
func (p *IPAM) Slots() int { return p.slots }

// InUse returns the number of slots in use.
func (p *IPAM) InUse() int { return p.inUse }

// Used reports whether slot is in use.
func (p *IPAM) Used(slot int) bool { return p.valid(slot) && bit(p.used, slot) }

// Dirty reports whether slot was released and not handed out since.
func (p *IPAM) Dirty(slot int) bool { return p.valid(slot) && bit(p.dirty, slot) }

// DNSAddr returns the DNS anycast address: the last usable address of the
// pool's last /30 (10.20.255.254 for 10.20.0.0/16).
func (p *IPAM) DNSAddr() netip.Addr { return p.addr(uint32(p.slots)*4 + 2) }

// SlotAddrs returns the /30 of a slot, its gateway (first usable address,
// held by the host-side veth) and the guest address (second usable). They
// are zero for a slot outside the pool.
func (p *IPAM) SlotAddrs(slot int) (subnet netip.Prefix, gw, guest netip.Addr) {
	if !p.valid(slot) {
		return netip.Prefix{}, netip.Addr{}, netip.Addr{}
	}
	off := uint32(slot) * 4
	return netip.PrefixFrom(p.addr(off), 30), p.addr(off + 1), p.addr(off + 2)
}

// SlotOf returns the slot whose /30 holds addr (usually a guest address;
// any address of the /30 maps to its slot). It reports false for addresses
// outside the pool and inside the reserved DNS /30.
func (p *IPAM) SlotOf(addr netip.Addr) (int, bool) {
	if !addr.Is4() || !p.pool.Contains(addr) {
		return 0, false
	}
	a4 := addr.As4()
	slot := int((binary.BigEndian.Uint32(a4[:]) - p.base) / 4)
	if slot >= p.slots {
		return 0, false
	}
	return slot, true
}

// Allocate hands out the next free slot at or after the cursor.
func (p *IPAM) Allocate() (int, error) { return p.AllocateIf(nil) }

// AllocateIf is Allocate that asks reusable, for each dirty slot it comes
// across, whether the slot may be handed out again (the caller checks that
// the slot's old host interface is gone). A slot refused stays free and
// dirty, and is asked about again the next time the cursor passes it. A nil
// reusable accepts every slot.
func (p *IPAM) AllocateIf(reusable func(slot int) bool) (int, error) {
	lingering := 0
	for k, s := 0, p.cursor; k < p.slots-p.inUse; k++ {
		s = p.nextFree(s)
		if s < 0 {
			break
		}
		if bit(p.dirty, s) && reusable != nil && !reusable(s) {
			lingering++
			s = (s + 1) % p.slots
			continue
		}
		setBit(p.used, s)
		clearBit(p.dirty, s)
		p.inUse++
		p.cursor = (s + 1) % p.slots
		return s, nil
	}
	return -1, &ExhaustedError{Pool: p.pool, Slots: p.slots, InUse: p.inUse, Lingering: lingering}
}

// Release frees a slot and marks it dirty. Releasing a free slot only marks
// it dirty; a slot outside the pool is ignored.
func (p *IPAM) Release(slot int) {
	if !p.valid(slot) {
		return
	}
	if bit(p.used, slot) {
		clearBit(p.used, slot)
		p.inUse--
	}
	setBit(p.dirty, slot)
}

// MarkUsed records a slot as in use (found live in the kernel). It does not
// move the cursor. A slot outside the pool is ignored.
func (p *IPAM) MarkUsed(slot int) {
	if !p.valid(slot) {
		return
	}
	if !bit(p.used, slot) {
		setBit(p.used, slot)
		p.inUse++
	}
	clearBit(p.dirty, slot)
}

// seek moves the cursor to slot (wrapped into the pool).
func (p *IPAM) seek(slot int) {
	if slot < 0 {
		slot = 0
	}
	p.cursor = slot % p.slots
}

// nextFree returns the first free slot at or after from, wrapping around,
// or -1 when every slot is used.
func (p *IPAM) nextFree(from int) int {
	if p.inUse == p.slots {
		return -1
	}
	for k := 0; k <= len(p.used); k++ {
		w := from / 64
		free := ^p.used[w] &^ (1<<(from%64) - 1) // free bits at or after from
		if free != 0 {
			s := w*64 + bits.TrailingZeros64(free)
			if s < p.slots {
				return s
			}
		}
		from = (w + 1) * 64
		if from >= p.slots {
			from = 0
		}
	}
	return -1
}

func (p *IPAM) valid(slot int) bool { return slot >= 0 && slot < p.slots }

func (p *IPAM) addr(off uint32) netip.Addr {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], p.base+off)
	return netip.AddrFrom4(a)
}

func bit(set []uint64, i int) bool { return set[i/64]&(1<<(i%64)) != 0 }
func setBit(set []uint64, i int)   { set[i/64] |= 1 << (i % 64) }
func clearBit(set []uint64, i int) { set[i/64] &^= 1 << (i % 64) }
