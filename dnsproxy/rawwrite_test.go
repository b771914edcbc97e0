package dnsproxy

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestReplySocketRawSendTo sends replies through replySocket's raw path
// from an IPv4 and an IPv6 socket (an IPv4 client of the IPv6 socket as
// its mapped address) and checks each client gets the bytes from the
// listener's address; a zoned address takes the net package's path.
func TestReplySocketRawSendTo(t *testing.T) {
	for _, tc := range []struct {
		name, listen, client string
	}{
		{"v4", "127.0.0.1:0", "127.0.0.1:0"},
		{"v6", "[::1]:0", "[::1]:0"},
		{"v4 client of a v6 socket", "[::]:0", "127.0.0.1:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := net.ListenPacket("udp", tc.listen)
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			client, err := net.ListenPacket("udp", tc.client)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			rs := newReplySocket(pc)
			if rs.rc == nil {
				t.Fatal("no raw access to a UDP socket")
			}
			ca := client.LocalAddr().(*net.UDPAddr)
			ap := ca.AddrPort()
			if tc.listen == "[::]:0" {
				ap = netip.AddrPortFrom(netip.AddrFrom16(ap.Addr().As16()), ap.Port())
			}
			if sent, err := rawSendTo(rs.rc, rs.v6, []byte("x"), ap); !sent || err != nil {
				t.Fatalf("rawSendTo: sent %v, err %v; want sent", sent, err)
			}
			rs.writeTo([]byte("reply"), net.UDPAddrFromAddrPort(ap))
			client.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 64)
			for _, want := range []string{"x", "reply"} {
				n, from, err := client.ReadFrom(buf)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(buf[:n], []byte(want)) {
					t.Errorf("got %q, want %q", buf[:n], want)
				}
				if got, lp := from.(*net.UDPAddr).Port, pc.LocalAddr().(*net.UDPAddr).Port; got != lp {
					t.Errorf("from port %d, want the listener's %d", got, lp)
				}
			}
			zoned := netip.AddrPortFrom(netip.MustParseAddr("fe80::1%lo"), 53)
			if sent, _ := rawSendTo(rs.rc, true, []byte("x"), zoned); sent {
				t.Error("rawSendTo sent to a zoned address, want the net package's path")
			}
		})
	}
}

// TestRawWriteConnected writes on a connected UDP socket through rawWrite
// and checks the peer gets it; after the peer is gone (ICMP port
// unreachable) a later write reports the error.
func TestRawWriteConnected(t *testing.T) {
	peer, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("udp4", peer.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc := rawSocket(c)
	if rc == nil {
		t.Fatal("no raw access to a UDP socket")
	}
	if err := rawWrite(rc, []byte("query")); err != nil {
		t.Fatal(err)
	}
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, _, err := peer.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "query" {
		t.Fatalf("peer got %q, %v; want \"query\"", buf[:n], err)
	}
	peer.Close()
	var werr error
	for i := 0; i < 50 && werr == nil; i++ {
		werr = rawWrite(rc, []byte("query"))
		time.Sleep(10 * time.Millisecond)
	}
	if werr == nil {
		t.Error("writes to a closed port kept succeeding, want ECONNREFUSED")
	}
	c.Close()
	if err := rawWrite(rc, []byte("query")); err == nil {
		t.Error("rawWrite on a closed socket succeeded, want an error")
	}
}
