package daemon

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/dnsproxy"
	"github.com/enforcerd/enforcerd/netpolicy"
)

type healthFirewall struct {
	Firewall
	err error
}

func (f healthFirewall) Check() error { return f.err }

type healthNetwork struct{ Network }

func (healthNetwork) CheckDNSInterface() error { return nil }

type noAttest struct{}

func (noAttest) Attest(netip.Addr, []netip.Addr, time.Duration, []netpolicy.PortSpec) (time.Duration, error) {
	return 0, nil
}

// Healthy (the /healthz of both listeners) fails while the DNS proxy's
// serve loops do not run, not only when the kernel's objects are gone.
func TestHealthyChecksTheDNSServeLoops(t *testing.T) {
	fw := &healthFirewall{}
	d := New(Config{}, Parts{Firewall: fw, Network: healthNetwork{}})
	if err := d.Healthy(); err != nil {
		t.Fatalf("without a proxy: %v", err)
	}
	guard, err := netpolicy.NewGuard(netip.MustParsePrefix("10.250.0.0/16"), nil)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := dnsproxy.New(dnsproxy.Config{Upstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}, Guard: guard, Attester: noAttest{}})
	if err != nil {
		t.Fatal(err)
	}
	d.proxy = proxy
	if err := d.Healthy(); err == nil || err.Error() != "dns proxy: not serving: no udp reader and no tcp accept loop runs" {
		t.Fatalf("before the proxy serves: %v", err)
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- proxy.Serve(pc, ln) }()
	for deadline := time.Now().Add(5 * time.Second); d.Healthy() != nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("serving: %v", d.Healthy())
		}
	}
	fw.err = errors.New("table enforcerd: gone")
	if err := d.Healthy(); err != fw.err {
		t.Fatalf("without the table: %v", err)
	}
	fw.err = nil
	ln.Close() // the TCP socket fails for good: every serve loop ends
	<-done
	if err := d.Healthy(); err == nil {
		t.Fatal("healthy after the DNS serve loops ended")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = proxy.Shutdown(ctx)
}
