package namecheck

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
)

// ViaQUIC: the name came from the server_name of a ClientHello carried
// in a QUIC client's Initial packets.
const ViaQUIC = "quic-sni"

// The QUIC versions whose Initial packets the check reads: their initial
// salts and key labels (RFC 9001 5.2, RFC 9369 3.3).
const (
	QUICv1 uint32 = 0x00000001
	QUICv2 uint32 = 0x6b3343cf
)

type quicVersion struct {
	salt        []byte
	key, iv, hp string
	initialType byte // the long header's type bits of an Initial
}

var quicVersions = map[uint32]quicVersion{
	QUICv1: {
		salt: []byte{0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb, 0x7f, 0x0a},
		key:  "quic key", iv: "quic iv", hp: "quic hp", initialType: 0,
	},
	QUICv2: {
		salt: []byte{0x0d, 0xed, 0xe3, 0xde, 0xf7, 0x00, 0xa6, 0xdb, 0x81, 0x93, 0x81, 0xbe, 0x6e, 0x26, 0x9d, 0xcb, 0xf9, 0xbd, 0x2e, 0xd9},
		key:  "quicv2 key", iv: "quicv2 iv", hp: "quicv2 hp", initialType: 1,
	},
}

// MaxQUICDatagrams bounds the datagrams a QUIC flow may send before its
// name is known: a ClientHello with post-quantum key shares takes two
// Initial packets; a client pads each to 1200 bytes or more.
const MaxQUICDatagrams = 16

// hkdfExpandLabel is TLS 1.3's HKDF-Expand-Label with an empty context
// (RFC 8446 7.1).
func hkdfExpandLabel(secret []byte, label string, n int) []byte {
	full := "tls13 " + label
	info := make([]byte, 0, 4+len(full))
	info = binary.BigEndian.AppendUint16(info, uint16(n))
	info = append(info, byte(len(full)))
	info = append(info, full...)
	info = append(info, 0)
	out, err := hkdf.Expand(sha256.New, secret, string(info), n)
	if err != nil {
		panic(err) // n is a key size, far below HKDF's bound
	}
	return out
}

// quicKeys are the client's Initial packet protection keys.
type quicKeys struct {
	aead cipher.AEAD
	iv   []byte
	hp   cipher.Block
}

