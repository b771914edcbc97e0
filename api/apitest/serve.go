package apitest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/enforcerd/enforcerd/api"
)

// Serve serves e on a unix socket in a temporary directory, as the daemon
// does (the same listener and SO_PEERCRED check), until the test ends, and
// returns the socket's path.
func Serve(tb testing.TB, e api.Engine) string {
	tb.Helper()
	return ServeWith(tb, e, api.HandlerOptions{})
}

// ServeWith is Serve with the handler's options (a version, a logger).
func ServeWith(tb testing.TB, e api.Engine, opts api.HandlerOptions) string {
	tb.Helper()
	sock := filepath.Join(tb.TempDir(), "enforcerd.sock")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- api.ListenAndServe(ctx, api.ListenConfig{Socket: sock}, api.NewHandler(e, opts), func() { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		tb.Fatalf("serve the fake engine: %v", err)
	}
	tb.Cleanup(func() {
		cancel()
		<-done
	})
	return sock
}
