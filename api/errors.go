package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Errors an Engine returns, wrapped; the API maps them to a status and a
// code with the one table below, and the Client maps the code (or, from
// a daemon that sends none, the status) back, so a Go caller can test
// errors.Is(err, api.ErrStaleGeneration) on either side.
var (
	ErrNotFound      = errors.New("unknown session")
	ErrNameTaken     = errors.New("session name taken")
	ErrPoolExhausted = errors.New("address pool exhausted")
	ErrBadRequest    = errors.New("bad request")
	ErrNoSandbox     = errors.New("session has no sandbox")
	ErrExecTimeout   = errors.New("command timed out")
	// ErrBusy: another operation on the session (a create, a delete) is
	// in progress; retrying later may succeed.
	ErrBusy = errors.New("another operation on the session is in progress")
	// ErrNotStarted: the command never started; Exec returns its status
	// with it (ExitNotFound, ExitNotExec).
	ErrNotStarted = errors.New("command not started")
	// ErrOOMKilled: the kernel killed the command for want of memory (the
	// sandbox's memory limit); Exec returns its status (137) with it.
	ErrOOMKilled = errors.New("killed: out of memory")
	// ErrUnknownExec: no exec of that ID in the session.
	ErrUnknownExec = errors.New("unknown exec")
	// ErrUnavailable: the daemon is up but cannot serve the request now
	// (unhealthy).
	ErrUnavailable = errors.New("daemon unavailable")
	// ErrOtherDaemon: another enforcerd already serves what this one
	// would (its socket, state dir, name prefix or pool). Listen and
	// serve's start return it.
	ErrOtherDaemon = errors.New("conflict with another daemon")
	// ErrTooLarge: the request body is over the limit (1 MiB).
	ErrTooLarge = errors.New("request body too large")
	// ErrForbidden: the caller's SO_PEERCRED is not allowed the socket.
	ErrForbidden = errors.New("caller not allowed")
	// ErrNoRoute: no route of that path, or not with that method.
	ErrNoRoute = errors.New("no such route")
	// ErrInternal: the daemon failed; what it had done for the request is
	// undone.
	ErrInternal = errors.New("daemon failed")
)

// The codes of an error body's "code" field: what a program branches on.
// Each stands for one sentinel (errorTable).
const (
	CodeBadRequest      = "bad_request"
	CodeTooLarge        = "too_large"
	CodeForbidden       = "forbidden"
	CodeNotFound        = "not_found"
	CodeUnknownExec     = "unknown_exec"
	CodeUnknownImage    = "unknown_image"
	CodeNoRoute         = "no_route"
	CodeNameTaken       = "name_taken"
	CodeBusy            = "busy"
	CodeStaleGeneration = "stale_generation"
	CodeLocked          = "locked"
	CodeNoSandbox       = "no_sandbox"
	CodeImageInUse      = "image_in_use"
	CodeOtherDaemon     = "other_daemon"
	CodePoolExhausted   = "pool_exhausted"
	CodeUnavailable     = "unavailable"
	CodeExecTimeout     = "exec_timeout"
	CodeInternal        = "internal"
)

// errorTable is the one mapping between the sentinels, their codes and
// HTTP statuses. Earlier rows win when an error wraps several; the first
// row of a status is the sentinel of a body without a code (a daemon
// older than the codes).
var errorTable = []struct {
	err    error
	code   string
	status int
}{
	{ErrBadRequest, CodeBadRequest, http.StatusBadRequest},
	{ErrForbidden, CodeForbidden, http.StatusForbidden},
	{ErrNotFound, CodeNotFound, http.StatusNotFound},
	{ErrUnknownExec, CodeUnknownExec, http.StatusNotFound},
	{ErrUnknownImage, CodeUnknownImage, http.StatusNotFound},
	{ErrNoRoute, CodeNoRoute, http.StatusNotFound},
	{ErrNoRoute, CodeNoRoute, http.StatusMethodNotAllowed},
	{ErrNameTaken, CodeNameTaken, http.StatusConflict},
	{ErrBusy, CodeBusy, http.StatusConflict},
	{ErrStaleGeneration, CodeStaleGeneration, http.StatusConflict},
	{ErrLocked, CodeLocked, http.StatusConflict},
	{ErrNoSandbox, CodeNoSandbox, http.StatusConflict},
	{ErrImageInUse, CodeImageInUse, http.StatusConflict},
	{ErrOtherDaemon, CodeOtherDaemon, http.StatusConflict},
	{ErrTooLarge, CodeTooLarge, http.StatusRequestEntityTooLarge},
	{ErrInternal, CodeInternal, http.StatusInternalServerError},
	{ErrPoolExhausted, CodePoolExhausted, http.StatusServiceUnavailable},
	{ErrUnavailable, CodeUnavailable, http.StatusServiceUnavailable},
	{ErrExecTimeout, CodeExecTimeout, http.StatusGatewayTimeout},
}

// Codes lists every code, in the table's order, once each.
func Codes() []string {
	var out []string
	for _, row := range errorTable {
		if len(out) == 0 || out[len(out)-1] != row.code {
			out = append(out, row.code)
		}
	}
	return out
}

// StatusClientClosed is the status logged when the client went away
// (nginx's convention; the client never sees it).
const StatusClientClosed = 499

// StatusOf maps an engine error to its HTTP status.
func StatusOf(err error) int {
	status, _ := statusCodeOf(err)
	return status
}

// CodeOf is the code of err: the first sentinel of the table it wraps,
// else "internal" (nil: "").
func CodeOf(err error) string {
	if err == nil {
		return ""
	}
	_, code := statusCodeOf(err)
	return code
}

func statusCodeOf(err error) (int, string) {
	for _, row := range errorTable {
		if errors.Is(err, row.err) {
			return row.status, row.code
		}
	}
	if errors.Is(err, context.Canceled) {
		return StatusClientClosed, CodeInternal
	}
	return http.StatusInternalServerError, CodeInternal
}

// sentinelOf is the sentinel a client attaches to a refusal: the one of
// its code, or, for a body without a known code, the first row of its
// status (409 is ErrNameTaken, 503 ErrPoolExhausted); nil when none fits.
func sentinelOf(code string, status int) error {
	if code != "" {
		for _, row := range errorTable {
			if row.code == code {
				return row.err
			}
		}
	}
	for _, row := range errorTable {
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
