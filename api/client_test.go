package api_test

import (
	"context"
	"errors"
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
	go func() {
		follow <- cl.EventsTo(context.Background(), "s1", api.EventsOptions{Follow: true}, &strings.Builder{})
	}()
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
	case err := <-follow:
		// The daemon went away mid-follow: an error, not a normal end.
		if !errors.Is(err, api.ErrStreamCut) {
			t.Fatalf("follow after the server stopped: %v, want ErrStreamCut", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("follow stream did not end")
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left: %v", err)
	}
}

// TestClientFollowEnds: a follow stream the daemon ends because the
// session went ends without error, and its end marker is not copied.
func TestClientFollowEnds(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "e.sock")
	f := apitest.New()
	f.Create(context.Background(), api.CreateRequest{Name: "s1", NetworkOnly: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	go func() {
		_ = api.ListenAndServe(ctx, api.ListenConfig{Socket: sock}, api.NewHandler(f, api.HandlerOptions{}), func() { close(ready) })
	}()
	<-ready
	cl := api.NewClient(sock)
	var out strings.Builder
	follow := make(chan error, 1)
	go func() { follow <- cl.EventsTo(ctx, "s1", api.EventsOptions{Follow: true}, &out) }()
	time.Sleep(100 * time.Millisecond)
	if err := f.Delete(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-follow:
		if err != nil {
			t.Fatalf("follow of a removed session: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("follow stream did not end")
	}
	if got := out.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, `"action":"created"`) || strings.Contains(got, `"end"`) {
		t.Fatalf("copied %q, want the created event only", got)
	}
}
