// Package metrics is the daemon's Prometheus endpoint: the create counts
// it keeps (Registry.ObserveCreate), what the lifecycle and the DNS proxy
// count read at scrape time from a Source (never measured twice, never
// stale), the Go runtime's and the process's series, the hand-written text
// writer (promtext.go), and its own HTTP listener with /metrics, /healthz
// and /readyz (Serve).
//
// It is a package because it is the one part of the daemon that owns a
// socket: package daemon knows no sockets, and cmd/enforcerd binds the
// listener and hands it here. It imports no Prometheus library (see
// promtext.go for why); its tests parse what it writes with Prometheus's
// own text parser.
package metrics
