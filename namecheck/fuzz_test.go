package namecheck

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

// FuzzInspect: no input panics, and a decision does not depend on how
// much came after it: once Inspect decides (anything but NeedMore), more
// bytes never change the decision. That is what makes the verdict
// independent of how the guest segments its first bytes.
func FuzzInspect(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"), []byte("GET / HTTP/1.1\r\nHost: b.example\r\n\r\n"))
	f.Add(clientHello(f, "a.example"), []byte{0x16, 3, 1})
	f.Add([]byte{0x16, 3, 1, 0, 5, 1, 0, 0, 1}, []byte{0})
	f.Add([]byte("SSH-2.0-x\r\n"), []byte("GET"))
	f.Fuzz(func(t *testing.T, b, more []byte) {
		r := Inspect(b)
		if r.Kind == NeedMore {
			return
		}
		if r2 := Inspect(append(b[:len(b):len(b)], more...)); !reflect.DeepEqual(r, r2) {
			t.Fatalf("Inspect(%q) = %+v, with %q after it %+v", b, r, more, r2)
		}
	})
}

// FuzzStream: a ClientHello cut at random points and sent in a random
// order, with random segments repeated, is read as the whole one is.
func FuzzStream(f *testing.F) {
	h := clientHello(f, "pkgs.example.org")
	f.Add(uint64(1), uint32(0), uint8(5))
	f.Add(uint64(7), uint32(0xffffff00), uint8(40))
	f.Fuzz(func(t *testing.T, seed uint64, start uint32, cuts uint8) {
		rng := rand.New(rand.NewPCG(seed, 3))
		pos := []int{0, len(h)}
		for range int(cuts) % 64 {
			pos = append(pos, rng.IntN(len(h)))
		}
		type seg struct{ a, b int }
		var segs []seg
		for i := range pos {
			for j := range pos {
				if pos[i] < pos[j] && rng.IntN(4) == 0 {
					segs = append(segs, seg{pos[i], pos[j]})
				}
			}
		}
		segs = append(segs, seg{0, len(h)})
		rng.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
		s := NewStream(start)
		for _, sg := range segs {
			if conflict, over := s.Add(start+uint32(sg.a), h[sg.a:sg.b]); conflict || over {
				t.Fatalf("segment %v: conflict %v over %v", sg, conflict, over)
			}
		}
		if r := Inspect(s.Prefix()); r.Kind != Named || r.Names[0] != "pkgs.example.org" {
			t.Fatalf("reassembled: %+v", r)
		}
	})
}
