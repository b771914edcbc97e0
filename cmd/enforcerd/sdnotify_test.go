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
	if err := sdNotifyTo("", "READY=1"); err != nil {
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
		if err := sdNotifyTo(addr, "READY=1"); err != nil {
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
	if err := sdNotifyTo("relative", "READY=1"); err == nil {
		t.Fatal("relative path: no error")
	}
	if err := sdNotifyTo(filepath.Join(t.TempDir(), "none"), "READY=1"); err == nil {
		t.Fatal("missing socket: no error")
	}
}
