package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Errors an Engine returns, wrapped; the API maps them to statuses with
// the one table below, and the Client maps the statuses back, so a Go
// caller can test errors.Is(err, api.ErrNotFound) on either side.
var (
	ErrNotFound      = errors.New("unknown session")
	ErrNameTaken     = errors.New("session name taken")
	ErrPoolExhausted = errors.New("address pool exhausted")
	ErrBadRequest    = errors.New("bad request")
	ErrNoSandbox     = errors.New("session has no sandbox")
	ErrExecTimeout   = errors.New("command timed out")
	// ErrNotStarted: the command never started; Exec returns its status
	// with it (ExitNotFound, ExitNotExec).
	ErrNotStarted = errors.New("command not started")
	// ErrOOMKilled: the kernel killed the command for want of memory (the
	// sandbox's memory limit); Exec returns its status (137) with it.
	ErrOOMKilled = errors.New("killed: out of memory")
	// ErrUnknownExec: no exec of that ID in the session.
	ErrUnknownExec = errors.New("unknown exec")
	// ErrUnavailable: the daemon is up but cannot serve the request now
	// (unhealthy). Only the client returns it.
	ErrUnavailable = errors.New("daemon unavailable")
)

// statusTable is the one mapping between the sentinels and HTTP statuses.
// Earlier rows win when an error wraps several.
var statusTable = []struct {
	err    error
	status int
}{
	{ErrBadRequest, http.StatusBadRequest},
	{ErrNotFound, http.StatusNotFound},
	{ErrUnknownExec, http.StatusNotFound},
	{ErrUnknownImage, http.StatusNotFound},
	{ErrNameTaken, http.StatusConflict},
	{ErrStaleGeneration, http.StatusConflict},
	{ErrLocked, http.StatusConflict},
	{ErrNoSandbox, http.StatusConflict},
	{ErrImageInUse, http.StatusConflict},
	{ErrPoolExhausted, http.StatusServiceUnavailable},
	{ErrExecTimeout, http.StatusGatewayTimeout},
}

// StatusClientClosed is the status logged when the client went away
// (nginx's convention; the client never sees it).
const StatusClientClosed = 499

// StatusOf maps an engine error to its HTTP status.
func StatusOf(err error) int {
	for _, row := range statusTable {
		if errors.Is(err, row.err) {
			return row.status
		}
	}
	if errors.Is(err, context.Canceled) {
		return StatusClientClosed
	}
	return http.StatusInternalServerError
}

// sentinelOf is the sentinel a client attaches to a refusal with this
// status, nil when none fits (the first row of the status: 409 is
// ErrNameTaken, 503 ErrPoolExhausted; Healthz says ErrUnavailable itself).
func sentinelOf(status int) error {
	for _, row := range statusTable {
		if row.status == status {
			return row.err
		}
	}
	return nil
}

// OneLine folds a message onto one line: every error the API and the CLI
// print is one line.
func OneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// ParseLabel splits a KEY=VALUE label filter (?label=KEY=VALUE).
func ParseLabel(v string) (key, value string, err error) {
	key, value, ok := strings.Cut(v, "=")
	if !ok {
		return "", "", errors.New("want KEY=VALUE with a non-empty KEY")
	}
	if err := CheckLabelKey(key); err != nil {
		return "", "", err
	}
	return key, value, nil
}

// CheckLabelKey is the rule for a label's key: non-empty, without '=',
// ',' or white space (so KEY=VALUE,KEY=VALUE reads back unambiguously).
func CheckLabelKey(key string) error {
	if key == "" || strings.ContainsAny(key, "=, \t\n") {
		return fmt.Errorf("label key %q: want a non-empty key without '=', ',' or spaces", key)
	}
	return nil
}

// Classify tags err with one of the sentinels without changing its text:
// errors.Is finds both, the caller reads only err's own message.
func Classify(err, sentinel error) error { return &classified{err, sentinel} }

type classified struct{ err, sentinel error }

func (c *classified) Error() string   { return c.err.Error() }
func (c *classified) Unwrap() []error { return []error{c.err, c.sentinel} }
