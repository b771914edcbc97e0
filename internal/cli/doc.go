// Package cli is the command line of enforcerd's client commands: session
// (create, fork, exec, exec-status, logs, ls, inspect, update, rm, events,
// why, report), image, events, version, completion, help and man. Every
// one of them only talks to the daemon's API socket (package api).
//
// It exists so that two binaries run the same commands from one home:
// cmd/enforcerd (the daemon's binary, which adds serve, reap, doctor and
// bugreport through CLI.DaemonCommands, and init and exec-holder before
// any parsing) and cmd/enforcerctl, the thin client. enforcerctl is built
// without cgo and links no netlink, nftables or libcontainer: one call
// costs a fraction of enforcerd's start (its package inits and its 20 MB
// of pages), which is most of a CLI call's time when an operator's script
// or an agent creates many sessions (issue 25). This package must stay as
// light: it imports api, container/rules (the limits' and image names'
// wording, standard library only), cobra and pflag; internal/depaware's
// test fails if enforcerctl comes to link a kernel client or any package
// of the daemon.
//
// The contract, the same in both binaries: one error line on stderr that
// starts with the program's name and the command ("enforcerctl session
// create: ..."), exit statuses ExitOK, ExitRefused, ExitUsage (and, for
// session exec, the command's own and api.ExitTimeout..ExitNotFound),
// --help on every command and --json on every command that prints data.
// CLI's fields are the test seams (streams, environment, clock).
package cli
