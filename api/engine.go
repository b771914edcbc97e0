package api

import (
	"context"
)

// Engine is what the API serves: the session lifecycle (package daemon
// implements it). Errors wrap the sentinels of errors.go; their text is
// the one line the caller sees.
type Engine interface {
	Create(ctx context.Context, req CreateRequest) (SessionInfo, error)
	Delete(ctx context.Context, name string) error
	// DeleteAttachment is Delete of a session only if it is that
	// attachment's (its container ID and interface name); a session of
	// that name that is another's is left alone: ErrNameTaken.
	DeleteAttachment(ctx context.Context, name string, at AttachmentRef) error
	DeleteByLabel(ctx context.Context, key, value string) ([]string, error)
	List(labelKey, labelValue string) []SessionInfo
	Inspect(name string) (SessionInfo, error)
	PolicyEngine
	ImageEngine
	// Exec starts a command in the session's sandbox and returns at once;
	// the command runs on, whatever becomes of ctx or of the daemon.
	Exec(ctx context.Context, name string, req ExecRequest) (ExecInfo, error)
	// ExecOutput calls fn with the exec's frames from offset on (0: the
	// start; else a frame's Offset), then, once it ended, with its last
	// frame (Exit). With follow it waits for more until the exec ends or
	// ctx does; without, it returns when the recorded frames are sent.
	ExecOutput(ctx context.Context, name, id string, offset int64, follow bool, fn func(ExecFrame) error) error
	// ListExecs lists the session's execs, oldest first; InspectExec is one.
	ListExecs(name string) ([]ExecInfo, error)
	InspectExec(name, id string) (ExecInfo, error)
	// KillExec kills a running exec's process group and returns it ended.
	KillExec(name, id string) (ExecInfo, error)
	// Events returns the recorded events of a session and, when follow is
	// set, a channel of new ones closed when ctx ends or the session goes.
	// A session removed within the events' retention still has its
	// recorded events (and, with follow, a channel already closed).
	Events(ctx context.Context, name string, follow bool) ([]Event, <-chan Event, error)
	// AllEvents returns the recorded events of every live session carrying
	// the label (every session when labelKey is ""), oldest first, and,
	// when follow is set, a channel of the new events of every such
	// session, closed only when ctx ends.
	AllEvents(ctx context.Context, labelKey, labelValue string, follow bool) ([]Event, <-chan Event, error)
	// Why says what the session's policy does with dest now, and why;
	// with sni, for a TCP flow to dest that asks for that name (TLS
	// server_name or HTTP Host): what the name check makes of it.
	Why(ctx context.Context, name, dest, sni string) (WhyAnswer, error)
	// Report verifies the session's ledger of admissions and sums it per
	// destination; a removed session's while its files are retained.
	Report(ctx context.Context, name string) (LedgerReport, error)
	// Healthy reports whether the daemon enforces what it says.
	Healthy() error
}
