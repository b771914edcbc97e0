package nsmgr

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Do runs fn on a locked OS thread inside the network namespace ns.
//
// The thread is switched back to its original netns afterwards (also when fn
// panics) and unlocked only if that succeeded; otherwise it stays locked and
// the Go runtime terminates it when the goroutine ends, so no goroutine ever
// runs in a netns it did not ask for. This file is the only place in nsmgr
// that switches a thread's netns.
func Do(ns netns.NsHandle, fn func() error) error {
	return onLockedThread(func() error {
		if err := unix.Setns(int(ns), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter netns fd %d: %w", int(ns), err)
		}
		return nil
	}, fn)
}

// inNewNetns creates a network namespace, bind-mounts it at path (an
// existing empty file) and runs fn inside it, on a locked thread that is
// switched back afterwards as in Do. A failure after the mount leaves the
// mount in place: the caller owns path and undoes it.
func inNewNetns(path string, fn func() error) error {
	return onLockedThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare netns: %w", err)
		}
		// /proc/thread-self is this (locked) thread: the new netns.
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mount netns at %s: %w", path, err)
		}
		return nil
	}, fn)
}

// onLockedThread locks the thread, remembers its netns, runs enter (which
// switches the thread's netns) and fn, then switches back. The switch back
// runs whenever enter was called, also when enter failed half-way (unshare
// succeeded, the mount did not).
func onLockedThread(enter, fn func() error) (err error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open current netns: %w", err)
	}
	defer func() {
		if rerr := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); rerr != nil {
			// Leave the thread locked: the runtime kills it at goroutine exit.
			err = errors.Join(err, fmt.Errorf("restore netns: %w", rerr))
			orig.Close()
			return
		}
		orig.Close()
		runtime.UnlockOSThread()
	}()
	if err := enter(); err != nil {
		return err
	}
	return fn()
}
