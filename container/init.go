package container

import (
	"os"

	"github.com/opencontainers/runc/libcontainer"
	// nsenter's C constructor runs before the Go runtime when libcontainer re-executes this
	// binary as "init": it joins or creates the namespaces. Every binary that uses this package
	// (the daemon, the live tests) must link it, so this package imports it.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
)

// MaybeInit runs libcontainer's init and never returns when this process was started as one
// (os.Args[1] == "init": libcontainer re-executes /proc/self/exe that way to set a container
// up); otherwise it returns false at once. Call it first thing in main (or in an init func of a
// test package), before any flag parsing:
//
//	func main() {
//		container.MaybeInit()
//		...
//	}
func MaybeInit() bool {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		Init()
	}
	return false
}

// Init is libcontainer's init; it never returns. MaybeInit calls it when os.Args[1] is "init".
func Init() {
	libcontainer.Init()
}
