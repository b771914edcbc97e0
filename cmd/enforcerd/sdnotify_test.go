package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestSDNotify(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := sdNotify("READY=1"); err != nil {
		t.Fatalf("unset: %v", err)
	}
	for _, addr := range []string{
		filepath.Join(t.TempDir(), "notify"),
		fmt.Sprintf("@enforcerd-test-%d-%d", os.Getpid(), time.Now().UnixNano()),
	} {
		conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		t.Setenv("NOTIFY_SOCKET", addr)
		if err := sdNotify("READY=1"); err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 64)
		n, err := conn.Read(buf)
		if err != nil || string(buf[:n]) != "READY=1" {
			t.Fatalf("%s: got %q, %v", addr, buf[:n], err)
		}
		conn.Close()
	}
	t.Setenv("NOTIFY_SOCKET", "relative")
	if err := sdNotify("READY=1"); err == nil {
		t.Fatal("relative path: no error")
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "none"))
	if err := sdNotify("READY=1"); err == nil {
		t.Fatal("missing socket: no error")
	}
}
