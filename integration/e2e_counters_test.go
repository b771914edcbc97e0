package integration

// Counters count both directions: a 5 MiB download from the world shows in
// received_bytes (the replies forwarded into the session), while
// accepted_bytes counts what the session sent (its requests and ACKs).

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/integration/world"
)

func TestE2ECountersBothDirections(t *testing.T) {
	e := newE2E(t)
	e.createNetOnly("dl", "--allow", "198.18.1.10")
	const size = 5 << 20
	srv, err := world.ListenTCP(e.w.NetPath, netip.MustParseAddrPort("198.18.1.10:8081"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				io.CopyN(c, zeros{}, size)
			}(c)
		}
	}()
	before := e.inspect("dl").Counters
	c, err := world.DialTCP(e.nsPath("dl"), netip.MustParseAddrPort("198.18.1.10:8081"), world.ReachTimeout)
	if err != nil {
		t.Fatalf("connect to the download server: %v", err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	n, err := io.Copy(io.Discard, c)
	c.Close()
	if err != nil || n != size {
		t.Fatalf("download: %d bytes, %v", n, err)
	}
	after := e.inspect("dl").Counters
	recv := after.ReceivedBytes - before.ReceivedBytes
	sent := after.AcceptedBytes - before.AcceptedBytes
	t.Logf("5 MiB download: received_bytes +%d, accepted_bytes +%d", recv, sent)
	if recv < size {
		t.Errorf("received_bytes grew %d for a %d-byte download", recv, size)
	}
	if sent == 0 || sent > recv/4 {
		t.Errorf("accepted_bytes grew %d (the session's own packets), received %d", sent, recv)
	}
	if after.ReceivedPackets <= before.ReceivedPackets {
		t.Errorf("received_packets did not grow: %d -> %d", before.ReceivedPackets, after.ReceivedPackets)
	}
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
