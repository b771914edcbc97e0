package namecheck

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rfc9001Initial is the protected client Initial of RFC 9001 Appendix
// A.2 (a ClientHello for example.com, padded to 1200 bytes).
const rfc9001Initial = `
	c000000001088394c8f03e5157080000 449e7b9aec34d1b1c98dd7689fb8ec11
	d242b123dc9bd8bab936b47d92ec356c 0bab7df5976d27cd449f63300099f399
	1c260ec4c60d17b31f8429157bb35a12 82a643a8d2262cad67500cadb8e7378c
	8eb7539ec4d4905fed1bee1fc8aafba1 7c750e2c7ace01e6005f80fcb7df6212
	30c83711b39343fa028cea7f7fb5ff89 eac2308249a02252155e2347b63d58c5
	457afd84d05dfffdb20392844ae81215 4682e9cf012f9021a6f0be17ddd0c208
	4dce25ff9b06cde535d0f920a2db1bf3 62c23e596d11a4f5a6cf3948838a3aec
	4e15daf8500a6ef69ec4e3feb6b1d98e 610ac8b7ec3faf6ad760b7bad1db4ba3
	485e8a94dc250ae3fdb41ed15fb6a8e5 eba0fc3dd60bc8e30c5c4287e53805db
	059ae0648db2f64264ed5e39be2e20d8 2df566da8dd5998ccabdae053060ae6c
	7b4378e846d29f37ed7b4ea9ec5d82e7 961b7f25a9323851f681d582363aa5f8
	9937f5a67258bf63ad6f1a0b1d96dbd4 faddfcefc5266ba6611722395c906556
	be52afe3f565636ad1b17d508b73d874 3eeb524be22b3dcbc2c7468d54119c74
	68449a13d8e3b95811a198f3491de3e7 fe942b330407abf82a4ed7c1b311663a
	c69890f4157015853d91e923037c227a 33cdd5ec281ca3f79c44546b9d90ca00
	f064c99e3dd97911d39fe9c5d0b23a22 9a234cb36186c4819e8b9c5927726632
	291d6a418211cc2962e20fe47feb3edf 330f2c603a9d48c0fcb5699dbfe58964
	25c5bac4aee82e57a85aaf4e2513e4f0 5796b07ba2ee47d80506f8d2c25e50fd
	14de71e6c418559302f939b0e1abd576 f279c4b2e0feb85c1f28ff18f58891ff
	ef132eef2fa09346aee33c28eb130ff2 8f5b766953334113211996d20011a198
	e3fc433f9f2541010ae17c1bf202580f 6047472fb36857fe843b19f5984009dd
	c324044e847a4f4a0ab34f719595de37 252d6235365e9b84392b061085349d73
	203a4a13e96f5432ec0fd4a1ee65accd d5e3904df54c1da510b0ff20dcc0c77f
	cb2c0e0eb605cb0504db87632cf3d8b4 dae6e705769d1de354270123cb11450e
	fc60ac47683d7b8d0f811365565fd98c 4c8eb936bcab8d069fc33bd801b03ade
	a2e1fbc5aa463d08ca19896d2bf59a07 1b851e6c239052172f296bfb5e724047
	90a2181014f3b94a4e97d117b4381303 68cc39dbb2d198065ae3986547926cd2
	162f40a29f0c3c8745c0f50fba3852e5 66d44575c29d39a03f0cda721984b6f4
	40591f355e12d439ff150aab7613499d bd49adabc8676eef023b15b65bfc5ca0
	6948109f23f350db82123535eb8a7433 bdabcb909271a6ecbcb58b936a88cd4e
	8f2e6ff5800175f113253d8fa9ca8885 c2f552e657dc603f252e1a8e308f76f0
	be79e2fb8f5d5fbbe2e30ecadd220723 c8c0aea8078cdfcb3868263ff8f09400
	54da48781893a7e49ad5aff4af300cd8 04a6b6279ab3ff3afb64491c85194aab
	760d58a606654f9f4400e8b38591356f bf6425aca26dc85244259ff2b19c41b9
	f96f3ca9ec1dde434da7d2d392b905dd f3d1f9af93d1af5950bd493f5aa731b4
	056df31bd267b6b90a079831aaf579be 0a39013137aac6d404f518cfd4684064
	7e78bfe706ca4cf5e9c5453e9f7cfd2b 8b4c8d169a44e55c88d4a9a7f9474241
	e221af44860018ab0856972e194cd934
`

