package world

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"
)

// QUICClientHello is crypto/tls's QUIC client's ClientHello for sni (a
// real one, with its quic_transport_parameters) as it goes in CRYPTO
// frames: a handshake message, no record header. With pq, the default
// key shares (X25519MLKEM768: more than one packet holds); without,
// X25519 only (one packet).
func QUICClientHello(sni string, pq bool) ([]byte, error) {
	conf := &tls.Config{ServerName: sni, MinVersion: tls.VersionTLS13, NextProtos: []string{"h3"}}
	if !pq {
		conf.CurvePreferences = []tls.CurveID{tls.X25519}
	}
	q := tls.QUICClient(&tls.QUICConfig{TLSConfig: conf})
	// initial_max_data (4) = 1 MiB, a minimal but valid parameter list.
	q.SetTransportParameters([]byte{0x04, 0x04, 0x80, 0x10, 0x00, 0x00})
	if err := q.Start(context.Background()); err != nil {
		return nil, err
	}
	defer q.Close()
	var hello []byte
	for {
		ev := q.NextEvent()
		switch ev.Kind {
		case tls.QUICNoEvent:
			if len(hello) == 0 {
				return nil, fmt.Errorf("crypto/tls wrote no ClientHello")
			}
			return hello, nil
		case tls.QUICWriteData:
			if ev.Level == tls.QUICEncryptionLevelInitial {
				hello = append(hello, ev.Data...)
			}
		}
	}
}

// QUICv1Salt is QUIC v1's initial salt (RFC 9001 5.2).
var quicV1Salt = []byte{0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb, 0x7f, 0x0a}

func expandLabel(secret []byte, label string, n int) []byte {
	full := "tls13 " + label
	info := binary.BigEndian.AppendUint16(nil, uint16(n))
	info = append(info, byte(len(full)))
	info = append(info, full...)
	info = append(info, 0)
	out, err := hkdf.Expand(sha256.New, secret, string(info), n)
	if err != nil {
		panic(err)
	}
	return out
}

// QUICInitials is the test's own QUIC v1 client: hello (a handshake
// message, QUICClientHello) in CRYPTO frames cut at cuts, one protected
// Initial packet per piece (RFC 9001 5), each padded to 1200 bytes, all
// for one fresh Destination Connection ID.
func QUICInitials(hello []byte, cuts ...int) [][]byte {
	dcid := make([]byte, 8)
	rand.Read(dcid)
	initial, err := hkdf.Extract(sha256.New, dcid, quicV1Salt)
	if err != nil {
		panic(err)
	}
	client := expandLabel(initial, "client in", 32)
	block, _ := aes.NewCipher(expandLabel(client, "quic key", 16))
	aead, _ := cipher.NewGCM(block)
	iv := expandLabel(client, "quic iv", 12)
	hp, _ := aes.NewCipher(expandLabel(client, "quic hp", 16))
	var out [][]byte
	bounds := append(append([]int{0}, cuts...), len(hello))
	for i := 0; i+1 < len(bounds); i++ {
		off, data := bounds[i], hello[bounds[i]:bounds[i+1]]
		frame := []byte{0x06, 0x80 | byte(off>>24), byte(off >> 16), byte(off >> 8), byte(off), 0x40 | byte(len(data)>>8), byte(len(data))}
		frame = append(frame, data...)
		pn := uint32(i)
		hdr := []byte{0xc3, 0, 0, 0, 1, byte(len(dcid))}
		hdr = append(hdr, dcid...)
		hdr = append(hdr, 0, 0) // no source connection ID, no token
		pad := max(0, 1200-len(hdr)-2-4-len(frame)-16)
		payload := append(frame, make([]byte, pad)...)
		n := 4 + len(payload) + 16
		hdr = append(hdr, 0x40|byte(n>>8), byte(n))
		pnOff := len(hdr)
		hdr = binary.BigEndian.AppendUint32(hdr, pn)
		nonce := bytes.Clone(iv)
		for j := range 4 {
			nonce[len(nonce)-1-j] ^= byte(pn >> (8 * j))
		}
		p := aead.Seal(bytes.Clone(hdr), nonce, payload, hdr)
		var mask [16]byte
		hp.Encrypt(mask[:], p[pnOff+4:pnOff+20])
		p[0] ^= mask[0] & 0x0f
		for j := range 4 {
			p[pnOff+j] ^= mask[1+j]
		}
		out = append(out, p)
	}
	return out
}

// SendDatagrams sends datagrams from one socket inside nsPath to dst, a
// pause between them, then waits for an answer until timeout: a timeout
// when they were sent and not answered (the sink), EHOSTUNREACH when the
// first was refused with ICMP admin-prohibited.
func SendDatagrams(nsPath string, dst netip.AddrPort, pause, timeout time.Duration, datagrams ...[]byte) error {
	c, err := dialIn(nsPath, "udp4", dst, timeout)
	if err != nil {
		return fmt.Errorf("udp %s: %w", dst, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	for i, d := range datagrams {
		if i > 0 {
			time.Sleep(pause)
		}
		if _, err := c.Write(d); err != nil {
			return fmt.Errorf("udp %s: write %d: %w", dst, i, err)
		}
	}
	buf := make([]byte, 1500)
	if _, err := c.Read(buf); err != nil {
		return fmt.Errorf("udp %s: read: %w", dst, err)
	}
	return nil
}
