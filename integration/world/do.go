package world

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn on a locked OS thread inside ns and switches back afterwards.
// If switching back fails the thread stays locked, so the Go runtime
// terminates it instead of reusing a thread stuck in the wrong namespace.
func Do(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", ns, err)
	}
	fnErr := fn()
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: it dies with this goroutine.
		return fmt.Errorf("restore netns: %w (fn: %v)", err, fnErr)
	}
	runtime.UnlockOSThread()
	return fnErr
}

// DoPath is Do for a namespace named by its path (e.g. /run/netns/x).
func DoPath(nsPath string, fn func() error) error {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer ns.Close()
	return Do(ns, fn)
}