// TestQUICInitialKeysRFC9001: the client Initial keys of RFC 9001
// Appendix A.1, derived from its Destination Connection ID.
func TestQUICInitialKeysRFC9001(t *testing.T) {
	k := clientInitialKeys(quicVersions[QUICv1], unhex(t, "8394c8f03e515708"))
	if got, want := hex.EncodeToString(k.iv), "fa044b2f42a3fd3b46fb255c"; got != want {
		t.Fatalf("iv %s, want %s", got, want)
	}
	// The header protection key, by the RFC's sample (A.2) and mask.
	var mask [16]byte
	k.hp.Encrypt(mask[:], unhex(t, "d1b1c98dd7689fb8ec11d242b123dc9b"))
	if got, want := hex.EncodeToString(mask[:5]), "437b9aec36"; got != want {
		t.Fatalf("mask %s, want %s", got, want)
	}
}

// TestQUICHelloRFC9001: the RFC's protected client Initial decrypts, and
// its ClientHello names example.com.
func TestQUICHelloRFC9001(t *testing.T) {
	var h QUICHello
	r := h.Add(unhex(t, rfc9001Initial))
	if r.Kind != Named || r.Via != ViaQUIC || r.Names[0] != "example.com" {
		t.Fatalf("read %+v, want example.com via %s", r, ViaQUIC)
	}
	// One byte changed anywhere in the payload: the AEAD refuses it.
	p := unhex(t, rfc9001Initial)
	p[600] ^= 1
	var bad QUICHello
	if r := bad.Add(p); r.Kind != Unreadable {
		t.Fatalf("a changed packet read as %+v, want unreadable", r)
	}
}

// sealInitial protects one client Initial packet carrying frames (RFC
// 9001 5), padded to 1200 bytes, with packet number pn: the test's
// client, by the same keys the check derives.
func sealInitial(t testing.TB, version uint32, dcid []byte, pn uint32, frames []byte) []byte {
	t.Helper()
	v := quicVersions[version]
	k := clientInitialKeys(v, dcid)
	hdr := []byte{0xc0 | v.initialType<<4 | 3}
	hdr = binary.BigEndian.AppendUint32(hdr, version)
	hdr = append(hdr, byte(len(dcid)))
	hdr = append(hdr, dcid...)
	hdr = append(hdr, 0, 0) // no source connection ID, no token
	pad := max(0, 1200-len(hdr)-2-4-len(frames)-16)
	payload := append(bytes.Clone(frames), make([]byte, pad)...)
	n := 4 + len(payload) + 16
	hdr = append(hdr, 0x40|byte(n>>8), byte(n))
	pnOff := len(hdr)
	hdr = binary.BigEndian.AppendUint32(hdr, pn)
	nonce := bytes.Clone(k.iv)
	for i := range 4 {
		nonce[len(nonce)-1-i] ^= byte(pn >> (8 * i))
	}
	p := k.aead.Seal(bytes.Clone(hdr), nonce, payload, hdr)
	var mask [16]byte
	k.hp.Encrypt(mask[:], p[pnOff+4:pnOff+20])
	p[0] ^= mask[0] & 0x0f
	for i := range 4 {
		p[pnOff+i] ^= mask[1+i]
	}
	return p
}

// cryptoFrame is a CRYPTO frame of data at offset off.
func cryptoFrame(off int, data []byte) []byte {
	f := []byte{0x06, 0x80 | byte(off>>24), byte(off >> 16), byte(off >> 8), byte(off)}
	f = append(f, 0x40|byte(len(data)>>8), byte(len(data)))
	return append(f, data...)
}

// quicHello is crypto/tls's ClientHello for serverName as a handshake
// message (QUIC carries it without a record header).
func quicHello(t testing.TB, serverName string) []byte {
	rec := clientHello(t, serverName)
	var hs []byte
	for len(rec) >= 5 {
		n := int(binary.BigEndian.Uint16(rec[3:5]))
		hs = append(hs, rec[5:5+n]...)
		rec = rec[5+n:]
	}
	return hs
}

