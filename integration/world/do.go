package world

import (
	"fmt"
	"os"

	"github.com/vishvananda/netns"

	"github.com/enforcerd/enforcerd/nsmgr"
)

// The one netns primitive of the live tests, the demo and the bench is
// nsmgr.Do, the product's own: it runs fn on a locked thread and unlocks it
// only after switching back (else the thread dies with its goroutine).
// What follows are conveniences over it, none switching a thread itself.

// DoPath is nsmgr.Do for a namespace named by its path (e.g. /run/netns/x).
func DoPath(nsPath string, fn func() error) error {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer ns.Close()
	return nsmgr.Do(ns, fn)
}

// InNewNetns runs fn inside a fresh anonymous network namespace, which goes
// away with its last reference once fn returns (unless fn bind-mounts or
// keeps it).
func InNewNetns(fn func() error) error {
	return switchBack(func() error {
		ns, err := netns.New()
		if err != nil {
			return fmt.Errorf("create netns: %w", err)
		}
		defer ns.Close()
		return fn()
	})
}

// NewNamedNetns creates a network namespace bind-mounted at
// NetnsDir/name and returns a handle of it. The caller closes the handle
// and removes the namespace by name (netns.DeleteNamed).
func NewNamedNetns(name string) (netns.NsHandle, error) {
	ns := netns.None()
	err := switchBack(func() (err error) {
		ns, err = netns.NewNamed(name)
		return err
	})
	if err != nil {
		return netns.None(), fmt.Errorf("create netns %s: %w", name, err)
	}
	return ns, nil
}

// switchBack runs fn, which moves its thread into another netns, through
// nsmgr.Do of this process's own netns: entering it is a no-op, and Do
// switches the thread back after fn (or lets it die).
func switchBack(fn func() error) error {
	self, err := netns.GetFromPid(os.Getpid())
	if err != nil {
		return fmt.Errorf("open this process's netns: %w", err)
	}
	defer self.Close()
	return nsmgr.Do(self, fn)
}
