// Package gctune sets the Go collector's heap floor (SetHeapFloor): a
// process-wide setting, so it is its own package, called only from the
// program (cmd/enforcerd's serve, and the bench as the daemon does), never
// from a library. Its test changes the whole test binary's collector, which
// is why that test lives here, alone, and not beside the lifecycle's tests.
package gctune
