package daemon

import "time"

// everyTick calls fn every period until stop is closed (the first call one
// period after the start): the daemon's background sweeps and polls.
func everyTick(period time.Duration, stop <-chan struct{}, fn func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			fn()
		}
	}
}
