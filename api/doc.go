// Package api is the wire contract of enforcerd's /v1 API, imported by
// both sides: the daemon serves it, the CLI, the benchmarks, the tests and
// other Go programs call it.
//
// It owns the request and response types, the exec-frame and event
// schema, the error sentinels and the one table mapping them to their
// machine-readable codes and HTTP statuses (errors.go), the HTTP handler over an Engine the consumer
// implements (handler.go), the unix-socket listener with its
// peer-credential check (listen.go), the exported Client (client.go) and
// the OpenAPI document that describes all of it (openapi.json).
//
// It imports no other enforcerd package: a client pulls in no netlink,
// nftables or libcontainer code.
package api
