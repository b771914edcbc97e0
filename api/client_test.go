package api_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/enforcerd/enforcerd/api"
	"github.com/enforcerd/enforcerd/api/apitest"
)

// TestServeAPILifecycle: ready is called once listening; ctx end stops the
// server, ends follow streams and removes the socket.
func TestServeAPILifecycle(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "e.sock")
	f := apitest.New()
	f.Create(context.Background(), api.CreateRequest{Name: "s1", NetworkOnly: true})
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- api.ListenAndServe(ctx, api.ListenConfig{Socket: sock}, api.NewHandler(f, api.HandlerOptions{}), func() { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	cl := api.NewClient(sock)
	if err := cl.Healthz(context.Background()); err != nil {
		t.Fatal(err)
	}
	follow := make(chan error, 1)
	go func() { follow <- cl.EventsTo(context.Background(), "s1", true, &strings.Builder{}) }()
	time.Sleep(100 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(7 * time.Second):
		t.Fatal("ListenAndServe did not return")
	}
	select {
	case <-follow:
	case <-time.After(2 * time.Second):
		t.Fatal("follow stream did not end")
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left: %v", err)
	}
}