var testDCID = []byte{1, 2, 3, 4, 5, 6, 7, 8}

// TestQUICHelloSplit: a ClientHello over two Initial packets (a
// post-quantum key share makes it larger than one), in either order, of
// v1 and v2.
func TestQUICHelloSplit(t *testing.T) {
	hs := quicHello(t, "pkgs.example.org")
	if len(hs) < 1100 {
		t.Fatalf("the hello is %d bytes, want one over a packet", len(hs))
	}
	for _, version := range []uint32{QUICv1, QUICv2} {
		cut := len(hs) / 2
		p1 := sealInitial(t, version, testDCID, 0, cryptoFrame(0, hs[:cut]))
		p2 := sealInitial(t, version, testDCID, 1, cryptoFrame(cut, hs[cut:]))
		for _, order := range [][][]byte{{p1, p2}, {p2, p1}} {
			var h QUICHello
			if r := h.Add(order[0]); r.Kind != NeedMore {
				t.Fatalf("version %x: half a hello read as %+v", version, r)
			}
			if r := h.Add(order[1]); r.Kind != Named || r.Names[0] != "pkgs.example.org" || r.Via != ViaQUIC {
				t.Fatalf("version %x: read %+v", version, r)
			}
		}
	}
}

// TestQUICHelloRefusals: what is not one connection's readable Initial.
func TestQUICHelloRefusals(t *testing.T) {
	hs := quicHello(t, "pkgs.example.org")
	cut := len(hs) / 2
	first := sealInitial(t, QUICv1, testDCID, 0, cryptoFrame(0, hs[:cut]))
	for name, c := range map[string]struct {
		second []byte
		want   Kind
	}{
		"another connection":  {sealInitial(t, QUICv1, []byte{9, 9, 9, 9, 9, 9, 9, 9}, 1, cryptoFrame(cut, hs[cut:])), Unreadable},
		"another version":     {sealInitial(t, QUICv2, testDCID, 1, cryptoFrame(cut, hs[cut:])), Unreadable},
		"a changed byte":      {sealInitial(t, QUICv1, testDCID, 1, cryptoFrame(0, append([]byte{hs[0], hs[1] ^ 1}, hs[2:cut]...))), Unreadable},
		"a STREAM frame":      {sealInitial(t, QUICv1, testDCID, 1, []byte{0x08, 0, 1, 'x'}), Unreadable},
		"past the bound":      {sealInitial(t, QUICv1, testDCID, 1, cryptoFrame(MaxBytes, []byte{1})), Unreadable},
		"a short header next": {[]byte{0x40, 1, 2, 3}, NeedMore},
	} {
		var h QUICHello
		h.Add(first)
		if r := h.Add(c.second); r.Kind != c.want {
			t.Errorf("%s: read %+v, want kind %d", name, r, c.want)
		}
	}
	for name, d := range map[string][]byte{
		"a short header":  {0x40, 1, 2, 3, 4, 5, 6, 7, 8},
		"DNS-like bytes":  {0x12, 0x34, 1, 0, 0, 1},
		"unknown version": {0xc0, 0xff, 0, 0, 0x1d, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0},
		"version probe":   {0xc0, 0x1a, 0x2a, 0x3a, 0x4a, 8, 1, 2, 3, 4, 5, 6, 7, 8, 0},
	} {
		var h QUICHello
		if r := h.Add(d); r.Kind != Other {
			t.Errorf("%s: read %+v, want Other", name, r)
		}
	}
	// No server_name: passes like TCP's.
	var h QUICHello
	noName := quicHello(t, "")
	r := h.Add(sealInitial(t, QUICv1, testDCID, 0, cryptoFrame(0, noName[:1000])))
	if r.Kind == NeedMore && len(noName) > 1000 {
		r = h.Add(sealInitial(t, QUICv1, testDCID, 1, cryptoFrame(1000, noName[1000:])))
	}
	if r.Kind != NoName {
		t.Errorf("a hello without server_name read as %+v, want NoName", r)
	}
}