// clientInitialKeys derives the client's Initial keys from the
// Destination Connection ID of its first Initial (RFC 9001 5.2): anyone
// on the path can, by design.
func clientInitialKeys(v quicVersion, dcid []byte) quicKeys {
	initial, err := hkdf.Extract(sha256.New, dcid, v.salt)
	if err != nil {
		panic(err)
	}
	client := hkdfExpandLabel(initial, "client in", sha256.Size)
	block, err := aes.NewCipher(hkdfExpandLabel(client, v.key, 16))
	if err != nil {
		panic(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	hp, err := aes.NewCipher(hkdfExpandLabel(client, v.hp, 16))
	if err != nil {
		panic(err)
	}
	return quicKeys{aead: aead, iv: hkdfExpandLabel(client, v.iv, 12), hp: hp}
}

// varint reads a QUIC variable-length integer (RFC 9000 16).
func (r *reader) varint() uint64 {
	b := r.take(1)
	if b == nil {
		return 0
	}
	n := 1 << (b[0] >> 6)
	v := uint64(b[0] & 0x3f)
	rest := r.take(n - 1)
	if rest == nil && n > 1 {
		return 0
	}
	for _, c := range rest {
		v = v<<8 | uint64(c)
	}
	return v
}

// QUICHello reassembles a QUIC client's ClientHello from the CRYPTO
// frames of its Initial packets, datagram by datagram (RFC 9000 17.2.2,
// RFC 9001 5). The zero QUICHello is ready to use.
type QUICHello struct {
	started   bool
	version   uint32
	dcid      []byte
	keys      quicKeys
	crypto    *Stream
	datagrams int
}

// Add reads one UDP datagram the client sent and returns what the flow
// asks for so far: NeedMore until the ClientHello is complete; Named or
// NoName then; Other when the flow's first datagram is not a QUIC
// Initial of a version the check reads (v1, v2); Unreadable when an
// Initial does not decrypt or parse, changes a byte sent before, or
// names another connection.
func (h *QUICHello) Add(d []byte) Result {
	bad := Result{Kind: Unreadable, Via: ViaQUIC}
	h.datagrams++
	first := !h.started
	sawInitial := false
	for len(d) > 0 {
		if d[0]&0x80 == 0 {
			break // a short header packet fills the rest of the datagram
		}
		r := reader{b: d, ok: true}
		b0 := r.u8()
		vb := r.take(4)
		if !r.ok {
			return bad
		}
		version := binary.BigEndian.Uint32(vb)
		v, known := quicVersions[version]
		if !known {
			if first && !sawInitial {
				return Result{Kind: Other}
			}
			return bad
		}
		dcid := r.take(r.u8())
		r.take(r.u8()) // scid
		if !r.ok || len(dcid) > 20 {
			return bad
		}
		typ := byte(b0>>4) & 3
		if typ != v.initialType {
			if !isLengthed(v, typ) {
				break // Retry: no Length, nothing after it
			}
			n := r.varint()
			if !r.ok || n > uint64(len(r.b)) {
				return bad
			}
			r.take(int(n)) // 0-RTT or Handshake: not the hello
			d = r.b
			continue
		}
		if h.started && (version != h.version || !bytes.Equal(dcid, h.dcid)) {
			// Another connection in the same flow: the server would
			// read its hello too.
			return bad
		}
		if !h.started {
			h.started, h.version, h.dcid = true, version, bytes.Clone(dcid)
			h.keys = clientInitialKeys(v, dcid)
			h.crypto = NewStream(0)
		}
		r.take(int(r.varint())) // token
		n := r.varint()
		if !r.ok || n > uint64(len(r.b)) {
			return bad
		}
		pnOff := len(d) - len(r.b)
		end := pnOff + int(n)
		frames, ok := h.open(d[:end], pnOff)
		if !ok {
			return bad
		}
		if res := h.frames(frames); res.Kind == Unreadable {
			return res
		}
		sawInitial = true
		d = d[end:]
	}
	if first && !sawInitial {
		return Result{Kind: Other}
	}
	return h.result()
}

// isLengthed tells the long header types with a Length field: all but
// Retry (v1 type 3, v2 type 0).
func isLengthed(v quicVersion, typ byte) bool {
	retry := byte(3)
	if v.initialType == 1 {
		retry = 0
	}
	return typ != retry
}

// open removes the header protection of the Initial packet p, whose
// packet number starts at pnOff, and decrypts its payload (RFC 9001 5.3,
// 5.4). p is not changed.
func (h *QUICHello) open(p []byte, pnOff int) ([]byte, bool) {
	if len(p) < pnOff+4+16 {
		return nil, false
	}
	var mask [16]byte
	h.keys.hp.Encrypt(mask[:], p[pnOff+4:pnOff+4+16])
	hdr := bytes.Clone(p[:pnOff+4])
	hdr[0] ^= mask[0] & 0x0f
	pnLen := int(hdr[0]&3) + 1
	hdr = hdr[:pnOff+pnLen]
	var pn uint64
	for i := range pnLen {
		hdr[pnOff+i] ^= mask[1+i]
		pn = pn<<8 | uint64(hdr[pnOff+i])
	}
	// The client's first packets: the truncated number is the number
	// (RFC 9000 A.3 with no packet acknowledged yet).
	nonce := bytes.Clone(h.keys.iv)
	for i := range 8 {
		nonce[len(nonce)-1-i] ^= byte(pn >> (8 * i))
	}
	out, err := h.keys.aead.Open(nil, nonce, p[pnOff+pnLen:], hdr)
	if err != nil {
		return nil, false
	}
	return out, true
}

// frames walks an Initial packet's frames (RFC 9000 17.2.2: PADDING,
// PING, ACK, CRYPTO, CONNECTION_CLOSE), adding CRYPTO data to the
// stream.
func (h *QUICHello) frames(b []byte) Result {
	bad := Result{Kind: Unreadable, Via: ViaQUIC}
	r := reader{b: b, ok: true}
	if len(b) == 0 {
		return bad // RFC 9000 12.4: a packet with no frames
	}
	for len(r.b) > 0 {
		switch t := r.varint(); t {
		case 0x00, 0x01: // PADDING, PING
		case 0x02, 0x03: // ACK
			r.varint() // largest
			r.varint() // delay
			ranges := r.varint()
			r.varint() // first range
			if ranges > uint64(len(r.b)) {
				return bad
			}
			for range ranges {
				r.varint()
				r.varint()
			}
			if t == 0x03 {
				r.varint()
				r.varint()
				r.varint()
			}
		case 0x06: // CRYPTO
			off := r.varint()
			n := r.varint()
			if !r.ok || n > uint64(len(r.b)) {
				return bad
			}
			data := r.take(int(n))
			if off+n > MaxBytes {
				return bad // past the bound before the name
			}
			if conflict, over := h.crypto.Add(uint32(off), data); conflict || over {
				return bad
			}
		case 0x1c: // CONNECTION_CLOSE
			r.varint()
			r.varint()
			r.take(int(r.varint()))
		default:
			return bad
		}
		if !r.ok {
			return bad
		}
	}
	return Result{Kind: NeedMore}
}

// result reads the ClientHello from the CRYPTO stream's start, once it
// is all there (a handshake message, no TLS record around it).
func (h *QUICHello) result() Result {
	bad := Result{Kind: Unreadable, Via: ViaQUIC}
	if h.crypto == nil {
		return Result{Kind: NeedMore}
	}
	hs := h.crypto.Prefix()
	if len(hs) >= 1 && hs[0] != 1 {
		return bad
	}
	if len(hs) < 4 {
		return Result{Kind: NeedMore}
	}
	n := handshakeLen(hs)
	if 4+n > MaxBytes {
		return bad
	}
	if len(hs) < 4+n {
		return Result{Kind: NeedMore}
	}
	res := parseClientHello(hs[4 : 4+n])
	res.Via = ViaQUIC
	return res
}
