package dnsproxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestHistogramSnapshotIsCumulative(t *testing.T) {
	var h histogram
	for _, d := range []time.Duration{50 * time.Microsecond, 100 * time.Microsecond, 3 * time.Millisecond, time.Minute} {
		h.observe(d)
	}
	s := h.snapshot()
	if len(s.Bounds) != len(latencyBounds) || len(s.Counts) != len(latencyBounds) {
		t.Fatalf("%d bounds, %d counts, want %d each", len(s.Bounds), len(s.Counts), len(latencyBounds))
	}
	// <= 100µs holds two, <= 2.5ms still two, <= 5ms three; the minute is
	// only in Count (+Inf).
	if s.Counts[0] != 2 || s.Counts[4] != 2 || s.Counts[5] != 3 || s.Counts[len(s.Counts)-1] != 3 || s.Count != 4 {
		t.Fatalf("counts %v, count %d", s.Counts, s.Count)
	}
	if want := 50*time.Microsecond + 100*time.Microsecond + 3*time.Millisecond + time.Minute; s.Sum != want || s.Max != time.Minute {
		t.Fatalf("sum %v max %v, want %v and 1m0s", s.Sum, s.Max, want)
	}
}

// Serving follows the serve loops: none before Serve, all while it
// serves, none once a socket failed for good or after Shutdown.
func TestServingFollowsTheServeLoops(t *testing.T) {
	tp := newTestProxy(t, []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}, nil)
	if err := tp.Serving(); err == nil || err.Error() != "dns proxy: not serving: no udp reader and no tcp accept loop runs" {
		t.Fatalf("before Serve: %v", err)
	}
	serve := func() (net.Listener, chan error) {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- tp.Serve(pc, ln) }()
		waitServing(t, tp)
		return ln, done
	}
	ln, done := serve()
	if st := tp.Stats(); st.UDPReaders < 1 || st.TCPAcceptors != 1 {
		t.Fatalf("serving with %d udp readers and %d tcp accept loops", st.UDPReaders, st.TCPAcceptors)
	}
	// A listener closed under the proxy fails for good: every loop of
	// that Serve call ends.
	ln.Close()
	if err := <-done; err == nil || errors.Is(err, ErrClosed) {
		t.Fatalf("Serve after its listener failed returned %v, want the accept error", err)
	}
	if err := tp.Serving(); err == nil {
		t.Fatal("Serving is nil after the serve loops ended")
	}
	if st := tp.Stats(); st.UDPReaders != 0 || st.TCPAcceptors != 0 {
		t.Fatalf("after failure: %d udp readers, %d tcp accept loops", st.UDPReaders, st.TCPAcceptors)
	}

	_, done = serve() // served again on new sockets
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if err := tp.Serving(); err == nil || err.Error() != "dns proxy: shut down" {
		t.Fatalf("after Shutdown: %v", err)
	}
}

// waitServing waits until Serving is nil (Serve runs in a goroutine).
func waitServing(t *testing.T, tp *testProxy) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		err := tp.Serving()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Serving: %v", err)
		}
	}
}
